"""The calls a worker has taken and not yet started, and the lanes that run them.

A worker runs at most ``--max-running`` calls at once and holds up to ``--max-inflight``;
the difference waits here, served highest priority first, then in the order they came.
When every place is held, a call of a higher priority than the one that would start last
displaces it (:meth:`CallQueue.displace`): under overload, low priority is refused first
and high priority keeps its place.

Calls run on lanes (:class:`Lanes`): reusable tasks, up to ``--max-running``, each taking
the next waiting call when it is free. Spawning a task costs more than a small call.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable

import anyio.abc

from bls import loop
from bls.shedding import Shedding

from .worker_calls import CallState

__all__ = ["CallQueue", "Lanes"]


class CallQueue:
    """Waiting calls (:class:`bls.shedding.Shedding`) keyed by (-priority, arrival)."""

    __slots__ = ("_order", "_waiting")

    def __init__(self) -> None:
        self._waiting: Shedding[CallState] = Shedding()
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._waiting)

    def push(self, state: CallState) -> None:
        self._waiting.push((-state.priority, next(self._order)), state)

    def pop(self) -> CallState:
        """The call to start next (the queue must not be empty)."""
        return self._waiting.pop()

    def remove(self, state: CallState) -> bool:
        """Take ``state`` out (cancelled before it started); False if it is not waiting."""
        return self._waiting.remove(state)

    def displace(self, priority: int) -> CallState | None:
        """Take out the call that would start last, if its priority is below ``priority``
        (the caller refuses it); None when none is."""
        worst = self._waiting.worst()
        if worst is None or worst[1].priority >= priority:
            return None
        self._waiting.remove(worst[1])
        return worst[1]


class Lanes:
    """Up to ``max_running`` tasks in ``tg``, each running the waiting calls of ``queue``
    one after another with ``run``, and waiting (idle) when none is left."""

    __slots__ = ("_idle", "_lanes", "_run", "max_running", "queue", "tg")

    def __init__(
        self,
        queue: CallQueue,
        run: Callable[[CallState], Awaitable[None]],
        max_running: int,
    ) -> None:
        self.queue = queue
        self._run = run
        self.max_running = max_running
        self.tg: anyio.abc.TaskGroup | None = None  # (the worker's, once it serves)
        self._idle: list[loop.Waiter] = []  # what each idle lane waits on
        self._lanes = 0

    def take(self, state: CallState) -> None:
        """``state`` waits for a lane: an idle one is woken, or one more started."""
        self.queue.push(state)
        if not self._wake() and self._lanes < self.max_running:
            assert self.tg is not None
            self._lanes += 1
            self.tg.start_soon(self._lane)

    def _wake(self) -> bool:
        """Wake an idle lane; False if there is none."""
        idle = self._idle
        while idle:
            if idle.pop().wake():  # else a lane cancelled while it waited
                return True
        return False

    async def _lane(self) -> None:
        queue = self.queue
        backend = loop.backend()
        while True:
            while queue:
                await self._run(queue.pop())
            waiter = backend.waiter()
            self._idle.append(waiter)
            await waiter.wait()
