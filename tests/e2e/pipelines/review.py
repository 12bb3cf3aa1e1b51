"""A pipeline exercising every control-flow primitive, bound to stages in review_stages.py."""

from collections.abc import AsyncIterator

import bls
from bls import stage


class Doc(bls.Message):
    words: list[str]
    rounds: int = 3
    patience: float = 5.0


class Report(bls.Message):
    scores: list[int]
    best: str
    fastest: str
    rounds_used: int
    timed_out: bool


@bls.script
async def review(req: Doc) -> Report:
    scores = await bls.map(lambda w: stage("score", w), req.words, limit=2)
    best = req.words[scores.index(max(scores))] if scores else ""
    fastest = await bls.race(stage("slow_echo", best), stage("fast_echo", best))
    rounds = 0
    for rounds in range(1, req.rounds + 1):
        a, b = await bls.gather(stage("score", best), stage("score", fastest))
        if a == b and rounds >= 2:
            break
    timed_out = False
    try:
        async with bls.timeout(req.patience):
            await stage("slow_echo", "zzz")
    except bls.DeadlineExceeded:
        timed_out = True
    return Report(
        scores=scores, best=best, fastest=fastest, rounds_used=rounds, timed_out=timed_out
    )


@bls.script(name="spell")
async def spell_out(req: Doc) -> AsyncIterator[str]:
    for word in req.words:
        async for ch in stage.stream("letters", word):
            yield ch
