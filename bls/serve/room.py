"""Bytes held at once, bounded (:class:`Room`): the large answers a frontend is sending
(:mod:`.framing`), and the input files of the batches it runs (:mod:`.batches`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

__all__ = ["Room"]


class Room:
    """Bytes held at once, ``limit`` at most (one hold larger than it fits alone, when
    nothing else is held): :meth:`take` at once or not at all, or :meth:`hold`, waiting
    until enough are given back."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.waiting = 0  # holds waiting for room
        self._given: anyio.Event | None = None  # (made by a waiter; set as bytes go back)

    def take(self, size: int) -> bool:
        """Hold ``size`` bytes if there is room (True); then :meth:`give` them back."""
        if self.held and self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size
        given, self._given = self._given, None
        if given is not None:
            given.set()

    @asynccontextmanager
    async def hold(self, size: int) -> AsyncIterator[None]:
        """``size`` bytes held while the block runs, once there is room for them."""
        self.waiting += 1
        try:
            while not self.take(size):  # (woken, it tries again: another may take it first)
                if self._given is None:
                    self._given = anyio.Event()
                await self._given.wait()
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            self.give(size)
