"""Any start order with static addresses: a frontend (or a worker calling stages of its own)
starts before its workers, says which stages have no replica, fails their calls fast, and
takes each worker as soon as it answers; a late worker with the wrong types is refused."""

from __future__ import annotations

import socket
import sys
import time

import anyio
import httpx
import pytest

import bls

from .cli import ROOT, run_bls
from .procs import serving, wait_for, worker

sys.path.insert(0, str(ROOT / "tests/e2e/pipelines"))
from remote_stages import Mark, Served

SERVED = "tests/e2e/served/served.py"
STAGES = "tests/e2e/pipelines/remote_stages.py"


def free_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{sock.getsockname()[1]}"


def test_serve_starts_before_its_worker_and_takes_it_when_it_comes() -> None:
    address = free_address()
    with serving(
        SERVED, "--bind", f"whoami={address}", "--connect-timeout", "0.3"
    ) as proc:  # prints ready although nothing listens at the address
        ready = httpx.get(f"{proc.address}/ready")
        assert ready.status_code == 503
        assert ready.json()["error"]["stage"] == "whoami"
        started = time.monotonic()
        r = httpx.post(f"{proc.address}/v1/scripts/greet", json={"text": "x"}, timeout=10)
        assert time.monotonic() - started < 10  # fails fast, no hang (nor a 30 s wait)
        assert r.status_code == 503
        error = r.json()["error"]
        assert error["type"] == "stage_unavailable" and error["stage"] == "whoami"
        assert address in error["message"]
        assert "starting without it" in proc.log()

        with worker(f"{STAGES}:whoami", listen=address) as who:
            joined = wait_for(
                lambda: httpx.get(f"{proc.address}/ready").status_code == 200, timeout=10
            )
            assert joined < 5
            r = httpx.post(f"{proc.address}/v1/scripts/greet", json={"text": "x"}, timeout=10)
            assert r.status_code == 200 and r.json()["pid"] == who.pid


def test_a_late_worker_with_the_wrong_types_is_refused() -> None:
    address = free_address()
    with serving(SERVED, "--bind", f"whoami={address}", "--connect-timeout", "0.3") as proc:
        # A streaming worker where the script calls a unary stage.
        with worker(f"{STAGES}:ticks", "--stage", "whoami", listen=address):
            wait_for(lambda: "refusing" in proc.log(), timeout=10)
            assert "stage 'whoami'" in proc.log() and "streaming" in proc.log()
            assert httpx.get(f"{proc.address}/ready").status_code == 503
            r = httpx.post(f"{proc.address}/v1/scripts/greet", json={"text": "x"}, timeout=10)
            assert r.status_code == 503 and "refused" in r.json()["error"]["message"]


def test_a_worker_starts_before_the_stage_it_calls() -> None:
    inner = free_address()

    async def call(address: str) -> Served:
        async with bls.Runtime({"nested": address}):
            return await bls.stage("nested", Mark(seconds=0))

    with worker(
        f"{STAGES}:nested", "--bind", f"slow={inner}", "--connect-timeout", "0.3"
    ) as outer:  # ready although its own stage has no replica yet
        assert "starting without it" in outer.log()
        with pytest.raises(bls.StageError) as info:
            anyio.run(call, outer.address)
        assert info.value.kind == "unavailable" and inner in info.value.message
        with worker(f"{STAGES}:slow", listen=inner) as slow:
            wait_for(lambda: "answered: it takes calls now" in outer.log(), timeout=10)
            assert anyio.run(call, outer.address).pid == slow.pid


def test_bls_run_waits_for_a_replica_then_fails_with_one_message() -> None:
    address = free_address()
    started = time.monotonic()
    out = run_bls(
        "run", "tests/e2e/pipelines/one_slow.py", "--input", '{"seconds": 0}',
        "--bind", f"slow={address}", "--connect-timeout", "0.5",
    )  # fmt: skip
    took = time.monotonic() - started
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out.stderr
    assert "stage 'slow'" in errors[0] and address in errors[0] and "0.5s" in errors[0]
    assert took < 10
