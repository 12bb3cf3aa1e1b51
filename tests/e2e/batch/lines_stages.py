"""The `upper` stage of lines.py: notes each call as a line in $BLS_BATCH_CALLS, fails
when asked, and holds the word "hold" while the file $BLS_BATCH_HOLD exists (60 s at
most), so that a test can stop a batch with a line under way."""

import os

import anyio

import bls


async def upper(req: dict) -> dict:
    async with await anyio.open_file(os.environ["BLS_BATCH_CALLS"], "a") as calls:
        await calls.write(req["word"] + "\n")
    if req["fail"]:
        raise bls.StageError("upper", "invalid_response", f"cannot shout {req['word']!r}")
    hold = anyio.Path(os.environ.get("BLS_BATCH_HOLD", "/nonexistent"))
    with anyio.move_on_after(60):
        # (another process's file: nothing to wait on but polling)
        while req["word"] == "hold" and await hold.exists():  # noqa: ASYNC110
            await anyio.sleep(0.01)
    return {"word": req["word"].upper()}
