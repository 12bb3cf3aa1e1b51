"""Entries for the admission tests: one call of `hold` at the request's priority, and
one at a priority the script sets."""

from stages import Held, Hold

import bls


@bls.script
async def held(req: Hold) -> Held:
    return await bls.stage("hold", req)


@bls.script
async def background(req: Hold) -> Held:
    with bls.priority(-5):
        return await bls.stage("hold", req)
