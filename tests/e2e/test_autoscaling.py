"""`bls worker --metrics-port`: a real worker's load, scraped over HTTP while calls run
and after, as an autoscaler would see it."""

from __future__ import annotations

import re
import signal
import socket
from pathlib import Path

import anyio
import httpx
import pytest

import bls
from bls.targets import binding_for

from .cli import ROOT, bls_env
from .procs import Proc, start, stop, wait_for
from .rawio import receive_until

STAGES = str(ROOT / "bench" / "policy_stages.py")


def metrics_url(worker: Proc) -> str:
    """The /metrics URL a worker logged."""
    found: list[str] = []

    def logged() -> bool:
        for line in worker.lines:
            match = re.search(r"metrics on (http://\S+)", line)
            if match:
                found.append(match.group(1))
                return True
        return False

    wait_for(logged, timeout=10)
    return found[0]


def sample(url: str, name: str, stage: str = "work", **labels: str) -> float:
    """One sample of a worker's /metrics, by name and labels."""
    text = httpx.get(url, timeout=10).text
    want = ",".join(f'{k}="{v}"' for k, v in sorted({"stage": stage, **labels}.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.split()[-1])
    raise AssertionError(f"no {name}{{{want}}} in:\n{text}")


class Job(bls.Message):
    n: int


class Done(bls.Message):
    n: int
    replica: str


@pytest.mark.anyio
async def test_a_worker_reports_its_calls_in_flight_and_how_busy_it_is() -> None:
    worker = start(
        ["worker", f"{STAGES}:work", "--listen", "tcp://127.0.0.1:0", "--max-inflight", "4",
         "--metrics-port", "0"],
        env=bls_env(BLS_REPLICA_DELAY_MS="600"),
    )  # fmt: skip
    try:
        url = metrics_url(worker)
        assert sample(url, "bls_worker_inflight_calls") == 0
        assert sample(url, "bls_worker_max_inflight") == 4
        handle = bls.Stage("work", Job, Done)
        async with bls.Runtime({"work": binding_for("work", worker.address)}) as rt:

            @bls.script
            async def one(req: Job) -> Done:
                return await handle(req)

            async with anyio.create_task_group() as tg:
                for n in range(3):
                    tg.start_soon(rt.run, one, Job(n=n))
                await anyio.to_thread.run_sync(
                    lambda: wait_for(lambda: sample(url, "bls_worker_inflight_calls") == 3)
                )
        assert sample(url, "bls_worker_inflight_calls") == 0
        assert sample(url, "bls_worker_calls_total", outcome="completed") == 3
        assert 0.5 < sample(url, "bls_worker_busy_seconds_total") < 5
        # Busy for 0.6 s of the samples so far (heartbeat ticks of 0.25 s): some share.
        assert 0 < sample(url, "bls_worker_busy_ratio") <= 1
        worker.signal(signal.SIGTERM)  # the metrics server stops with the worker
        assert worker.wait() == 0
    finally:
        stop(worker.popen)


def _threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def test_stalled_scrapers_hold_no_thread_and_a_new_scraper_is_answered() -> None:
    worker = start(
        ["worker", f"{STAGES}:work", "--listen", "tcp://127.0.0.1:0", "--metrics-port", "0"]
    )
    stalled: list[socket.socket] = []
    try:
        url = metrics_url(worker)
        host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
        before = _threads(worker.pid)
        for i in range(300):  # connect; send half a request head, or nothing; never more
            sock = socket.create_connection((host, int(port)), timeout=10)
            if i % 2:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            stalled.append(sock)
        assert sample(url, "bls_worker_max_inflight") == 256  # a new scraper gets in
        assert _threads(worker.pid) <= before
        huge = socket.create_connection((host, int(port)), timeout=10)
        huge.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 100_000)
        assert receive_until(huge, lambda d: b"\r\n\r\n" in d).startswith(b"HTTP/1.1 431")
        huge.close()
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
    finally:
        for sock in stalled:
            sock.close()
        stop(worker.popen)
