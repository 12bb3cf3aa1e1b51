"""Discovery through a real etcd server: workers register under their stage name with a
lease, frontends watch, replicas join and leave live, processes start in any order."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .etcd import EtcdServer, require_etcd
from .procs import serving, wait_for, worker

require_etcd()

SERVED = "tests/e2e/served/served.py"
WHOAMI = "tests/e2e/pipelines/remote_stages.py:whoami"


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path / "etcd")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def registered(etcd: EtcdServer, stage: str = "whoami") -> list[str]:
    return sorted(json.loads(v)["address"] for v in etcd.keys(f"/bls/stages/{stage}/").values())


def test_a_worker_registers_and_withdraws_on_a_clean_shutdown(etcd: EtcdServer) -> None:
    with worker(WHOAMI, "--discovery", etcd.url) as proc:
        wait_for(lambda: registered(etcd) == [proc.address], timeout=10)
        (key,) = etcd.keys()
        assert key.startswith("/bls/stages/whoami/")
        proc.signal(signal.SIGTERM)
        wait_for(lambda: registered(etcd) == [], timeout=5)  # withdrawn before it drains
        assert proc.wait() == 0
        assert "withdrawn from etcd" in proc.log()


def test_a_killed_workers_lease_expires(etcd: EtcdServer) -> None:
    with worker(WHOAMI, "--discovery", etcd.url, "--namespace", "team") as proc:
        wait_for(lambda: registered(etcd, "x") == [] and etcd.keys("/team/stages/whoami/"), 10)
        proc.signal(signal.SIGKILL)
        gone = wait_for(lambda: not etcd.keys("/team/stages/whoami/"), timeout=10)
        assert gone < 6  # the lease is 3 s


class Load:
    """Calls ``greet`` in a loop in a thread; records (time, status, pid)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.results: list[tuple[float, int, int]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                r = client.post(f"{self.url}/v1/scripts/greet", json={"text": "x"})
                pid = r.json().get("pid", 0) if r.status_code == 200 else 0
                if r.status_code != 200:
                    self.errors.append(r.text)
                self.results.append((time.monotonic(), r.status_code, pid))

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def pids_since(self, t: float) -> set[int]:
        return {pid for when, status, pid in self.results if when >= t and status == 200}


def test_frontend_first_then_workers_join_and_leave_under_load(etcd: EtcdServer) -> None:
    binds = ["--bind", "whoami=etcd:whoami", "--discovery", etcd.url, "--connect-timeout", "0.3"]
    with serving(SERVED, *binds) as frontend:
        assert httpx.get(f"{frontend.address}/ready").status_code == 503  # no worker yet
        r = httpx.post(f"{frontend.address}/v1/scripts/greet", json={"text": "x"})
        assert r.status_code == 503 and r.json()["error"]["stage"] == "whoami"

        with worker(WHOAMI, "--discovery", etcd.url) as first:
            wait_for(lambda: httpx.get(f"{frontend.address}/ready").status_code == 200, 10)
            with Load(frontend.address) as load:
                wait_for(lambda: first.pid in load.pids_since(0), timeout=10)
                # A second worker joins under load: it takes traffic soon after.
                with worker(WHOAMI, "--discovery", etcd.url) as second:
                    wait_for(lambda: len(registered(etcd)) == 2, timeout=10)
                    joined = time.monotonic()
                    wait_for(lambda: second.pid in load.pids_since(joined), timeout=10)
                    # The first leaves under load: nothing is lost, the rest go to the second.
                    first.signal(signal.SIGTERM)
                    assert first.wait() == 0
                    left = time.monotonic()
                    wait_for(lambda: len([r for r in load.results if r[0] > left]) >= 20, 10)
                    load.stop()  # before the second worker goes too
            statuses = {status for _, status, _ in load.results}
            log = "".join(line for line in frontend.lines if "bls.access" not in line)
            assert statuses == {200}, (load.errors[:1], log)  # every request answered
            assert load.pids_since(left) == {second.pid}


def test_etcd_restarting_loses_nothing(etcd: EtcdServer) -> None:
    binds = ["--bind", "whoami=etcd:whoami", "--discovery", etcd.url]
    with worker(WHOAMI, "--discovery", etcd.url) as old:
        wait_for(lambda: registered(etcd) == [old.address], timeout=10)
        with serving(SERVED, *binds) as frontend:
            etcd.stop()
            # Calls go on while etcd is away: the frontend keeps the replicas it knows.
            r = httpx.post(f"{frontend.address}/v1/scripts/greet", json={"text": "x"})
            assert r.status_code == 200 and r.json()["pid"] == old.pid
            etcd.start()
            wait_for(lambda: registered(etcd) == [old.address], timeout=15)
            # A worker that registers after the restart is found: the watch came back.
            with worker(WHOAMI, "--discovery", etcd.url) as new:

                def reached() -> bool:
                    r = httpx.post(f"{frontend.address}/v1/scripts/greet", json={"text": "x"})
                    return r.json()["pid"] == new.pid

                wait_for(reached, timeout=15)


def test_discovery_on_trio_and_in_bls_run(etcd: EtcdServer) -> None:
    from .cli import run_bls

    binds = ["--bind", "whoami=etcd:whoami", "--discovery", etcd.url]
    with worker(WHOAMI, "--discovery", etcd.url) as proc:
        wait_for(lambda: registered(etcd) == [proc.address], timeout=10)
        with serving(SERVED, *binds, backend="trio") as frontend:
            r = httpx.post(f"{frontend.address}/v1/scripts/greet", json={"text": "x"})
            assert r.status_code == 200 and r.json()["pid"] == proc.pid
        out = run_bls("run", SERVED, "--entry", "greet", "--input", '{"text": "x"}', *binds)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["pid"] == proc.pid
    # Nobody registered: bls run waits --connect-timeout, then says where it looked.
    out = run_bls(
        "run", SERVED, "--entry", "greet", "--input", '{"text": "x"}', *binds,
        "--connect-timeout", "0.5",
    )  # fmt: skip
    assert out.returncode == 1
    assert "stage 'whoami'" in out.stderr and "/bls/stages/whoami/" in out.stderr, out.stderr


def test_a_misfit_is_refused_the_others_serve_and_frontends_share_workers(
    etcd: EtcdServer,
) -> None:
    binds = ["--bind", "whoami=etcd:whoami", "--discovery", etcd.url]
    ticks = "tests/e2e/pipelines/remote_stages.py:ticks"
    with worker(WHOAMI, "--discovery", etcd.url) as good:
        wait_for(lambda: registered(etcd) == [good.address], timeout=10)
        with serving(SERVED, *binds) as one, serving(SERVED, *binds) as two:
            # A streaming worker registering as the unary stage `whoami`: refused and logged.
            with worker(ticks, "--stage", "whoami", "--discovery", etcd.url) as misfit:
                wait_for(lambda: len(registered(etcd)) == 2, timeout=10)
                for frontend in (one, two):
                    wait_for(lambda f=frontend: "refusing" in f.log(), timeout=10)  # type: ignore[misc]
                    assert misfit.address in frontend.log()
                    for _ in range(6):  # both frontends, every call: the good worker
                        r = httpx.post(f"{frontend.address}/v1/scripts/greet", json={"text": "x"})
                        assert r.status_code == 200 and r.json()["pid"] == good.pid
                    assert httpx.get(f"{frontend.address}/ready").status_code == 200


def test_processes_find_workers_through_etcd_over_curve(etcd: EtcdServer, tmp_path: Path) -> None:
    """`bls serve --processes 2` with discovery and CURVE keys: each process finds the
    worker in etcd and calls it encrypted, as one frontend does."""
    from .cli import run_bls

    keys = tmp_path / "keys"
    for name in ("server", "client"):
        assert run_bls("keygen", name, "--dir", str(keys)).returncode == 0
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "client.key").write_text((keys / "client.key").read_text())
    config = tmp_path / "bls.toml"
    config.write_text(
        '[transport]\ncurve_server_key = "keys/server.key"\n'
        'curve_secret = "keys/client.key_secret"\n'
    )
    curve = ["--curve-secret", f"{keys}/server.key_secret", "--curve-allow", str(allowed)]
    with worker(WHOAMI, "--discovery", etcd.url, *curve) as proc:
        wait_for(lambda: registered(etcd) == [proc.address], timeout=10)
        with serving(
            SERVED, "--processes", "2", "--bind", "whoami=etcd:whoami", "--discovery", etcd.url,
            "--config", str(config), ready_timeout=60,
        ) as frontend:  # fmt: skip
            served_by = set()
            for _ in range(20):  # a new connection each: both processes serve
                r = httpx.post(f"{frontend.address}/v1/scripts/greet", json={"text": "x"})
                assert r.status_code == 200 and r.json()["pid"] == proc.pid
                served_by.add(r.headers["x-request-id"][:8])  # (a process's id prefix)
            assert len(served_by) == 2
