"""What bench/structured.py serves: the same question asked for a typed Verdict
(`bls.ask` under its JSON schema) and for free text, on the generator stage.

    bls serve bench/serving/typed.py --config CONFIG      (CONFIG binds `generator`)
"""

from typing import Annotated

import msgspec

import bls


class Verdict(bls.Message):
    ok: bool
    score: Annotated[int, msgspec.Meta(ge=0, le=10)]
    reason: Annotated[str, msgspec.Meta(max_length=48)]


class Question(bls.Message):
    text: str
    seed: int
    max_tokens: int = 96


@bls.script
async def typed(req: Question) -> Verdict:
    verdict: Verdict = await bls.ask(
        "generator", req.text, Verdict, seed=req.seed, temperature=1.0, max_tokens=req.max_tokens
    )
    return verdict


@bls.script
async def free(req: Question) -> str:
    text: str = await bls.ask(
        "generator", req.text, seed=req.seed, temperature=1.0, max_tokens=req.max_tokens
    )
    return text
