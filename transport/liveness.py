"""Heartbeat timing that tells a dead peer from a stalled self.

A process whose event loop was blocked (a model loading, a first ``import torch``, a long
forward pass on the loop) has not read its peers' heartbeats either; judging them by the
silence would declare healthy peers dead. :func:`ticks` reports such stalls so the caller
restarts its clocks instead.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import anyio

__all__ = ["ticks"]


async def ticks(interval: float, stall_after: float) -> AsyncIterator[bool]:
    """Tick every ``interval`` s; each tick is True when this process itself stalled for
    more than ``stall_after`` s since the previous one."""
    last = time.monotonic()
    while True:
        await anyio.sleep(interval)
        now = time.monotonic()
        yield now - last > stall_after
        last = now
