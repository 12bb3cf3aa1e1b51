"""``bls.timeout``: deadlines for a block of a script."""

from __future__ import annotations

import contextvars
import math
import time
from types import TracebackType

import anyio

from .errors import DeadlineExceeded

__all__ = ["current_deadline", "deadline_at", "reset_deadline", "timeout"]

# The absolute deadline (seconds since the epoch; inf = none) that remote calls carry.
# Kept beside anyio's cancel scopes because reading it is a contextvar lookup, not a
# walk up the scope chain on every stage call.
_deadline: contextvars.ContextVar[float] = contextvars.ContextVar("bls_deadline", default=math.inf)


def current_deadline() -> float:
    """The earliest ``bls.timeout``/request deadline in force (epoch seconds, or inf)."""
    return _deadline.get()


def deadline_at(wall: float) -> contextvars.Token[float]:
    """Lower the deadline remote calls carry to ``wall`` (never raises it)."""
    return _deadline.set(min(wall, _deadline.get()))


def reset_deadline(token: contextvars.Token[float] | None) -> None:
    """Undo :func:`deadline_at`."""
    if token is not None:
        try:
            _deadline.reset(token)
        except ValueError:  # left from another context: nothing of ours to undo
            pass


class timeout:
    """Cancel the block after ``seconds`` and raise :class:`bls.DeadlineExceeded`.

    ``async with bls.timeout(0.5): ...`` (plain ``with`` works too). Everything started
    inside is cancelled when it expires: stage calls, fan-out, and the work inside remote
    workers, which also receive the absolute deadline with each call so they stop on
    time even if the cancel message is lost. Nested timeouts take the earliest deadline.
    """

    __slots__ = ("_scope", "_token", "seconds")

    def __init__(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"bls.timeout() needs seconds >= 0, got {seconds!r}")
        self.seconds = seconds
        self._scope: anyio.CancelScope | None = None
        self._token: contextvars.Token[float] | None = None

    def __enter__(self) -> anyio.CancelScope:
        self._scope = anyio.CancelScope(deadline=anyio.current_time() + self.seconds)
        self._token = deadline_at(time.time() + self.seconds)
        return self._scope.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._scope is not None
        scope, self._scope = self._scope, None
        reset_deadline(self._token)
        self._token = None
        swallowed = scope.__exit__(exc_type, exc, tb)
        if scope.cancelled_caught and scope.deadline <= anyio.current_time():
            raise DeadlineExceeded(f"deadline of {self.seconds}s exceeded")
        return bool(swallowed)

    async def __aenter__(self) -> anyio.CancelScope:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self.__exit__(exc_type, exc, tb)
