"""Which frontend process answered (tests/e2e/test_processes.py)."""

import os

import bls


@bls.script
async def whoami(req: dict) -> dict:
    return {"pid": os.getpid()}
