"""One turn of a chat, streamed through the `generator` stage (bench/prefix_routing.py):
the items as the engine sends them, the first saying how many prompt tokens its prefix
cache held."""

import bls
from bls import stage


@bls.script
async def turn(req: dict):
    async for item in stage.stream(
        "generator", {"messages": req["messages"], "max_tokens": 48, "ignore_eos": True}
    ):
        yield item
