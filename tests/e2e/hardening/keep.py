"""Entries for the hardening tests: a value passed through a stage, and a caller whose
event loop blocks while its remote call runs."""

import anyio
from stages import Kept, Stall, block

import bls

keep_stage = bls.Stage("keep", Kept, Kept)
sleep_stage = bls.Stage("sleep", Stall, Kept)


@bls.script
async def keep(req: Kept) -> Kept:
    return await keep_stage(req)


@bls.script
async def stall(req: Stall) -> Kept:
    async def blocked() -> None:
        await anyio.sleep(0.3)  # the remote call is under way
        block(req.block)

    result, _ = await bls.gather(sleep_stage(req), blocked())
    return result
