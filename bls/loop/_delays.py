"""What both backends' :class:`bls.loop.Delays` share: keys in the order added, which is
the order due; a backend sees to one hand-over at a time (``_started``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["DELAY_STEP", "Due"]

log = logging.getLogger("bls")

K = TypeVar("K", bound=Hashable)

# How late a due key may be handed over (its loop timer is armed no more often).
DELAY_STEP = 0.001


class Due(Generic[K]):
    """Both backends' :class:`bls.loop.Delays`: a backend's ``_started(when)`` sees to a
    hand-over at ``when`` when none is on its way."""

    __slots__ = ("_clock", "_delay", "_due", "_fire")

    def __init__(self, clock: Callable[[], float], delay: float, fire: Callable[[K], object]):
        self._clock = clock
        self._delay = delay
        self._fire = fire
        self._due: dict[K, float] = {}  # key -> when, in the order added: the order due

    def add(self, key: K) -> None:
        self._due.pop(key, None)  # added again: due later, so last in order
        when = self._due[key] = self._clock() + self._delay
        self._started(when)

    def discard(self, key: K) -> None:
        self._due.pop(key, None)

    def _started(self, when: float) -> None: ...

    def _fire_due(self, now: float) -> float | None:
        """Hand over the keys due by ``now``; when the next one is due (None: none)."""
        due = self._due
        while due:
            key = next(iter(due))
            when = due[key]
            if when > now:
                return when
            del due[key]
            try:
                self._fire(key)
            except Exception:  # one key's bug must not stop the others
                log.exception("a delayed callback failed")
        return None
