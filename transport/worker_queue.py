"""The calls a worker has taken and not yet started: served highest priority first, then
in the order they came.

A worker runs at most ``--max-running`` calls at once and holds up to ``--max-inflight``;
the difference waits here. When every place is held, a call of a higher priority than the
one that would start last displaces it (:meth:`CallQueue.displace`): under overload, low
priority is refused first and high priority keeps its place.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any

from .worker_calls import CallState

__all__ = ["CallQueue", "Waiting"]

# What a lane needs to start a call: its state, request, deadline and priority.
Waiting = tuple[CallState, Any, float, int]


class CallQueue:
    """A heap of waiting calls keyed by (-priority, arrival)."""

    __slots__ = ("_heap", "_order")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, CallState, Any, float, int]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, state: CallState, req: Any, deadline: float, priority: int) -> None:
        heapq.heappush(self._heap, (-priority, next(self._order), state, req, deadline, priority))

    def pop(self) -> Waiting:
        """The call to start next (the queue must not be empty)."""
        _, _, state, req, deadline, priority = heapq.heappop(self._heap)
        return state, req, deadline, priority

    def remove(self, state: CallState) -> bool:
        """Take ``state`` out (cancelled before it started); False if it is not waiting."""
        heap = self._heap
        for i, waiting in enumerate(heap):
            if waiting[2] is state:
                heap[i] = heap[-1]
                heap.pop()
                heapq.heapify(heap)
                return True
        return False

    def displace(self, priority: int) -> CallState | None:
        """Take out the call that would start last, if its priority is below ``priority``
        (the caller refuses it); None when none is."""
        if not self._heap:
            return None
        last = max(self._heap, key=lambda waiting: (waiting[0], waiting[1]))
        if -last[0] >= priority:
            return None
        self.remove(last[2])
        return last[2]
