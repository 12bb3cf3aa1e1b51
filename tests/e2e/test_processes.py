"""`bls serve --processes N` for real: children sharing the port, one /metrics over
them, limits divided, a child that dies started again, one drain for all."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx

from .procs import start, stop, wait_for

SCRIPT = "tests/e2e/processes/pids.py"


def _children(parent: int) -> list[int]:
    """The processes ``parent`` started (none once it has exited)."""
    listed = Path(f"/proc/{parent}/task/{parent}/children")
    return [int(p) for p in listed.read_text().split()] if listed.exists() else []


def _cmdline(pid: int) -> list[str]:
    return (Path(f"/proc/{pid}/cmdline").read_bytes()).decode().split("\0")


def _requests_total(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("bls_requests_total{")
    )


def test_processes_share_the_port_and_act_as_one_server() -> None:
    server = start(
        ["serve", SCRIPT, "--port", "0", "--processes", "2", "--max-inflight", "3"],
        ready_timeout=60,
    )
    try:
        url = server.address
        kids = _children(server.pid)
        assert len(kids) == 2
        # --max-inflight 3 over two processes: 2 and 1, so that both admit what one would.
        shares = sorted(int(c[c.index("--max-inflight") + 1]) for c in map(_cmdline, kids))
        assert shares == [1, 2]

        answered = set()
        for _ in range(40):  # a new connection each: the kernel spreads them
            answer = httpx.post(f"{url}/v1/scripts/whoami", json={})
            assert answer.status_code == 200
            answered.add(answer.json()["pid"])
        assert answered == set(kids)
        # /debug/requests is the answering process's, and says so; one connection's
        # requests all go to one process, which finds its request by id.
        with httpx.Client() as one:
            done = one.post(f"{url}/v1/scripts/whoami", json={})
            pid, rid = done.json()["pid"], done.headers["x-request-id"]
            json_ = {"accept": "application/json"}
            listed = one.get(f"{url}/debug/requests", headers=json_).json()
            assert {r["process"] for r in listed} == {pid}
            assert one.get(f"{url}/debug/requests/{rid}", headers=json_).json()["process"] == pid
            assert f"served by process {pid}" in one.get(f"{url}/debug/requests").text
        # One /metrics, whichever process answers it (the others' part within a second).
        wait_for(lambda: _requests_total(url) == 41, timeout=10, interval=0.2)

        # A child that dies is started again; the server serves on meanwhile.
        victim = kids[0]
        os.kill(victim, signal.SIGKILL)
        codes = {httpx.post(f"{url}/v1/scripts/whoami", json={}).status_code for _ in range(20)}
        assert codes == {200}
        wait_for(lambda: "starting another" in server.log(), timeout=15)
        wait_for(lambda: len(_children(server.pid)) == 2, timeout=30)
        assert victim not in _children(server.pid)

        # One drain: SIGTERM reaches every child; all exit, the parent with 0.
        kids = _children(server.pid)
        server.signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0, server.log()
        assert not [pid for pid in kids if Path(f"/proc/{pid}").exists()]
    finally:
        stop(server.popen)


def test_the_limits_of_bls_toml_hold_across_processes(tmp_path: Path) -> None:
    """An entry's rate, its burst and its requests at once, and the runs a frontend
    runs: each child gets its share, so that two processes admit what one would."""
    config = tmp_path / "bls.toml"
    config.write_text(
        "[admission.entries.whoami]\nrate = 0.01\nburst = 10\nmax_inflight = 5\n"
        "[runs]\nmax_running = 3\n"
    )
    server = start(
        ["serve", SCRIPT, "--port", "0", "--processes", "2", "--config", str(config)],
        ready_timeout=60,
    )
    try:
        kids = _children(server.pid)
        assert sorted(c[c.index("--share") + 1] for c in map(_cmdline, kids)) == ["0/2", "1/2"]
        codes: list[int] = []
        answered = set()
        for _ in range(40):  # a new connection each: the kernel spreads them
            answer = httpx.post(f"{server.address}/v1/scripts/whoami", json={})
            codes.append(answer.status_code)
            if answer.status_code == 200:
                answered.add(answer.json()["pid"])
            else:
                assert answer.status_code == 429
                error = answer.json()["error"]
                assert error["type"] == "rate_limited"
                assert "over its rate of 0.005 requests a second" in error["message"]
                assert "(this process's share: the limit is divided by 2)" in error["message"]
        # A burst of 10 in all (5 each), not 10 in each; the rate refills 0.01 a second.
        assert codes.count(200) == 10 and answered == set(kids)
    finally:
        stop(server.popen)


def test_processes_share_background_runs_and_each_records_its_own(tmp_path: Path) -> None:
    """With --runs and --record: a run submitted to any process is read through any other
    and runs where there is room; each process writes its own record segments."""
    records = tmp_path / "records"
    server = start(
        ["serve", SCRIPT, "--port", "0", "--processes", "2",
         "--runs", f"sqlite://{tmp_path}/runs.sqlite3", "--record", str(records)],
        ready_timeout=60,
    )  # fmt: skip
    try:
        kids = _children(server.pid)
        url = server.address
        submitted = []
        for _ in range(20):  # a new connection each: spread over both processes
            answer = httpx.post(
                f"{url}/v1/scripts/whoami", json={}, headers={"prefer": "respond-async"}
            )
            assert answer.status_code == 202, answer.text
            submitted.append(answer.json()["id"])
        ran_in = set()
        for run_id in submitted:
            run_url = f"{url}/v1/runs/{run_id}"
            wait_for(
                lambda u=run_url: httpx.get(u).json()["status"] == "succeeded",
                timeout=20,
                interval=0.05,
            )
            ran_in.add(httpx.get(run_url).json()["result"]["pid"])
        assert ran_in == set(kids)
        listed = httpx.get(f"{url}/v1/runs", params={"limit": 100}).json()["data"]
        assert {r["id"] for r in listed} == set(submitted)
        for _ in range(20):
            assert httpx.post(f"{url}/v1/scripts/whoami", json={}).status_code == 200

        def writers() -> set[str]:  # (each process's writer's pid is in its segments' names)
            return {p.name.split("-")[2] for p in records.glob("records-*.blsseg")}

        wait_for(lambda: len(writers()) == 2, timeout=20, interval=0.1)
    finally:
        stop(server.popen)


def test_a_process_share_divides_each_per_process_limit() -> None:
    from bls.config import Config, Limit
    from bls.serve.processes import divide_limits

    def share(i: int) -> Config:
        config = Config()
        config.admission.max_queued, config.admission.reserved = 5, 3
        config.admission.tenants["*"] = Limit(rate=3.0, max_inflight=1, weight=2.0)
        config.admission.entries["e"] = Limit(burst=7, max_inflight=9)
        config.runs.max_running = 5
        divide_limits(config, f"{i}/2", max_inflight=2)
        return config

    one, two = share(0), share(1)
    assert one.admission.processes == two.admission.processes == 2
    assert (one.admission.max_queued, two.admission.max_queued) == (3, 2)
    # (Reserved slots stay fewer than the process's --max-inflight.)
    assert (one.admission.reserved, two.admission.reserved) == (1, 1)
    assert one.admission.tenants["*"] == Limit(rate=1.5, max_inflight=1, weight=2.0)
    assert two.admission.entries["e"] == Limit(burst=3, max_inflight=4)
    assert (one.runs.max_running, two.runs.max_running) == (3, 2)


def test_processes_must_be_a_count_or_auto() -> None:
    from .cli import run_bls

    done = run_bls("serve", SCRIPT, "--processes", "0")
    assert done.returncode == 1 and "--processes '0': expected 1 to 256, or auto" in done.stderr
