"""What ``--record`` costs the serving process, without HTTP or a load generator: the
frontend's ASGI app driven in process, concurrency 16, recording against not.

    python bench/recording_cost.py [--requests 2000] [--rounds 40] [--scripts inline noop]
    python bench/recording_cost.py --instructions       (under valgrind: deterministic)
    python bench/recording_cost.py --instructions --http (the same, `bls serve` over HTTP)

``bench/frontend.py --recording`` measures the same over real HTTP, where the load
generator, the server and the record writer share this machine's two cores and the
figures drift; here only the serving process's own CPU time is counted (the writer
process appends on the other core, and its CPU is given apart). Rounds alternate the
two; printed: µs of CPU per request for each, the difference, and the ratio, as
median [min-max] over rounds.

CPU time over short rounds on a shared two-core VM still drifts by tens of percent from
round to round. ``--instructions`` counts instead: each side runs alone under valgrind's
callgrind, at two numbers of requests, and the difference gives the instructions a
request costs, the same from run to run within a few hundred (the writer process is
not counted: it runs on the other core). With ``--http`` the counted process is a real
``bls serve`` (Uvicorn, every stage in process) under callgrind, driven over HTTP by
`bls bench -c 16` running natively: the whole request's instructions, HTTP included, so
the ratio is recording's share of what the server spends on a request.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
from _procs import BLS, SERVING_APP, spread

from bls.record_writer import RecordWriter
from bls.scriptfile import ScriptFile
from bls.serve.app import Frontend

CONCURRENCY = 16
BINDS = {"local": "echo", "echo": "echo", "tick": "tick"}  # every stage in process
BODY = msgspec.json.encode({"text": "hello"})


async def drive(frontend: Frontend, path: str, requests: int) -> float:
    """CPU seconds of this process for ``requests`` requests, ``CONCURRENCY`` at once."""
    scope = {"type": "http", "method": "POST", "path": path, "headers": []}
    left = requests

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise RuntimeError(f"{path} answered {message['status']}")

    async def client() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await frontend(scope, receive, send)

    began = time.process_time()
    async with anyio.create_task_group() as tg:
        for _ in range(CONCURRENCY):
            tg.start_soon(client)
    return time.process_time() - began


def _children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


async def measure(script: str, rounds: int, requests: int, folder: str) -> dict[str, list[float]]:
    """Per round, µs of this process's CPU a request, plain and recording (the two
    frontends open side by side, taking turns), and the writer's (for its round's
    records, read once it has exited)."""
    binds = [f"{name}={SERVING_APP}:{fn}" for name, fn in BINDS.items()]
    path = f"/v1/scripts/{script}"
    got: dict[str, list[float]] = {"plain": [], "recording": []}
    plain_app = ScriptFile(SERVING_APP, binds=binds)
    recording_app = ScriptFile(SERVING_APP, binds=binds, record=True)
    writer = RecordWriter(folder, recording_app.path)
    async with plain_app.runtime() as plain_rt, recording_app.runtime() as recording_rt:
        plain = Frontend(plain_app.entries, plain_rt)
        recording = Frontend(recording_app.entries, recording_rt, records=writer)
        children = _children_cpu()
        async with writer:
            for frontend in (plain, recording):
                await drive(frontend, path, 2000)  # warm
            for _ in range(rounds):
                for name, frontend in (("plain", plain), ("recording", recording)):
                    got[name].append(await drive(frontend, path, requests) / requests * 1e6)
        assert writer.dropped == 0 and writer.lost == 0, "records were lost"
        got["writer"] = [(_children_cpu() - children) / (rounds * requests + 2000) * 1e6]
    return got


async def one(script: str, record: bool, requests: int, folder: str) -> None:
    """``requests`` requests through one frontend, recording or not (what
    ``--instructions`` counts)."""
    binds = [f"{name}={SERVING_APP}:{fn}" for name, fn in BINDS.items()]
    app = ScriptFile(SERVING_APP, binds=binds, record=record)
    async with contextlib.AsyncExitStack() as stack:
        writer = RecordWriter(folder, app.path) if record else None
        if writer is not None:
            await stack.enter_async_context(writer)
        runtime = await stack.enter_async_context(app.runtime())
        await drive(
            Frontend(app.entries, runtime, records=writer), f"/v1/scripts/{script}", requests
        )


def per_request(stderr_at: Callable[[int], str]) -> float:
    """Instructions a request: callgrind's totals (from the stderr that ``stderr_at(n)``
    gives for ``n`` requests) at 500 and 2,500 requests, their difference over 2,000."""
    counts = []
    for requests in (500, 2500):
        found = re.search(r"Collected : (\d+)", stderr_at(requests))
        if found is None:
            raise RuntimeError("callgrind printed no total")
        counts.append(int(found.group(1)))
    return (counts[1] - counts[0]) / 2000


def instructions(script: str, record: bool) -> float:
    """Instructions a request, the frontend's ASGI app driven in process."""

    def stderr_at(requests: int) -> str:
        argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable]
        argv += [__file__, "--one", script, str(int(record)), str(requests)]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stderr

    return per_request(stderr_at)


