"""A script for bls batch's tests (tests/e2e/test_batch.py), in the README's untyped style:
each request through the `upper` stage (lines_stages.py), which notes every call."""

import bls
from bls import stage


class Line(bls.Message):
    word: str
    fail: bool = False


@bls.script
async def shout(req: Line) -> dict:
    upper = await stage("upper", {"word": req.word, "fail": req.fail})
    return {"word": upper["word"], "length": len(req.word)}


@bls.script
async def letters(req: Line):
    upper = await stage("upper", {"word": req.word, "fail": req.fail})
    for letter in upper["word"]:
        yield letter
