"""Two routers behind the router interface: scripts that call whichever worker is bound.

Each is a script, so it can be served as a stage in process or by `bls worker`.
"""

from collections.abc import AsyncIterator

import anyio
from contracts import Prompt, Token, worker

import bls


@bls.script
async def fast(req: Prompt) -> AsyncIterator[Token]:
    """Pass the worker's tokens straight on."""
    async for token in worker(req):
        yield token


@bls.script
async def slow(req: Prompt) -> AsyncIterator[Token]:
    """Pace the worker's tokens, 20 ms apart."""
    async for token in worker(req):
        await anyio.sleep(0.02)
        yield token
