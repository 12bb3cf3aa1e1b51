"""ZeroMQ sockets on anyio: one reader task per socket, on asyncio and on trio.

pyzmq's own async layer is asyncio-only, so bls integrates on the socket's ``zmq.FD``
with :func:`anyio.wait_readable`, which both backends provide natively. That FD is
edge-triggered: it signals when the socket's state changes, not while messages are
waiting, and any send or receive may consume the signal. So:

- the reader drains the socket until ``EAGAIN`` before it waits on the FD again;
- after a send, ``zmq.EVENTS`` is re-checked and pending input drained before the loop
  next waits: on asyncio once per loop iteration however many tasks sent (a callback
  scheduled by the first send), on trio right away in the sending task (dispatch is
  synchronous, so this is safe anywhere);
- sends never block: if the socket's queue is full the frames wait in a backlog that
  the reader flushes as soon as ``POLLOUT`` is reported. Flow control above (credits,
  in-flight limits) bounds that backlog. Because ``send`` is synchronous, a cancelled
  task can still send its cancel frame without awaiting.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import sniffio
import zmq

__all__ = ["AsyncSocket", "park", "unpark", "until_unparked"]

BATCH = 256  # messages handled per drain before yielding to other tasks
# Plain ints: pyzmq's flag enums cost an enum operation on every combination.
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = int(zmq.NOBLOCK) | int(zmq.SNDMORE)
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)
_EVENTS = int(zmq.EVENTS)
_ZERO_COPY_MIN = 64 * 1024  # smaller frames are cheaper to copy than to pin
_UNROUTABLE = (zmq.EAGAIN, zmq.EHOSTUNREACH)


def park(loop: asyncio.AbstractEventLoop | None) -> Any:
    """Something a task waits on until a message's dispatch wakes it: an asyncio future
    on asyncio (``loop``; an anyio Event costs several times more there), an anyio Event
    on trio (``loop`` None). Wait with :func:`until_unparked`, wake with :func:`unpark`."""
    return anyio.Event() if loop is None else loop.create_future()


async def until_unparked(waiter: Any) -> None:
    if isinstance(waiter, anyio.Event):
        await waiter.wait()
    else:
        await waiter


def unpark(waiter: Any) -> bool:
    """Wake the task waiting on ``waiter``; False if it was cancelled while it waited."""
    if isinstance(waiter, anyio.Event):
        waiter.set()
    elif waiter.done():
        return False
    else:
        waiter.set_result(None)
    return True


class AsyncSocket:
    """A zmq socket whose incoming messages are handed to ``on_message`` synchronously.

    ``on_message(frames)`` must not block or raise; it receives a list of ``zmq.Frame``.
    For a ROUTER socket with ``ROUTER_MANDATORY`` set, ``unroutable(identity)`` is told
    of a message that could not be queued for its peer (gone, or its queue is at the
    high-water mark); the message is dropped rather than held: one peer that does not
    read must not hold up the others, nor grow this process's memory.
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
        self._draining = False
        self._more = False
        self.closed = False
        # asyncio: the loop, once the reader runs, and whether a check is scheduled.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._context: contextvars.Context | None = None
        self._check_soon = False

    def send(self, frames: Sequence[Any]) -> None:
        """Queue ``frames`` as one message. Never blocks; never raises for a full queue."""
        if self.closed:
            return
        if self._backlog or not self._send_now(frames):
            self._backlog.append(frames)
        if self._loop is not None:
            if not self._check_soon:
                self._check_soon = True
                # In the reader's context: what it dispatches must not inherit a sender's.
                self._loop.call_soon(self._check, context=self._context)
        elif int(self.sock.get(_EVENTS)) & _POLLIN:
            self.drain()

    def _check(self) -> None:
        """Input that arrived while tasks sent (their sends may have taken the FD's edge);
        :meth:`drain` reads ``zmq.EVENTS`` first, so this costs one read when there is none."""
        self._check_soon = False
        self._readable()

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

    def drain(self) -> None:
        """Flush the backlog and hand every waiting message to ``on_message``."""
        if self._draining or self.closed:
            return
        self._draining = True
        sock = self.sock
        try:
            handled = 0
            recv = sock.recv
            while handled < BATCH:
                events = int(sock.get(_EVENTS))
                if events & _POLLOUT and self._backlog:
                    self._flush()
                if not events & _POLLIN:
                    self._more = False
                    return
                try:
                    frame = recv(_NOBLOCK, copy=False)
                except zmq.Again:
                    self._more = False
                    return
                frames = [frame]
                while frame.more:
                    frame = recv(_NOBLOCK, copy=False)
                    frames.append(frame)
                handled += 1
                self._on_message(frames)
            self._more = True
        finally:
            self._draining = False

    def _flush(self) -> None:
        while self._backlog:
            if not self._send_now(self._backlog[0]):
                return
            self._backlog.popleft()

    async def run(self) -> None:
        """The reader; runs until cancelled. The owner closes the socket after.

        On asyncio the FD stays registered with the loop, and what arrives is dispatched
        from the loop's callback: no task wakes up per message, and no ``epoll_ctl``
        pair per wait. On trio a task waits on the FD.
        """
        fd = int(self.sock.getsockopt(zmq.FD))
        if sniffio.current_async_library() == "asyncio":
            self._context = contextvars.copy_context()
            loop = self._loop = asyncio.get_running_loop()
            loop.add_reader(fd, self._readable)
            try:
                self._readable()
                await anyio.sleep_forever()
            finally:
                loop.remove_reader(fd)
        while True:
            self.drain()
            if self._more:
                await anyio.lowlevel.checkpoint()
            else:
                await anyio.wait_readable(fd)

    def _readable(self) -> None:
        """The FD fired (asyncio): dispatch; past a batch, let other work run first."""
        self.drain()
        if self._more and self._loop is not None:
            self._loop.call_soon(self._readable, context=self._context)

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket; ``linger_ms`` lets already-queued messages go out first."""
        if not self.closed:
            self.closed = True
            self.sock.close(linger=linger_ms)
