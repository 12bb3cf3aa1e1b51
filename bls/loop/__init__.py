"""The one place that knows asyncio from trio: one module per backend (``_asyncio``,
``_trio``), both behind the :class:`Backend` interface here.

Everything else in bls speaks anyio, plus the few things here that anyio does not offer
at the price a hot path can pay:

- :class:`Waiter`: one task parks until a message's dispatch wakes it (a call waiting
  for its reply, an idle worker lane). An asyncio future costs several times less than
  an ``anyio.Event`` there; on trio an Event is what trio has.
- :class:`Deadline`: a cancel scope's deadline, set (:meth:`Deadline.at`,
  :meth:`Deadline.after`), moved and cleared as often as its owner needs. On asyncio a
  server holds one for every request in flight and moves most of them before they fire;
  a loop timer each (as anyio's own deadlines use) costs more than the rest of a small
  request, so they share one loop timer in 1 ms buckets, and those a fixed delay away
  that the server shares (:meth:`Backend.share`: its default request deadline) wait in
  one queue in the order they were set. On trio, the scope's own deadline.
- :meth:`Backend.delays`: keys due a fixed delay after they were added (a body too slow,
  a request that now needs its disconnect watcher): the order added is the order due, so
  a dict and one loop timer serve them all.
- :meth:`Backend.spawn`: a task in no group (the disconnect watcher).
- :meth:`Backend.fd_reader`: the reader of a ZeroMQ socket's edge-triggered FD.

:func:`backend` returns the :class:`Backend` of the running event loop. A process has one
loop in production, so the choice is made once; the test suite runs both, one after the
other, and each loop gets its own.
"""

from __future__ import annotations

import sniffio

from ._interface import Backend, Deadline, Delays, FdReader, Waiter, checked

__all__ = ["Backend", "Deadline", "Delays", "FdReader", "Waiter", "backend", "checked"]


def backend() -> Backend:
    """The :class:`Backend` of the running event loop."""
    name = sniffio.current_async_library()
    if name == "asyncio":
        from ._asyncio import running

        return running()
    if name == "trio":
        from ._trio import TRIO

        return TRIO
    raise RuntimeError(f"bls runs on asyncio or trio, not {name}")
