"""What bench/recovery.py serves: `steps`, a run of remote calls to `slow` in turn; and
`slow` itself (`bls worker bench/serving/steps.py:slow`), which notes each call as it
starts (a line `RUN STEP` in $BLS_BENCH_CALLS) and answers after $BLS_BENCH_SLOW_S."""

from __future__ import annotations

import os

import anyio

import bls
from bls import stage


class Step(bls.Message):
    run: int
    step: int


async def slow(req: Step) -> str:
    async with await anyio.open_file(os.environ["BLS_BENCH_CALLS"], "a") as calls:
        await calls.write(f"{req.run} {req.step}\n")
    await anyio.sleep(float(os.environ.get("BLS_BENCH_SLOW_S", "0.2")))
    return f"{req.run}:{req.step}"


class Job(bls.Message):
    n: int
    steps: int


class Done(bls.Message):
    n: int
    out: list[str]


@bls.script
async def steps(req: Job) -> Done:
    out = [await stage("slow", Step(run=req.n, step=s)) for s in range(req.steps)]
    return Done(n=req.n, out=out)
