"""bench/compare_peers.py's bls contender: `bls worker` processes and a runtime in this process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
sys.path[:0] = [str(BENCH), str(HERE)]
from _procs import spawn  # noqa: E402
from _stages import Blob  # noqa: E402
from measure import measure as run  # noqa: E402

import bls  # noqa: E402

BLS = str(Path(sys.executable).with_name("bls"))
PAYLOAD = Blob(data=b"x" * 100)


async def measure(echo: str, chain: str, calls: int, inflight: int) -> dict[str, float]:
    async with bls.Runtime({"echo": echo, "first": chain}):
        return await run(
            lambda: bls.stage("echo", PAYLOAD), lambda: bls.stage("first", PAYLOAD), calls, inflight
        )


def main() -> None:
    calls, inflight = int(sys.argv[1]), int(sys.argv[2])
    procs: list[subprocess.Popen[str]] = []
    try:
        args = ["--listen", "tcp://127.0.0.1:0", "--log-level", "error"]
        echo_proc, echo = spawn([BLS, "worker", f"{BENCH}/_stages.py:echo", *args])
        second_proc, second = spawn(
            [BLS, "worker", f"{BENCH}/_stages.py:echo", "--stage", "second", *args]
        )
        first_proc, first = spawn(
            [BLS, "worker", f"{HERE}/chain.py:first", "--bind", f"second={second}", *args]
        )
        procs += [echo_proc, second_proc, first_proc]
        result = anyio.run(measure, echo, first, calls, inflight)  # asyncio
        print(json.dumps(result), flush=True)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
