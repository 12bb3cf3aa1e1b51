"""The socket reader (transport/sockets.py) on asyncio and trio: a ZeroMQ socket's FD is
edge-triggered, so whatever consumes the edge must read until no input is left, or make
sure the rest is read soon; no path may leave input unread with nothing to wake it."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import zmq

from bls.transport.sockets import BATCH, AsyncSocket

pytestmark = pytest.mark.anyio

_endpoints = itertools.count()


@asynccontextmanager
async def reader(
    on_message: Callable[[list[Any]], None],
) -> AsyncIterator[tuple[AsyncSocket, zmq.Socket[Any]]]:
    """An AsyncSocket (a ROUTER, its reader running) and a plain DEALER peer, inproc."""
    ctx = zmq.Context.instance()
    endpoint = f"inproc://test-sockets-{next(_endpoints)}"
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    peer = ctx.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.setsockopt(zmq.SNDHWM, 0)
    peer.connect(endpoint)
    sock = AsyncSocket(router, on_message)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sock.run)
            await anyio.sleep(0.01)  # the reader is waiting on the FD now
            yield sock, peer
            tg.cancel_scope.cancel()
    finally:
        sock.close()
        peer.close()


class Inbox(list[Any]):
    """The messages a socket handed over; :meth:`holds` waits (bounded) for ``n`` of them."""

    def __init__(self) -> None:
        super().__init__()
        self._wanted = 0
        self._arrived = anyio.Event()

    def append(self, frames: Any) -> None:
        super().append(frames)
        if len(self) == self._wanted:
            self._arrived.set()

    async def holds(self, n: int) -> None:
        if len(self) < n:
            self._wanted, self._arrived = n, anyio.Event()
            with anyio.fail_after(5):
                await self._arrived.wait()


@pytest.mark.parametrize("n", [BATCH * 4 + 3])
async def test_a_pump_that_ends_a_batch_outside_the_reader_still_reads_the_rest(n: int) -> None:
    got = Inbox()
    async with reader(got.append) as (sock, peer):
        for i in range(n):  # queued at once (inproc), with nothing awaited in between
            peer.send(str(i).encode())
        sock.pump()  # e.g. a lost connection reading its last replies: takes the FD's edge
        await got.holds(n)
    assert [int(frames[1].bytes) for frames in got] == list(range(n))


async def test_a_send_that_finds_input_waiting_leaves_none_unread() -> None:
    n = BATCH * 4 + 3
    got = Inbox()
    async with reader(got.append) as (sock, peer):
        peer.send(b"hi")
        await got.holds(1)
        identity = got[0][0].bytes
        for i in range(n):
            peer.send(str(i).encode())
        sock.send([identity, b"reply"])  # a sender's check for input takes the edge
        await got.holds(n + 1)
    assert len(got) == n + 1


async def test_a_handler_that_raises_loses_only_its_own_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    got = Inbox()

    def on_message(frames: list[Any]) -> None:
        value = int(frames[1].bytes)
        if value % 7 == 0:
            raise RuntimeError("a bug in one message's handling")
        got.append(value)

    n = BATCH * 2
    async with reader(on_message) as (_, peer):
        for i in range(n):
            peer.send(str(i).encode())
        await got.holds(n - len(range(0, n, 7)))
    failed = [r for r in caplog.records if "a message's handler failed" in r.getMessage()]
    assert len(failed) == len(range(0, n, 7))
    assert got == [i for i in range(n) if i % 7]
