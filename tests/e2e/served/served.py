"""The script the `bls serve` tests serve: unary, streaming, failing, fan-out and chat
entries over the marker-writing stages of ../pipelines/remote_stages.py."""

import os
from collections.abc import AsyncIterator

import anyio

import bls

# A file name that is not UTF-8, as Python reads it (with a lone surrogate): see
# remote_stages.LATIN1_NAME.
LATIN1_NAME = os.fsdecode(b"photo-\xe9.jpg")


class Job(bls.Message):  # the shape of remote_stages.Mark
    marker: str = ""
    seconds: float = 30.0
    count: int = 1_000_000


class Who(bls.Message):  # the shape of remote_stages.Served
    pid: int
    text: str


class Ask(bls.Message):
    text: str
    marker: str = ""
    seconds: float = 0.0
    n: int = 3


class Reply(bls.Message):
    text: str
    pid: int


class Tick(bls.Message):
    i: int


class Part(bls.Message):
    name: str
    n: int


class Order(bls.Message):
    customer: str
    parts: list[Part]


whoami = bls.Stage("whoami", Job, Who)
slow = bls.Stage("slow", Job, Who)
boom = bls.Stage("boom", Job, Who)
ticks = bls.StreamStage("ticks", Job, int)


@bls.script
async def greet(req: Ask) -> Reply:
    """Say hello from whichever process serves the whoami stage."""
    who = await whoami(Job(marker=req.marker))
    return Reply(text=f"hello {req.text}", pid=who.pid)


@bls.script
async def wait(req: Ask) -> Reply:
    who = await slow(Job(marker=req.marker, seconds=req.seconds))
    return Reply(text="waited", pid=who.pid)


@bls.script
async def count(req: Ask) -> AsyncIterator[Tick]:
    async for i in ticks(Job(marker=req.marker, seconds=req.seconds, count=req.n)):
        yield Tick(i=i)
        if req.text == "latin-1":
            raise RuntimeError(f"cannot read {LATIN1_NAME}")


@bls.script
async def first(req: Ask) -> Tick:
    async for i in ticks(Job(marker=req.marker, seconds=req.seconds, count=req.n)):
        return Tick(i=i)  # leaves the stream without closing it, as `break` does
    return Tick(i=-1)


@bls.script
async def fail(req: Ask) -> Reply:
    who = await boom(Job(marker=req.text))
    return Reply(text="unreachable", pid=who.pid)


@bls.script
async def oops(req: Ask) -> Reply:
    if req.text == "latin-1":
        raise RuntimeError(f"cannot read {LATIN1_NAME}")
    raise RuntimeError("a bug in the script")


@bls.script
async def total(req: Order) -> int:
    return sum(part.n for part in req.parts)


@bls.script
async def fanout(req: Ask) -> Reply:
    """Two 50 ms calls side by side, then a race whose slow loser is cancelled."""
    first, second = await bls.gather(slow(Job(seconds=0.05)), slow(Job(seconds=0.05)))
    winner = await bls.race(slow(Job(marker=req.marker, seconds=30)), _once_started(req.marker))
    return Reply(text=f"{first.pid} {second.pid}", pid=winner.pid)


async def _once_started(marker: str) -> Who:
    """whoami, once the slow call marked ``marker`` has started in its worker (with no
    marker, at once): cancelled while it runs, that call's worker span comes back with
    the cancel's acknowledgement, where one cancelled before it started has none."""
    started = anyio.Path(marker + ".started")
    while marker:  # (polled: the mark is another process's; the request's deadline bounds it)
        if await started.exists():
            break
        await anyio.sleep(0.005)
    return await whoami(Job())


@bls.script(openai="chat", model="tiny")
async def chat(req: bls.ChatRequest) -> AsyncIterator[str]:
    """Echo the last message back, word by word, in capitals."""
    who = await whoami(Job())
    last = req.messages[-1].content
    text = last if isinstance(last, str) else ""
    for word in text.split():
        yield word.upper() + " "
    yield f"({who.text})"
