"""The measurement every contender of bench/compare_peers.py runs, on asyncio, given its calls.

Plain Python only: it is imported by each peer's driver, in the peer's own environment.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

PAYLOAD = {"data": "x" * 100}

Call = Callable[[], Awaitable[Any]]


async def measure(unary: Call, chain: Call, calls: int, inflight: int) -> dict[str, float]:
    """Sequential ``unary`` calls (latency), then ``chain`` with ``inflight`` at once."""
    for _ in range(200):
        await unary()
    lat = []
    for _ in range(calls):
        t = time.perf_counter()
        await unary()
        lat.append(time.perf_counter() - t)
    lat.sort()

    async def lane(n: int) -> None:
        for _ in range(n):
            await chain()

    await lane(100)
    per = max(1, calls // inflight)
    t = time.perf_counter()
    await asyncio.gather(*(lane(per) for _ in range(inflight)))
    rps = per * inflight / (time.perf_counter() - t)
    return {
        "unary_p50_us": statistics.median(lat) * 1e6,
        "unary_p99_us": lat[int(len(lat) * 0.99)] * 1e6,
        "chain_rps": rps,
    }
