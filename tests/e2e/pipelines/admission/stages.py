"""The stage the admission tests hold slots with: it waits ``ms`` and says which
request it was, at what priority its call came, and when it finished."""

from __future__ import annotations

import time

import anyio

import bls


class Hold(bls.Message):
    ms: int = 0
    tag: str = ""


class Held(bls.Message):
    tag: str
    priority: int
    done: float  # time.monotonic() in the process that ran it


async def hold(req: Hold) -> Held:
    await anyio.sleep(req.ms / 1000)
    return Held(tag=req.tag, priority=bls.current_priority(), done=time.monotonic())
