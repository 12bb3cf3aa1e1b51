"""Background runs under test (tests/e2e/test_runs.py): the same steps untyped (the
README's style), typed, and streamed, each step a call to the remote `slow` stage; and a
chat entry for the batches of tests/e2e/test_batches.py."""

from slow import Step

import bls
from bls import stage


@bls.script
async def steps(req):
    out = []
    for step in range(req["steps"]):
        out.append(await stage("slow", {"run": req["n"], "step": step, **req.get("extra", {})}))
    return {"n": req["n"], "out": out}


class Job(bls.Message):
    n: int
    steps: int = 3


class Done(bls.Message):
    n: int
    out: list[str]


slow = bls.Stage("slow", Step, str)


@bls.script
async def typed_steps(req: Job) -> Done:
    out = [await slow(Step(run=req.n, step=step)) for step in range(req.steps)]
    return Done(n=req.n, out=out)


@bls.script
async def items(req):
    for step in range(req["steps"]):
        yield {"item": await stage("slow", {"run": req["n"], "step": step, **req.get("extra", {})})}


@bls.script(openai="chat", model="tiny")
async def chat(req: bls.ChatRequest):
    """A chat turn for the batch tests (tests/e2e/test_batches.py): the last message is
    "N" or "N SECONDS", answered by one remote `slow` call (run N, step 0, that long)."""
    words = str(req.messages[-1].content).split()
    sleep = float(words[1]) if len(words) > 1 else None
    yield f"line {await stage('slow', {'run': int(words[0]), 'step': 0, 'sleep': sleep})}"
