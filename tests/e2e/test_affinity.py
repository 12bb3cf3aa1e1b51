"""Affinity by key across frontends that share nothing: two `bls serve` processes, three
`bls worker` replicas, a session (a request field, or an HTTP header) always on the same
replica from either frontend; a replica that dies moves only its own sessions, and one
that joins at its address takes back only those."""

from __future__ import annotations

import base64
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .cli import ROOT, bls_env
from .procs import Proc, start, stop, wait_for

SCRIPT = str(ROOT / "tests/e2e/affinity/sessions.py")
WHOAMI = "tests/e2e/pipelines/remote_stages.py:whoami"
SESSIONS = [f"session-{i}" for i in range(30)]


@pytest.fixture
def workers() -> Iterator[list[Proc]]:
    procs: list[Proc] = []
    try:
        for _ in range(3):
            procs.append(start(["worker", WHOAMI, "--listen", "tcp://127.0.0.1:0"]))
        yield procs
    finally:
        for proc in procs:
            stop(proc.popen)


def _frontend(
    tmp_path: Path, name: str, addresses: list[str], source: str = 'field = "marker"'
) -> Proc:
    config = tmp_path / f"{name}.toml"
    remote = ", ".join(f'"{a}"' for a in addresses)
    config.write_text(f"[stages.whoami]\nremote = [{remote}]\naffinity = {{ {source} }}\n")
    return start(["serve", SCRIPT, "--port", "0", "--config", str(config)])


def _pids(frontend: Proc, header: str | None = None) -> dict[str, int]:
    """Each session's replica: the session in the request's field, or (``header``) in
    that header of requests whose bodies are all alike."""
    with httpx.Client(base_url=frontend.address, timeout=30) as client:
        return {
            s: client.post(
                "/v1/scripts/which",
                json={"session": "same" if header else s},
                headers={header: s} if header else {},
            ).json()["pid"]
            for s in SESSIONS
        }


def test_a_session_stays_on_one_replica_from_every_frontend(
    tmp_path: Path, workers: list[Proc]
) -> None:
    addresses = [w.address for w in workers]
    one = _frontend(tmp_path, "one", addresses)
    two = _frontend(tmp_path, "two", addresses[::-1])  # its own list, in its own order
    try:
        first = _pids(one)
        assert _pids(one) == first  # again, from the same frontend
        assert _pids(two) == first  # and from one that shares nothing with it
        by_pid = {w.popen.pid: w for w in workers}
        assert set(first.values()) == set(by_pid)  # the sessions spread over all three

        dead = by_pid[first[SESSIONS[0]]]
        dead.popen.send_signal(signal.SIGKILL)
        dead.popen.wait(10)
        moved = {s for s, pid in first.items() if pid == dead.popen.pid}

        def served_by_survivors() -> bool:
            try:
                return all(pid != dead.popen.pid for pid in _pids(two).values())
            except (httpx.HTTPError, KeyError):
                return False

        wait_for(served_by_survivors, timeout=30, interval=0.2)
        after = _pids(two)
        assert {s for s in SESSIONS if after[s] != first[s]} == moved  # only its own
        assert _pids(one) == after

        # A replica joins at the dead one's address: it takes back the dead one's
        # sessions, and only those, from both frontends.
        back = start(["worker", WHOAMI, "--listen", dead.address])
        workers.append(back)  # (the fixture stops it)
        returned = {s: back.popen.pid if s in moved else pid for s, pid in first.items()}

        def rejoined() -> bool:
            try:
                return _pids(one) == returned and _pids(two) == returned
            except (httpx.HTTPError, KeyError):
                return False

        wait_for(rejoined, timeout=60, interval=0.2)
    finally:
        stop(one.popen)
        stop(two.popen)


