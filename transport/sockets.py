"""ZeroMQ sockets on anyio: a socket whose incoming messages are dispatched as they come.

pyzmq's own async layer is asyncio-only, so bls integrates on the socket's ``zmq.FD``
through :meth:`bls.loop.Backend.fd_reader` (the loop's reader callback on asyncio, a task
on trio). That FD is edge-triggered: it signals when the socket's state changes, not while
messages are waiting, and any send or receive may consume the signal. So:

- a pump ends only when ``zmq.EVENTS`` says no input is left. One that stops after a
  batch (to let other work run) makes sure the rest is read soon (``FdReader.again``:
  the reader may be waiting for an edge that a pump elsewhere already took). Whoever
  pumps, nothing is left unread with nothing to wake the reader;
- a message whose handler raises is logged and dropped; the messages after it are read
  as usual;
- after a send, pending input is pumped before the loop next waits (``FdReader.check``:
  once per loop turn on asyncio however many tasks sent; at once in the sending task on
  trio, where dispatch is synchronous and so safe anywhere);
- :meth:`AsyncSocket.watch`, belt and braces, looks each second for input that waits
  with no wake-up coming (none of the above should ever allow it), logs it loudly,
  tells its owner (a worker counts it) and reads it;
- sends never block: if the socket's queue is full the frames wait in a backlog that
  the reader flushes as soon as ``POLLOUT`` is reported. Flow control above (credits,
  in-flight limits) bounds that backlog. Because ``send`` is synchronous, a cancelled
  task can still send its cancel frame without awaiting.
"""

from __future__ import annotations

import collections
import logging
import select
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import zmq

from bls import loop

__all__ = ["AsyncSocket"]

log = logging.getLogger("bls.transport")

BATCH = 256  # messages handled per pump before yielding to other tasks
# Plain ints: pyzmq's flag enums cost an enum operation on every combination.
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = int(zmq.NOBLOCK) | int(zmq.SNDMORE)
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)
_EVENTS = int(zmq.EVENTS)
_ZERO_COPY_MIN = 64 * 1024  # smaller frames are cheaper to copy than to pin
_UNROUTABLE = (zmq.EAGAIN, zmq.EHOSTUNREACH)


