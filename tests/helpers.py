"""Small workers and messages shared by the unit tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio

import bls


class Text(bls.Message):
    text: str


class Shout(bls.Message):
    text: str
    loud: bool = True


class Probe:
    """Records what a worker saw, for assertions: started, finished, cancelled."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.cancelled = 0
        self.finished = 0
        self.calls = 0

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


probe = Probe()


async def upper(req: Text) -> Shout:
    return Shout(text=req.text.upper())


async def untyped(req):  # type: ignore[no-untyped-def]
    return Shout(text=req["text"])


async def slow(req: Text) -> Text:
    probe.calls += 1
    probe.started.set()
    try:
        await anyio.sleep(30)
    except anyio.get_cancelled_exc_class():
        probe.cancelled += 1
        raise
    finally:
        probe.finished += 1
    return req


async def fails(req: Text) -> Text:
    raise ValueError(f"cannot handle {req.text!r}")


async def tokens(req: Text) -> AsyncIterator[str]:
    try:
        for word in req.text.split():
            yield word + " "
    finally:
        probe.finished += 1


async def endless(req: Text) -> AsyncIterator[int]:
    i = 0
    try:
        while True:
            probe.started.set()
            yield i
            i += 1
            await anyio.sleep(0.001)
    except anyio.get_cancelled_exc_class():
        probe.cancelled += 1
        raise
    finally:
        probe.finished += 1
