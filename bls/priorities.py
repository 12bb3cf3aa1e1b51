"""``bls.priority``: the priority a request's stage calls carry.

A request's priority comes from its ``X-Priority`` header (``bls serve``), or from the
call that started it (a worker), and travels with every stage call in the frame; a block
of a script can change it for the calls made inside::

    with bls.priority(-5):            # a background refresh: after interactive work
        await stage("indexer", doc)

Higher is served first; 0 is the default; -1000 to 1000. The frontend admits queued
requests by priority (docs/policy.md), and the vLLM worker passes it to the engine's
priority scheduling.
"""

from __future__ import annotations

import contextvars
from types import TracebackType

from .scope import CallContext, current, enter, leave

__all__ = ["MAX_PRIORITY", "current_priority", "priority"]

MAX_PRIORITY = 1000


def checked(level: object, what: str = "priority") -> int:
    """``level`` as a priority; ValueError naming ``what`` when it is not one."""
    if isinstance(level, bool) or not isinstance(level, int):
        raise ValueError(f"{what} must be an integer, got {level!r}")
    if not -MAX_PRIORITY <= level <= MAX_PRIORITY:
        raise ValueError(f"{what} must be between -{MAX_PRIORITY} and {MAX_PRIORITY}, got {level}")
    return level


def current_priority() -> int:
    """The priority stage calls made here carry (0 outside any request)."""
    return current().priority


class priority:
    """``with bls.priority(n):`` (or ``async with``): the stage calls made inside carry
    priority ``n`` instead of the request's."""

    __slots__ = ("_token", "level")

    def __init__(self, level: int) -> None:
        self.level = checked(level)
        self._token: contextvars.Token[CallContext] | None = None

    def __enter__(self) -> priority:
        self._token = enter(current().at_priority(self.level))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._token is not None
        leave(self._token)
        self._token = None

    async def __aenter__(self) -> priority:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)
