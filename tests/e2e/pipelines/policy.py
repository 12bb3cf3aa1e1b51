"""The script the traffic policy tests serve: one call of the `work` stage
(bench/policy_stages.py), whose policy the test's configuration sets."""

import bls


class Job(bls.Message):
    n: int


class Done(bls.Message):
    n: int
    replica: str


work = bls.Stage("work", Job, Done)


@bls.script
async def one(req: Job) -> Done:
    return await work(req)
