"""Work that waits its turn, best first, and sheds the worst when there is no room: the
one queue both the frontend's admission (requests waiting for a slot) and a worker
(calls waiting for a lane) keep.

Each item has a key; the lowest key is served first (a higher priority is a lower key:
``-priority``), and the highest is the one shed. Keys end in a sequence number, so no
two are equal and items are never compared.
"""

from __future__ import annotations

import heapq
from typing import Any, Generic, TypeVar

__all__ = ["Shedding"]

T = TypeVar("T")


class Shedding(Generic[T]):
    """A heap of ``(key, item)``: :meth:`pop` the best, :meth:`worst` the one to shed,
    :meth:`remove` one that no longer waits (cancelled)."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[Any, T]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, key: Any, item: T) -> None:
        heapq.heappush(self._heap, (key, item))

    def best_key(self) -> Any:
        """The key of the item served next (the queue must not be empty)."""
        return self._heap[0][0]

    def pop(self) -> T:
        """The item served next (the queue must not be empty)."""
        return heapq.heappop(self._heap)[1]

    def worst(self) -> tuple[Any, T] | None:
        """The key and item that would be served last; None when empty."""
        if not self._heap:
            return None
        return max(self._heap, key=lambda entry: entry[0])

    def remove(self, item: T) -> bool:
        """Take ``item`` out; False if it is not waiting."""
        heap = self._heap
        for i, (_, waiting) in enumerate(heap):
            if waiting is item:
                heap[i] = heap[-1]
                heap.pop()
                heapq.heapify(heap)
                return True
        return False
