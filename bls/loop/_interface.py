"""What :mod:`bls.loop` offers, as interfaces both backend modules implement."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from typing import Protocol, TypeVar

import anyio

__all__ = ["Backend", "Deadline", "Delays", "FdReader", "Waiter", "checked"]

K = TypeVar("K", bound=Hashable)
K_in = TypeVar("K_in", bound=Hashable, contravariant=True)


class Waiter(Protocol):
    """What one task waits on until another wakes it. Single use."""

    async def wait(self) -> None:
        """Wait until :meth:`wake`; cancellable."""

    def wake(self) -> bool:
        """Wake the waiting task; False if it was cancelled while it waited."""


class FdReader(Protocol):
    """Runs ``drain()`` whenever a socket's FD signals, and when asked to.

    ZeroMQ's FD is edge-triggered: it signals a change, not waiting input, and any send
    or receive may take the signal. ``drain`` reads until no input is left or a batch
    ends; the owner calls :meth:`again` when a batch ended with input left, and
    :meth:`check` after a send, which may have taken the edge.
    """

    async def run(self) -> None:
        """Drain as the FD signals, until cancelled."""

    def check(self) -> None:
        """A send may have taken the edge: drain before the loop next waits."""

    def again(self) -> None:
        """A drain stopped with input left: drain again once other work has run."""

    @property
    def pending(self) -> bool:
        """Whether a drain is already on its way (no edge needed for it)."""


class Delays(Protocol[K_in]):
    """Keys that come due ``delay`` seconds after they were added: ``fire(key)`` runs for
    each key still there then (up to a millisecond late, never early), in the order they
    were added. A key is either waiting or not: adding it again restarts its delay."""

    def add(self, key: K_in) -> None: ...

    def discard(self, key: K_in) -> None:
        """Forget ``key`` (nothing if it is not waiting)."""


class Deadline(Protocol):
    """One cancel scope's deadline (:meth:`Backend.deadline`): the scope is cancelled
    when it passes (up to a millisecond late, never early). NaN is refused (ValueError),
    as trio's scopes refuse it; infinity is none."""

    def at(self, when: float) -> None:
        """The deadline is loop time ``when`` (:meth:`Backend.now`)."""

    def after(self, seconds: float) -> None:
        """The deadline is ``seconds`` from now."""

    def clear(self) -> None:
        """No deadline (its scope has ended, or has none any more)."""


class Backend(Protocol):
    """What bls needs of an event loop beyond anyio."""

    name: str

    def cancel_scope(self, shield: bool = False) -> anyio.CancelScope:
        """A new ``anyio.CancelScope``: the same object, made without looking up the
        running backend (``anyio.CancelScope()`` does that each time: more than half its
        cost on a request's path)."""

    def deadline(self, scope: anyio.CancelScope) -> Deadline:
        """A :class:`Deadline` for ``scope``, none set yet."""

    def share(self, seconds: float) -> None:
        """Deadlines set ``seconds`` ahead (:meth:`Deadline.after`: a server's default)
        are many and alike: keep them in one queue."""

    def waiter(self) -> Waiter: ...

    def fd_reader(self, fd: int, drain: Callable[[], None]) -> FdReader: ...

    def now(self) -> float:
        """The loop's clock (what :meth:`Deadline.at` takes)."""

    def delays(self, delay: float, fire: Callable[[K], object]) -> Delays[K]:
        """A new :class:`Delays` calling ``fire`` (which must not raise) on this loop."""

    def spawn(self, fn: Callable[[], Awaitable[None]]) -> Callable[[], object]:
        """Run ``fn()`` beside the caller in no task group (it must not raise); returns
        what stops it."""


def checked(when: float) -> float:
    """``when``, a deadline's time or delay; ValueError for NaN."""
    if when != when:
        raise ValueError("a deadline must be a time or infinite, not NaN")
    return when
