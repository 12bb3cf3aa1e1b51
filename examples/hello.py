"""hello: draft a reply, let a judge review it, and retry until it is accepted.

    bls run examples/hello.py --input '{"text": "hi"}'

The two stages are bound in examples/bls.toml to the functions in hello_stages.py;
move either out of process with `--bind judge=tcp://127.0.0.1:5555` and nothing here
changes.
"""

import bls


class Ask(bls.Message):
    text: str
    max_attempts: int = 3


class Draft(bls.Message):
    prompt: str
    attempt: int


class Verdict(bls.Message):
    ok: bool
    reason: str


# One more draft and judgement take about this long: with less of the request's deadline
# left, answer with the last draft rather than run out of time with nothing to send.
ATTEMPT_S = 0.1


class Answer(bls.Message):
    text: str
    attempts: int
    accepted: bool
    reasons: list[str]


draft = bls.Stage("draft", Draft, str)
judge = bls.Stage("judge", str, Verdict)


@bls.script
async def hello(req: Ask) -> Answer:
    reasons: list[str] = []
    text = ""
    for attempt in range(1, req.max_attempts + 1):
        left = bls.remaining()  # None: no deadline
        if attempt > 1 and left is not None and left < ATTEMPT_S:
            reasons.append("out of time")
            return Answer(text=text, attempts=attempt - 1, accepted=False, reasons=reasons)
        text = await draft(Draft(prompt=req.text, attempt=attempt))
        verdict = await judge(text)
        if verdict.ok:
            return Answer(text=text, attempts=attempt, accepted=True, reasons=reasons)
        reasons.append(verdict.reason)
    return Answer(text=text, attempts=req.max_attempts, accepted=False, reasons=reasons)