def test_a_session_header_keeps_a_session_on_one_replica(
    tmp_path: Path, workers: list[Proc]
) -> None:
    addresses = [w.address for w in workers]
    source = 'header = "X-Session-Id"'
    one = _frontend(tmp_path, "one", addresses, source)
    two = _frontend(tmp_path, "two", addresses[::-1], source)
    try:
        first = _pids(one, "X-Session-Id")
        assert _pids(two, "X-Session-Id") == first
        assert len(set(first.values())) == 3  # by the header, not the (same) body
    finally:
        stop(one.popen)
        stop(two.popen)


EMBED = "tests/e2e/affinity/embed.py"


def test_two_frontends_send_each_image_to_the_one_worker_cache_that_holds_it(
    tmp_path: Path,
) -> None:
    """EPD's encoder across frontends: two `bls serve` processes, two encoder workers
    each with its own cache (`--cache`), affinity by the image's content hash: each image
    is computed once however many requests, typed or untyped, from either frontend ask for
    it; the workers' /metrics count the hits."""
    calls = tmp_path / "calls"
    env = bls_env(BLS_EMBED_CALLS=str(calls))
    procs: list[Proc] = []
    try:
        workers = []
        for _ in range(2):
            args = ["worker", f"{EMBED}:embed", "--listen", "tcp://127.0.0.1:0"]
            workers.append(
                start([*args, "--cache", "capacity_mb=16", "--metrics-port", "0"], env=env)
            )
        procs += workers
        remote = ", ".join(f'"{w.address}"' for w in workers)
        config = tmp_path / "epd.toml"
        config.write_text(
            f"[stages.embed]\nremote = [{remote}]\n"
            # (balance 4: a burst of one request's images never spills off its replica)
            'affinity = { function = "bls.cache:content_key", balance = 4 }\n'
        )
        frontends = [
            start(["serve", EMBED, "--port", "0", "--config", str(config)]) for _ in range(2)
        ]
        procs += frontends
        for turn in range(4):  # each image asked for 4 times, from both, typed and untyped
            frontend = frontends[turn % 2]
            entry = ("describe", "describe_plain")[turn // 2]
            order = [*range(1 + 3 * turn, 11), *range(1, 1 + 3 * turn)]  # (in another order)
            images = [base64.b64encode(bytes([n]) * 32).decode() for n in order]
            answer = httpx.post(
                f"{frontend.address}/v1/scripts/{entry}", json={"images": images}, timeout=30
            )
            assert answer.status_code == 200, answer.text
            assert [v["values"] for v in answer.json()["vectors"]] == [[32, n] for n in order]
        computed = calls.read_text().split()
        assert sorted(computed) == sorted((bytes([n]) * 32).hex() for n in range(1, 11))
        hits = sum(_metric(w, "bls_cache_hits_total") for w in workers)
        misses = sum(_metric(w, "bls_cache_misses_total") for w in workers)
        assert (hits, misses) == (30, 10)
    finally:
        for proc in procs:
            stop(proc.popen)


def _metric(worker: Proc, name: str) -> float:
    url = next(
        line.split("metrics on ")[1].strip() for line in worker.lines if "metrics on " in line
    )
    text = httpx.get(url, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_a_worker_cache_that_cannot_be_is_refused_at_start() -> None:
    from .cli import run_bls

    bad = run_bls("worker", f"{EMBED}:embed", "--listen", "tcp://127.0.0.1:0",
                  "--cache", "capacity_mb=0")  # fmt: skip
    assert bad.returncode == 1 and "--cache: cache: capacity_mb must be positive" in bad.stderr
    unknown = run_bls("worker", f"{EMBED}:embed", "--listen", "tcp://127.0.0.1:0",
                      "--cache", "size=3")  # fmt: skip
    assert unknown.returncode == 1 and "--cache: Object contains unknown field `size`" in (
        unknown.stderr
    )
    streaming = run_bls("worker", "tests/e2e/pipelines/remote_stages.py:ticks",
                        "--listen", "tcp://127.0.0.1:0", "--cache", "capacity_mb=1")  # fmt: skip
    assert streaming.returncode == 1 and "a cache is for unary stages" in streaming.stderr
