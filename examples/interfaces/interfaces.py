"""interfaces: a frontend composed from interchangeable routers and workers (seed 002).

    bls run examples/interfaces/interfaces.py --input @examples/interfaces/request.json
    bls run examples/interfaces/interfaces.py --input @examples/interfaces/request.json \
        --config examples/interfaces/slow-mixed.toml

The script depends on the router *interface* (contracts.py); each router depends on the
worker interface. Which router and which worker serve a request is configuration alone:
bls.toml (fast router, shouting worker) and fast-mixed.toml, slow-shout.toml and
slow-mixed.toml beside it. Any of them can run in its own `bls worker` process instead.
"""

from collections.abc import AsyncIterator

from contracts import Prompt, Token, router

import bls


@bls.script
async def generate(req: Prompt) -> AsyncIterator[Token]:
    async for token in router(req):
        yield token
