"""Workers for the hardening tests: an echo of any value, an endless stream, a stall."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio

import bls


class Kept(bls.Message):
    value: Any = None


class Size(bls.Message):
    size: int = 1024


class Stall(bls.Message):
    seconds: float  # how long the remote call takes
    block: float  # how long the caller's event loop is blocked meanwhile


async def keep(req: Kept) -> Kept:
    return req


async def flood(req: Size) -> AsyncIterator[bytes]:
    """As many items of ``size`` bytes as the caller's credit allows, forever."""
    item = b"x" * req.size
    while True:
        yield item


async def sleep(req: Stall) -> Kept:
    await anyio.sleep(req.seconds)
    return Kept(value="slept")


def block(seconds: float) -> None:
    time.sleep(seconds)  # a long synchronous step: nothing else runs on this loop