def http_instructions(script: str, record: bool) -> float:
    """Instructions a request costs ``bls serve`` over HTTP, counted by callgrind in the
    server alone (not its record writer)."""

    def stderr_at(requests: int) -> str:
        with tempfile.TemporaryDirectory() as folder:
            binds = [f"--bind={name}={SERVING_APP}:{fn}" for name, fn in BINDS.items()]
            argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={folder}/out"]
            argv += [sys.executable, BLS, "serve", SERVING_APP, "--port", "0", *binds]
            argv += ["--no-access-log", "--log-level", "warning"]
            argv += ["--record", folder] if record else []
            server = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            try:
                assert server.stdout is not None
                url = next(line.split()[1] for line in server.stdout if line.startswith("ready "))
                load = [BLS, "bench", url, "--entry", script, "-c", str(CONCURRENCY)]
                load += ["-n", str(requests), "--input", BODY.decode(), "--json"]
                subprocess.run(load, capture_output=True, check=True, timeout=600)
                server.send_signal(signal.SIGTERM)
                return server.communicate(timeout=300)[1]
            finally:
                if server.poll() is None:
                    server.kill()
                    server.wait()

    return per_request(stderr_at)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="a round's, each")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--scripts", nargs="+", default=["inline", "noop"])
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--instructions", action="store_true", help="count, under valgrind")
    parser.add_argument(
        "--http", action="store_true", help="with --instructions: bls serve, over HTTP"
    )
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # SCRIPT RECORD REQUESTS
    args = parser.parse_args()
    if args.one:
        with tempfile.TemporaryDirectory() as folder:
            script, record, requests = args.one
            anyio.run(one, script, record == "1", int(requests), folder, backend=args.backend)
        return
    if args.instructions:
        if shutil.which("valgrind") is None:
            sys.exit("--instructions needs valgrind (apt-get install valgrind)")
        os.environ["PYTHONHASHSEED"] = "0"  # (the same dicts each run)
        print("| script | plain instructions | recording instructions | difference | ratio |")
        print("| --- | --- | --- | --- | --- |")
        count = http_instructions if args.http else instructions
        for script in args.scripts:
            plain, recording = count(script, False), count(script, True)
            print(
                f"| {script} | {plain:,.0f} | {recording:,.0f} | {recording - plain:,.0f} "
                f"| {recording / plain:.2f} |"
            )
        return
    print("| script | plain µs | recording µs | difference µs | ratio | writer µs |")
    print("| --- | --- | --- | --- | --- | --- |")
    for script in args.scripts:
        with tempfile.TemporaryDirectory() as folder:
            got = anyio.run(
                measure, script, args.rounds, args.requests, folder, backend=args.backend
            )
        plain, recording = got["plain"], got["recording"]
        diffs = [r - p for p, r in zip(plain, recording, strict=True)]
        ratios = [r / p for p, r in zip(plain, recording, strict=True)]
        print(
            f"| {script} | {statistics.median(plain):.1f} | {statistics.median(recording):.1f} "
            f"| {spread(diffs, '.1f')} | {spread(ratios)} | {got['writer'][0]:.1f} |"
        )


if __name__ == "__main__":
    main()
