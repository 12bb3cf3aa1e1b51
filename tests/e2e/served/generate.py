"""A script over a vLLM `generator` stage, for the vLLM tests: streams the generation."""

from collections.abc import AsyncIterator

import anyio

import bls
from bls.models.vllm import GenerateItem, GenerateRequest

generator = bls.StreamStage("generator", GenerateRequest, GenerateItem)


class Prompt(bls.Message):
    text: str
    max_tokens: int = 16
    seed: int = 0
    pause: float = 0.0  # seconds between items: a slow reader (the engine waits for it)


@bls.script
async def generate(req: Prompt) -> AsyncIterator[GenerateItem]:
    ask = GenerateRequest(
        prompt=req.text, max_tokens=req.max_tokens, seed=req.seed, ignore_eos=True
    )
    async for item in generator(ask):
        yield item
        if req.pause:
            await anyio.sleep(req.pause)
