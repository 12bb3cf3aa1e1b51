"""Workers the benchmarks serve with `bls worker` (echo, streams, tensors, a cancel probe)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import numpy  # noqa: F401 - tensor_echo takes arrays: the wire decodes them only where numpy is loaded

import bls


class Blob(bls.Message):
    data: bytes


class Count(bls.Message):
    n: int


class Tensor(bls.Message):
    array: Any


class Probe(bls.Message):
    op: str


async def echo(req: Blob) -> Blob:
    return req


async def tensor_echo(req: Tensor) -> Tensor:
    return req


async def ticks(req: Count) -> AsyncIterator[int]:
    for i in range(req.n):
        yield i


_finally_times: list[float] = []


async def cancel_probe(req: Probe) -> AsyncIterator[float]:
    """'wait': yield once, then wait to be cancelled (recording when); 'report': the times."""
    if req.op == "report":
        for t in _finally_times:
            yield t
        _finally_times.clear()
        return
    try:
        yield 0.0
        await anyio.sleep(3600)
    finally:
        _finally_times.append(time.time())


_serial: list[anyio.Lock] = []


async def serial(req: Blob) -> Blob:
    """One call at a time, 10 ms each: a replica that serves 100 calls a second, whatever
    the cores (the scaling benchmark's stand-in for a saturated encoder)."""
    if not _serial:
        _serial.append(anyio.Lock())
    async with _serial[0]:
        await anyio.sleep(0.01)
    return req
