"""A run of `n` calls to `work`, untyped (the README's style) and typed, for
tests/test_resume.py."""

from counting import Out, Step

import bls
from bls import stage


@bls.script
async def plain(req):
    return [await stage("work", {"i": i, "tag": req["tag"]}) for i in range(req["n"])]


class Job(bls.Message):
    n: int
    tag: str


work = bls.Stage("work", Step, Out)


@bls.script
async def typed(req: Job) -> list[Out]:
    return [await work(Step(i=i, tag=req.tag)) for i in range(req.n)]
