"""agent: an LLM that picks tools until it can answer, typed end to end.

    bls run examples/agent/agent.py --input @examples/agent/request.json
    bls serve examples/agent/agent.py

Each step asks the LLM for a typed reply (`bls.ask` with `tools=`): a `bls.ToolCall` of
one of the tools offered, its arguments already a `Calc` or a `Lookup`, or the `Reply`.
Structured outputs force that choice, so any model — the tiny random one included —
names a tool that exists with arguments that decode, or answers. A tool is an ordinary
stage (tools.py; bls.toml binds them inline); its result goes back to the LLM as a `tool`
message. The loop ends on an answer, on the step budget, or when too little of the
request's deadline is left for another step (`bls.remaining()`); cancelling the request
cancels the generation or the tool in flight with it.

With the tiny model the tool choices and answers are random, but always well formed;
point the `llm` stage's `model` option at a local instruction-tuned model for real ones.
"""

from typing import Annotated

import msgspec

import bls
from bls import stage

SYSTEM = "Answer the question. Call calculator to compute, lookup to recall a fact."
# What one more step needs at the least: with less of the deadline left, stop.
STEP_S = 0.5
# What the model may write in a string: printable ASCII, a token or less a character for
# the tiny model, so that a step's prompt and reply fit its 512-token context whatever it
# writes (drop the pattern for a real model and its own context).
ASCII = "^[ -~]*$"
# Tool exchanges the LLM sees besides the question (the older ones drop out), so that the
# conversation stays within a small model's context however many steps it takes.
KEPT = 2


class Question(bls.Message):
    question: str
    max_steps: int = 6
    seed: int | None = None  # the engine's sampling: the same seed, the same run


class Calc(bls.Message):
    """Evaluate an arithmetic expression, e.g. "12 * (3 + 4)"."""

    expression: Annotated[str, msgspec.Meta(max_length=32, pattern=ASCII)]


class Number(bls.Message):
    value: float | None = None
    error: str | None = None


class Lookup(bls.Message):
    """Look up a fact by its key, e.g. "moons of mars"."""

    key: Annotated[str, msgspec.Meta(max_length=24, pattern=ASCII)]


class Fact(bls.Message):
    value: str | None = None
    error: str | None = None


class Reply(bls.Message):
    answer: Annotated[str, msgspec.Meta(max_length=64, pattern=ASCII)]


class Step(bls.Message):
    tool: str
    arguments: dict[str, str]
    result: dict[str, str | float | None]


class Outcome(bls.Message):
    answer: str | None
    steps: list[Step]
    ended: str  # "answer", "step budget" or "deadline"


calculator = bls.Stage("calculator", Calc, Number)
lookup = bls.Stage("lookup", Lookup, Fact)


@bls.script
async def agent(req: Question) -> Outcome:
    question = [
        bls.ChatMessage(role="system", content=SYSTEM),
        bls.ChatMessage(role="user", content=req.question),
    ]
    exchanges: list[bls.ChatMessage] = []  # each tool call and its result
    steps: list[Step] = []
    for n in range(req.max_steps):
        left = bls.remaining()  # None: no deadline
        if left is not None and left < STEP_S:
            return Outcome(answer=None, steps=steps, ended="deadline")
        seed = None if req.seed is None else req.seed + n
        messages = question + exchanges[-2 * KEPT :]
        reply = await bls.ask("llm", messages, Reply, tools=[calculator, lookup], seed=seed)
        if not isinstance(reply, bls.ToolCall):
            return Outcome(answer=reply.answer, steps=steps, ended="answer")
        result = await stage(reply.name, reply.arguments)
        steps.append(
            Step(
                tool=reply.name,
                arguments=msgspec.to_builtins(reply.arguments),
                result=msgspec.to_builtins(result),
            )
        )
        exchanges += [reply.message(), reply.result(result)]
    return Outcome(answer=None, steps=steps, ended="step budget")
