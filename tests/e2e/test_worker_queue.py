"""`bls worker --max-running`: a real worker holding more calls than it runs starts the
waiting ones highest priority first, displaces the lowest when full, and answers a
waiting call its caller cancels, or a drain cuts, at once. Observed through its /metrics
and its answers."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

import bls
from bls.errors import StageError
from bls.targets import binding_for

from .cli import ROOT, bls_env, run_bls
from .pipelines.ordered import Job, Started
from .procs import Proc, start, stop, wait_for
from .test_autoscaling import metrics_url, sample

STAGE = str(ROOT / "tests" / "e2e" / "pipelines" / "ordered.py")
ordered = bls.Stage("ordered", Job, Started)


@pytest.fixture
def worker(request: pytest.FixtureRequest) -> Iterator[Proc]:
    inflight = getattr(request, "param", 8)
    proc = start(
        ["worker", f"{STAGE}:ordered", "--listen", "tcp://127.0.0.1:0", "--max-running", "1",
         "--max-inflight", str(inflight), "--metrics-port", "0", "--grace", "0.5"],
        env=bls_env(),
    )  # fmt: skip
    try:
        yield proc
    finally:
        stop(proc.popen)


async def _queued(url: str, n: int) -> None:
    """Wait until ``n`` calls wait in the worker (its bls_worker_queued_calls)."""
    await anyio.to_thread.run_sync(
        lambda: wait_for(lambda: sample(url, "bls_worker_queued_calls", "ordered") == n)
    )


async def _call(rt: bls.Runtime, job: Job, priority: int, out: dict[int, Any]) -> None:
    @bls.script
    async def one(req: Job) -> Started:
        with bls.priority(priority):
            return await ordered(req)

    try:
        out[job.n] = await rt.run(one, job)
    except StageError as err:
        out[job.n] = err


async def _hold(
    tg: anyio.abc.TaskGroup, rt: bls.Runtime, url: str, gate: Path, out: dict[int, Any]
) -> None:
    """Start call 0, which holds the worker's one lane until ``gate`` exists, and wait
    until it runs."""
    tg.start_soon(_call, rt, Job(n=0, hold=str(gate)), 0, out)
    await anyio.to_thread.run_sync(
        lambda: wait_for(lambda: sample(url, "bls_worker_inflight_calls", "ordered") == 1)
    )


@pytest.mark.anyio
async def test_waiting_calls_start_highest_priority_first(worker: Proc, tmp_path: Path) -> None:
    url = metrics_url(worker)
    assert sample(url, "bls_worker_max_running", "ordered") == 1
    gate = tmp_path / "open"
    out: dict[int, Any] = {}
    async with bls.Runtime({"ordered": binding_for("ordered", worker.address)}) as rt:
        async with anyio.create_task_group() as tg:
            await _hold(tg, rt, url, gate, out)
            for n, priority in [(1, -5), (2, 0), (3, 7), (4, 0)]:
                tg.start_soon(_call, rt, Job(n=n), priority, out)
                await _queued(url, n)  # each arrives after the last
            gate.touch()
    started = sorted(out, key=lambda n: out[n].order)
    assert started == [0, 3, 2, 4, 1]  # 7 first, then the two 0s in arrival order, then -5
    assert [out[n].priority for n in started] == [0, 7, 0, 0, -5]


@pytest.mark.anyio
@pytest.mark.parametrize("worker", [3], indirect=True)
async def test_a_full_worker_displaces_the_lowest_waiting_call(
    worker: Proc, tmp_path: Path
) -> None:
    url = metrics_url(worker)
    gate = tmp_path / "open"
    out: dict[int, Any] = {}
    async with bls.Runtime({"ordered": binding_for("ordered", worker.address)}) as rt:
        async with anyio.create_task_group() as tg:
            await _hold(tg, rt, url, gate, out)
            tg.start_soon(_call, rt, Job(n=1), -1, out)
            await _queued(url, 1)
            tg.start_soon(_call, rt, Job(n=2), -1, out)
            await _queued(url, 2)  # full: 1 running, 2 waiting
            tg.start_soon(_call, rt, Job(n=3), 5, out)  # displaces 2, the last of the lowest
            await anyio.to_thread.run_sync(lambda: wait_for(lambda: 2 in out))
            await _call(rt, Job(n=4), -1, out)  # full, none lower: refused at once
            gate.touch()
    for n in (2, 4):
        assert isinstance(out[n], StageError) and out[n].kind == "overloaded", out[n]
        assert out[n].stage == "ordered"
    assert "displaced by a call of higher priority" in str(out[2])
    assert [n for n in sorted((0, 1, 3), key=lambda n: out[n].order)] == [0, 3, 1]
    assert sample(url, "bls_worker_calls_total", "ordered", outcome="rejected") == 2
    assert sample(url, "bls_worker_calls_total", "ordered", outcome="completed") == 3


@pytest.mark.anyio
async def test_a_waiting_call_cancelled_by_its_caller_is_answered_at_once(
    worker: Proc, tmp_path: Path
) -> None:
    url = metrics_url(worker)
    gate = tmp_path / "open"
    out: dict[int, Any] = {}
    async with bls.Runtime({"ordered": binding_for("ordered", worker.address)}) as rt:
        async with anyio.create_task_group() as tg:
            await _hold(tg, rt, url, gate, out)
            async with anyio.create_task_group() as inner:
                inner.start_soon(_call, rt, Job(n=1), 0, out)
                await _queued(url, 1)
                inner.cancel_scope.cancel()
            # The lane is still held, yet the cancelled call has left the queue.
            await _queued(url, 0)
            await anyio.to_thread.run_sync(
                lambda: wait_for(
                    lambda: (
                        sample(url, "bls_worker_calls_total", "ordered", outcome="cancelled") == 1
                    )
                )
            )
            assert sample(url, "bls_worker_inflight_calls", "ordered") == 1
            gate.touch()
    assert out[0].order == 0 and 1 not in out


def test_max_running_above_max_inflight_is_refused() -> None:
    result = run_bls(
        "worker", f"{STAGE}:ordered", "--listen", "tcp://127.0.0.1:0",
        "--max-running", "9", "--max-inflight", "4",
    )  # fmt: skip
    assert result.returncode != 0
    assert "--max-running 9 is more than --max-inflight 4" in result.stderr


@pytest.mark.anyio
async def test_a_drain_that_runs_out_of_grace_answers_waiting_calls_too(
    worker: Proc, tmp_path: Path
) -> None:
    url = metrics_url(worker)
    out: dict[int, Any] = {}
    never = tmp_path / "never"  # not made: the first call holds the lane until it is cut
    async with bls.Runtime({"ordered": binding_for("ordered", worker.address)}) as rt:
        async with anyio.create_task_group() as tg:
            await _hold(tg, rt, url, never, out)
            tg.start_soon(_call, rt, Job(n=1), 3, out)
            await _queued(url, 1)
            worker.signal(signal.SIGTERM)  # --grace 0.5 (the fixture): then both are cut
    for n in (0, 1):
        assert isinstance(out[n], StageError) and out[n].kind == "shutdown", out[n]
    assert "before the call started" in str(out[1])
    assert worker.wait() == 0
