"""The `slow` stage of tests/e2e/test_runs.py: each call noted as it starts (a line
`start RUN STEP` in $BLS_SLOW_CALLS), and as it is cancelled (`cancel RUN STEP`), then
an answer after `sleep` seconds (the request's, else $BLS_SLOW_S)."""

import os

import anyio

import bls


class Step(bls.Message):
    run: int
    step: int
    sleep: float | None = None


async def slow(req: Step) -> str:
    await _note("start", req)
    try:
        await anyio.sleep(req.sleep or float(os.environ.get("BLS_SLOW_S", "0.2")))
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await _note("cancel", req)
        raise
    return f"{req.run}:{req.step}"


async def _note(what: str, req: Step) -> None:
    async with await anyio.open_file(os.environ["BLS_SLOW_CALLS"], "a") as calls:
        await calls.write(f"{what} {req.run} {req.step}\n")
