"""The `work` stage of tests/test_resume.py: each call noted as a line in
$BLS_TEST_CALLS (its `i`), so a test counts what ran."""

import os

import anyio

import bls


class Step(bls.Message):
    i: int
    tag: str


class Out(bls.Message):
    i: int
    text: str


async def work(req: Step) -> Out:
    async with await anyio.open_file(os.environ["BLS_TEST_CALLS"], "a") as calls:
        await calls.write(f"{req.i}\n")
    return Out(i=req.i, text=f"{req.tag}{req.i}")
