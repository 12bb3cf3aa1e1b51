"""examples/agent's lookup, noting each call as a line in the file $BLS_AGENT_CALLS, so
that a test can act mid-run (tests/e2e/test_agent.py)."""

import os
import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "agent"))

from agent import Fact, Lookup
from tools import lookup as look_up


async def lookup(req: Lookup) -> Fact:
    async with await anyio.open_file(os.environ["BLS_AGENT_CALLS"], "a") as calls:
        await calls.write(f"{req.key!r}\n")
    return await look_up(req)
