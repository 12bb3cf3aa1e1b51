"""A script that hands an in-process stage an object no encoder takes (a file handle, a
model, a lock: what only an inline stage can be given), and gets one back; and one that
streams more than a record keeps (bls.recording.RECORD_BYTES). Untyped, as the README
writes scripts, and typed. Recording must leave such values out of the record, never
fail the request nor hold them all (tests/test_recording.py, tests/e2e/test_record.py)."""

from collections.abc import AsyncIterator
from typing import Any

import bls
from bls import stage


class Handle:
    pass


class Ask(bls.Message):
    handle: Any


class Got(bls.Message):
    kind: str


async def take(req):
    return {"kind": type(req["handle"]).__name__, "back": Handle()}


async def take_typed(req: Ask) -> Got:
    return Got(kind=type(req.handle).__name__)


typed_take = bls.Stage("take_typed", Ask, Got)


@bls.script
async def untyped(req: dict) -> dict:
    got = await stage("take", {"handle": Handle()})
    return {"kind": got["kind"], "back": type(got["back"]).__name__}


@bls.script
async def typed(req: dict) -> dict:
    got = await typed_take(Ask(handle=Handle()))
    return {"kind": got.kind}


class Flood(bls.Message):
    n: int


async def chunks(req):
    for _ in range(req["n"]):
        yield bytes(1 << 20)


async def chunks_typed(req: Flood) -> AsyncIterator[bytes]:
    for _ in range(req.n):
        yield bytes(1 << 20)


typed_chunks = bls.StreamStage("chunks_typed", Flood, bytes)


@bls.script
async def flood(req: dict):
    async for chunk in stage.stream("chunks", {"n": req["n"]}):
        yield chunk


@bls.script
async def flood_typed(req: dict) -> AsyncIterator[bytes]:
    async for chunk in typed_chunks(Flood(n=req["n"])):
        yield chunk
