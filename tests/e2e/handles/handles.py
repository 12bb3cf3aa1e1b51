"""A script that hands an in-process stage an object no encoder takes (a file handle, a
model, a lock: what only an inline stage can be given), and gets one back; untyped, as the
README writes scripts, and typed. Recording must leave such values out of the record,
never fail the request (tests/test_recording.py, tests/e2e/test_record.py)."""

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
