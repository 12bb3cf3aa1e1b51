"""ZeroMQ sockets on anyio: one reader task per socket, on asyncio and on trio.

pyzmq's own async layer is asyncio-only, so bls integrates on the socket's ``zmq.FD``
with :func:`anyio.wait_readable`, which both backends provide natively. That FD is
edge-triggered: it signals when the socket's state changes, not while messages are
waiting, and any send or receive may consume the signal. So:

- the reader drains the socket until ``EAGAIN`` before it waits on the FD again;
- after every send, ``zmq.EVENTS`` is re-checked and pending input drained right away,
  in the sending task (dispatch is synchronous, so this is safe anywhere);
- sends never block: if the socket's queue is full the frames wait in a backlog that
  the reader flushes as soon as ``POLLOUT`` is reported. Flow control above (credits,
  in-flight limits) bounds that backlog. Because ``send`` is synchronous, a cancelled
  task can still send its cancel frame without awaiting.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import zmq

__all__ = ["AsyncSocket"]

BATCH = 256  # messages handled per drain before yielding to other tasks


class AsyncSocket:
    """A zmq socket whose incoming messages are handed to ``on_message`` synchronously.

    ``on_message(frames)`` must not block or raise; it receives a list of ``zmq.Frame``.
    """

    def __init__(self, sock: zmq.Socket[Any], on_message: Callable[[list[Any]], None]) -> None:
        self.sock = sock
        self._on_message = on_message
        self._backlog: collections.deque[Sequence[Any]] = collections.deque()
        self._draining = False
        self._more = False
        self.closed = False

    def send(self, frames: Sequence[Any]) -> None:
        """Queue ``frames`` as one message. Never blocks; never raises for a full queue."""
        if self.closed:
            return
        if self._backlog:
            self._backlog.append(frames)
        else:
            try:
                self.sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self._backlog.append(frames)
        if int(self.sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            self.drain()

    def drop_backlog(self, keep: Callable[[Sequence[Any]], bool]) -> None:
        """Forget queued (unsent) messages for which ``keep`` is false."""
        self._backlog = collections.deque(m for m in self._backlog if keep(m))

    def drain(self) -> None:
        """Flush the backlog and hand every waiting message to ``on_message``."""
        if self._draining or self.closed:
            return
        self._draining = True
        sock = self.sock
        try:
            handled = 0
            while handled < BATCH:
                events = int(sock.getsockopt(zmq.EVENTS))
                if events & zmq.POLLOUT and self._backlog:
                    self._flush()
                if not events & zmq.POLLIN:
                    self._more = False
                    return
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    self._more = False
                    return
                handled += 1
                self._on_message(frames)
            self._more = True
        finally:
            self._draining = False

    def _flush(self) -> None:
        while self._backlog:
            try:
                self.sock.send_multipart(self._backlog[0], zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._backlog.popleft()

    async def run(self) -> None:
        """The reader loop; runs until cancelled. The owner closes the socket after."""
        fd = int(self.sock.getsockopt(zmq.FD))
        while True:
            self.drain()
            if self._more:
                await anyio.lowlevel.checkpoint()
            else:
                await anyio.wait_readable(fd)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close(linger=0)
