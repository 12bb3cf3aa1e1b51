"""The stage bench/traffic.py and tests/e2e/test_policy.py serve from several `bls worker`
processes, each made slow or failing by its environment: BLS_REPLICA_DELAY_MS (every call
takes that long) and BLS_REPLICA_FAILS (every call raises a StageError of that kind, or a
RuntimeError for "crash"). Each call and each cancelled call is logged with the replica's
name (BLS_REPLICA_NAME), for the tests to count."""

from __future__ import annotations

import logging
import os

import anyio

import bls

log = logging.getLogger("bls.replica")

NAME = os.environ.get("BLS_REPLICA_NAME", "replica")
DELAY = float(os.environ.get("BLS_REPLICA_DELAY_MS", "0")) / 1000
FAILS = os.environ.get("BLS_REPLICA_FAILS", "")


class Job(bls.Message):
    n: int


class Done(bls.Message):
    n: int
    replica: str


async def work(req: Job) -> Done:
    log.info("call %d on %s", req.n, NAME)
    if FAILS == "crash":
        raise RuntimeError(f"{NAME} is broken")
    if FAILS:
        raise bls.StageError("work", FAILS, f"{NAME} fails every call")
    try:
        await anyio.sleep(DELAY)
    except anyio.get_cancelled_exc_class():
        log.info("cancelled call %d on %s", req.n, NAME)
        raise
    return Done(n=req.n, replica=NAME)


@bls.script
async def one(req: Job) -> Done:
    """The entry bench/traffic.py serves for its admission runs (`work` bound inline)."""
    return await bls.stage("work", req)
