"""The stage the worker queue tests serve (`bls worker ...:ordered --max-running 1`): it
says in which order calls started and at which priority each ran. A call with ``hold``
set waits, before it answers, until the file it names exists: the test's gate."""

import itertools

import anyio

import bls


class Job(bls.Message):
    n: int
    hold: str = ""


class Started(bls.Message):
    n: int
    order: int
    priority: int


_order = itertools.count()


async def ordered(req: Job) -> Started:
    order = next(_order)
    with anyio.fail_after(30):
        while req.hold and not await anyio.Path(req.hold).exists():  # noqa: ASYNC110 (another process)
            await anyio.sleep(0.01)
    return Started(n=req.n, order=order, priority=bls.current_priority())
