"""Workers for the transport tests: each records what happened to it in a marker file."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio

import bls


class Mark(bls.Message):
    marker: str = ""
    seconds: float = 30.0
    count: int = 1_000_000


class Served(bls.Message):
    pid: int
    text: str


# A file name that is not UTF-8 (Latin-1's é), as Python reads it from a directory: with a
# lone surrogate, which no UTF-8 encoder takes (an error naming it must still be answered).
LATIN1_NAME = os.fsdecode(b"photo-\xe9.jpg")


def _mark(path: str, what: str) -> None:
    """Write ``path`` atomically (a reader never sees it half-written)."""
    if path:
        Path(path + ".tmp").write_text(f"{what} {time.time()}")
        os.replace(path + ".tmp", path)


async def slow(req: Mark) -> Served:
    """Sleeps, then answers with the serving process id; marks how it ended."""
    outcome = "finished"
    _mark(req.marker and req.marker + ".started", "started")
    try:
        await anyio.sleep(req.seconds)
    except anyio.get_cancelled_exc_class():
        outcome = "cancelled"
        raise
    finally:
        _mark(req.marker, outcome)
    return Served(pid=os.getpid(), text="slept")


async def ticks(req: Mark) -> AsyncIterator[int]:
    """Yields 0, 1, 2, ... (up to count); marks how it ended and how far it got."""
    produced = 0
    outcome = "finished"
    try:
        for i in range(req.count):
            produced = i + 1
            _mark(req.marker and req.marker + ".produced", str(produced))
            yield i
            await anyio.sleep(req.seconds)
    except anyio.get_cancelled_exc_class():
        outcome = "cancelled"
        raise
    except GeneratorExit:
        outcome = "closed"
        raise
    finally:
        _mark(req.marker, outcome)


async def whoami(req: Mark) -> Served:
    return Served(pid=os.getpid(), text="hi")


async def boom(req: Mark) -> Served:
    if req.marker == "latin-1":
        raise ValueError(f"cannot read {LATIN1_NAME}")
    raise ValueError(f"bad marker {req.marker!r}")


@bls.script
async def nested(req: Mark) -> Served:
    """A script served as a stage: its own stage call inherits deadline and cancel."""
    return await bls.stage("slow", req)


@bls.batch(max_batch_size=8, max_delay_ms=200)
async def sized(reqs: list[Mark]) -> list[Served]:
    """A batched stage that tells each caller how big its batch was."""
    return [Served(pid=os.getpid(), text=str(len(reqs))) for _ in reqs]
