"""``bls.timeout``: deadlines for a block of a script; ``bls.remaining()``: what is left."""

from __future__ import annotations

import contextvars
import math
import time
from types import TracebackType

import anyio

from .errors import DeadlineExceeded
from .scope import CallContext, current, enter, leave

__all__ = ["remaining", "timeout"]


def remaining() -> float | None:
    """Seconds left before the deadline the current code runs under (the request's, or a
    ``bls.timeout`` block's, whichever is earlier), never below 0; None without one. A
    loop can stop while an answer is still worth sending::

        if (left := bls.remaining()) is not None and left < 0.5:
            return best_so_far
    """
    deadline = current().deadline
    if deadline == math.inf:
        return None
    return max(0.0, deadline - time.time())


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
        self._token: contextvars.Token[CallContext] | None = None

    def __enter__(self) -> anyio.CancelScope:
        self._scope = anyio.CancelScope(deadline=anyio.current_time() + self.seconds)
        # The deadline remote calls carry (the cancel scope is this process's).
        self._token = enter(current().within(time.time() + self.seconds))
        return self._scope.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._scope is not None
        scope, self._scope = self._scope, None
        leave(self._token)
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
