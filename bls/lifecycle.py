"""A serving process's life: serve until SIGTERM/SIGINT, then drain what is in flight.

``bls serve`` (requests) and ``bls worker`` (calls) both run :func:`serve_until_signal`
over their server, and both drain with :class:`Drain`: refuse new work, let what is
running finish within the grace period, then cancel the rest and give it a moment to
answer.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine, Sized
from typing import Any, Protocol

import anyio
import anyio.abc

__all__ = ["Drain", "Drainable", "serve_until_signal"]

log = logging.getLogger("bls")

# After a drain's grace ran out and the rest was cancelled: how long their answers get.
CANCELLED_ANSWER_S = 5.0


class Drain:
    """The work in flight (any sized collection the owner keeps) and its drain."""

    __slots__ = ("_idle", "draining", "live")

    def __init__(self, live: Sized) -> None:
        self.live = live
        self.draining = False  # set by drain(): owners refuse new work from then on
        self._idle: anyio.Event | None = None

    def left(self) -> None:
        """Tell a waiting drain that a piece of work ended (call after removing it)."""
        if self._idle is not None and not self.live:
            self._idle.set()

    async def _empty(self) -> None:
        while self.live:
            self._idle = anyio.Event()
            await self._idle.wait()

    async def drain(self, grace: float, cancel_rest: Callable[[], None]) -> bool:
        """Refuse new work, wait up to ``grace`` s for the work in flight, then cancel what
        is left and wait a little for its answers. True if nothing had to be cancelled."""
        self.draining = True
        with anyio.move_on_after(grace):
            await self._empty()
            return True
        cancel_rest()
        with anyio.move_on_after(CANCELLED_ANSWER_S):
            await self._empty()
        return False


class Drainable(Protocol):
    """A server :func:`serve_until_signal` can run: started in a task group, then drained."""

    @property
    def inflight(self) -> int: ...

    async def drain(self, grace: float) -> bool: ...


async def serve_until_signal(
    server: Drainable,
    run: Callable[..., Coroutine[Any, Any, Any]],
    *,
    grace: float,
    what: str,
    noun: str,
    on_ready: Callable[[Any], None],
    stop: Callable[[anyio.abc.TaskGroup], Awaitable[None]],
    before_drain: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Start ``run`` (``tg.start``-style; what it reports goes to ``on_ready``), wait for
    SIGTERM or SIGINT, drain ``server`` for ``grace`` s, then ``stop(task_group)``.

    The signal handlers are installed before ``run`` starts, so a signal that arrives as
    soon as the process says it is ready still drains. ``what`` names the server in the log
    and ``noun`` its work ("call(s)", "request(s)"). ``before_drain`` runs first on the
    signal (a worker leaves discovery, so callers stop sending).
    """
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with anyio.create_task_group() as tg:
            on_ready(await tg.start(run))
            async for signum in signals:
                log.info(
                    "%s: %s: draining %d %s (grace %gs)",
                    what,
                    signal.Signals(signum).name,
                    server.inflight,
                    noun,
                    grace,
                )
                if before_drain is not None:
                    await before_drain()
                if not await server.drain(grace):
                    log.warning("%s: grace period over: cancelled the rest", what)
                await stop(tg)
                return
