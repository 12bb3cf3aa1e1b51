"""A script whose stage prints to stdout at every level a library might: Python's print,
the file descriptor itself, and a child process that inherits it."""

import os
import subprocess
import sys

import bls


async def chatty(text: str) -> str:
    print("progress from print()")
    sys.stdout.flush()
    os.write(1, b"progress written to fd 1\n")
    child = [sys.executable, "-c", "print('progress from a child process')"]
    subprocess.run(child, check=True)  # noqa: ASYNC221 - a library's blocking set-up step
    return text.upper()


@bls.script
async def noisy(req: str) -> str:
    return await bls.stage("chatty", req)
