"""Affinity by key across frontends that share nothing: two `bls serve` processes, three
`bls worker` replicas, a session (a request field, or an HTTP header) always on the same
replica from either frontend; a replica that dies moves only its own sessions."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .cli import ROOT
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