class AsyncSocket:
    """A zmq socket whose incoming messages are handed to ``on_message`` synchronously.

    ``on_message(frames)`` must not block; it receives a list of ``zmq.Frame``. If it
    raises, the message is dropped and logged. For a ROUTER
    socket with ``ROUTER_MANDATORY`` set, ``unroutable(identity)`` is told of a message
    that could not be queued for its peer (gone, or its queue is at the high-water mark);
    the message is dropped rather than held: one peer that does not read must not hold
    up the others, nor grow this process's memory.
    """

    def __init__(
        self,
        sock: zmq.Socket[Any],
        on_message: Callable[[list[Any]], None],
        *,
        unroutable: Callable[[bytes], None] | None = None,
    ) -> None:
        self.sock = sock
        self._unroutable = unroutable
        # The Cython send, without the Python wrapper's per-call bookkeeping (routing
        # ids, groups, copy thresholds) that bls never uses: `copy` is decided here.
        self._raw_send = zmq.backend.Socket.send.__get__(sock)
        self._on_message = on_message
        self._backlog: collections.deque[Sequence[Any]] = collections.deque()
        self._reading = False  # a pump is running (dispatch may send, and sends pump)
        self.closed = False
        self._fd = int(sock.getsockopt(zmq.FD))
        self._reader: loop.FdReader | None = None  # once run() runs

    def send(self, frames: Sequence[Any]) -> None:
        """Queue ``frames`` as one message. Never blocks; never raises for a full queue."""
        if self.closed:
            return
        if self._backlog or not self._send_now(frames):
            self._backlog.append(frames)
        # The send may have taken the FD's edge: look for input before the loop waits.
        if self._reader is not None:
            self._reader.check()
        else:
            self.pump()

    def _send_now(self, frames: Sequence[Any]) -> bool:
        """Send one message without blocking; False if the queue is full (nothing sent).

        A multipart message is queued atomically: only its first frame can be refused.
        """
        send = self._raw_send
        last = len(frames) - 1
        for i, frame in enumerate(frames):
            flags = _NOBLOCK if i == last else _NOBLOCK_MORE
            copy = not (isinstance(frame, memoryview) and frame.nbytes >= _ZERO_COPY_MIN)
            try:
                send(frame, flags, copy=copy)
            except zmq.ZMQError as exc:
                if i != 0:
                    raise
                if self._unroutable is not None and exc.errno in _UNROUTABLE:
                    self._unroutable(bytes(frame))
                    return True  # dropped: this peer cannot take it
                if exc.errno == zmq.EAGAIN:
                    return False
                raise
        return True

    def drop_backlog(self, keep: Callable[[Sequence[Any]], bool]) -> None:
        """Forget queued (unsent) messages for which ``keep`` is false."""
        self._backlog = collections.deque(m for m in self._backlog if keep(m))

    def pump(self) -> None:
        """Flush the backlog and hand every waiting message to ``on_message``.

        Safe to call from anywhere, any number of times (a call made while a pump runs
        does nothing: that pump goes on). It ends when ``zmq.EVENTS`` says no input is
        left; if it stops after a batch instead, the rest is read soon (see the module's
        docstring), whichever task or callback called it.
        """
        if self._reading or self.closed:
            return
        self._reading = True
        try:
            left = self._read_batch()
        finally:
            self._reading = False
        if left and self._reader is not None:
            self._reader.again()  # (before run(), run() pumps first)

    def _read_batch(self) -> bool:
        """Read up to :data:`BATCH` messages; True if input is left after them."""
        sock = self.sock
        recv = sock.recv
        for _ in range(BATCH):
            events = int(sock.get(_EVENTS))
            if events & _POLLOUT and self._backlog:
                self._flush()
            if not events & _POLLIN:
                return False
            try:
                frame = recv(_NOBLOCK, copy=False)
            except zmq.Again:
                return False
            frames = [frame]
            while frame.more:
                frame = recv(_NOBLOCK, copy=False)
                frames.append(frame)
            try:
                self._on_message(frames)
            except Exception:
                log.exception("a message's handler failed; the message is dropped")
            if self.closed:  # a handler closed it
                return False
        return True

    def _flush(self) -> None:
        while self._backlog:
            try:
                if not self._send_now(self._backlog[0]):
                    return
            except zmq.ZMQError:
                log.exception("a queued message could not be sent; it is dropped")
            self._backlog.popleft()

    async def run(self) -> None:
        """The reader; runs until cancelled. The owner closes the socket after."""
        self._reader = loop.backend().fd_reader(self._fd, self.pump)
        await self._reader.run()

    async def watch(self, on_stall: Callable[[], None] | None = None, every: float = 1.0) -> None:
        """Each ``every`` seconds, look for input that waits with no wake-up coming (the
        FD not readable, no pump scheduled, yet ``zmq.EVENTS`` reports input): log it
        loudly, tell ``on_stall`` (which counts it), and read it. Runs until cancelled."""
        while True:
            await anyio.sleep(every)
            if self.closed:
                return
            if self._reading or (self._reader is not None and self._reader.pending):
                continue  # a pump is on its way
            if select.select([self._fd], [], [], 0)[0]:
                continue  # a wake-up is pending: the reader will run
            if int(self.sock.get(_EVENTS)) & _POLLIN:
                log.error(
                    "input waited unread with nothing to wake the reader (a missed "
                    "wake-up): reading it now"
                )
                if on_stall is not None:
                    on_stall()
            self.pump()  # also flushes a backlog whose POLLOUT that read may have taken

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket; ``linger_ms`` lets already-queued messages go out first."""
        if not self.closed:
            self.closed = True
            self.sock.close(linger=linger_ms)
