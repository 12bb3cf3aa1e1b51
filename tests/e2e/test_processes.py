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
        # One /metrics, whichever process answers it (the others' part within a second).
        wait_for(lambda: _requests_total(url) == 40, timeout=10, interval=0.2)

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


def test_processes_must_be_a_count_or_auto() -> None:
    from .cli import run_bls

    done = run_bls("serve", SCRIPT, "--processes", "0")
    assert done.returncode == 1 and "--processes '0': expected 1 to 256, or auto" in done.stderr
