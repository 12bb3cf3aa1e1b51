"""bench/peers.py's bls contender: `bls worker` processes and a runtime in this process."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
sys.path.insert(0, str(BENCH))
from _procs import spawn  # noqa: E402
from _stages import Blob  # noqa: E402

import bls  # noqa: E402

BLS = str(Path(sys.executable).with_name("bls"))
PAYLOAD = Blob(data=b"x" * 100)


async def measure(echo: str, chain: str, calls: int, inflight: int) -> dict[str, float]:
    async with bls.Runtime({"echo": echo, "first": chain}):
        for _ in range(200):
            await bls.stage("echo", PAYLOAD)
        lat = []
        for _ in range(calls):
            t = time.perf_counter()
            await bls.stage("echo", PAYLOAD)
            lat.append(time.perf_counter() - t)
        lat.sort()

        async def lane(n: int) -> None:
            for _ in range(n):
                await bls.stage("first", PAYLOAD)

        await lane(100)
        per = max(1, calls // inflight)
        t = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(inflight):
                tg.start_soon(lane, per)
        rps = per * inflight / (time.perf_counter() - t)
    return {
        "unary_p50_us": statistics.median(lat) * 1e6,
        "unary_p99_us": lat[int(len(lat) * 0.99)] * 1e6,
        "chain_rps": rps,
    }


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
        print(json.dumps(anyio.run(measure, echo, first, calls, inflight)), flush=True)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
