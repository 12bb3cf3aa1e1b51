"""examples/agent under load, and cancelled mid-run: what is left running afterwards.

    python bench/agent.py [--requests 40] [--concurrency 4] [--cancels 20]

Serves examples/agent/agent.py with the tiny vLLM engine in process and each tool in a
`bls worker` (with --metrics-port), then:

1. `bls bench` with examples/agent/request.json (no seed: each run samples its own
   path): requests/s and latency;
2. the same load from this process with a seed per request, reading each outcome: steps
   per request and how the runs ended;
3. ``--cancels`` runs (1000 steps allowed) whose client leaves after a random 50-600 ms,
   then counts what is left: requests in flight (the server's /metrics), engine requests
   (each abort's log line says how many the engine still holds), tool calls in flight
   (each worker's /metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from _procs import BLS, spawn, stop_all

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "examples/agent/agent.py")
TOOLS = str(ROOT / "examples/agent/tools.py")


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


def serve(tool_binds: list[str]) -> tuple[subprocess.Popen[str], str, list[str]]:
    """`bls serve` of the agent; its stderr lines collected as they come."""
    proc = subprocess.Popen(
        [BLS, "serve", SCRIPT, "--port", "0", "--no-access-log", *tool_binds],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None and proc.stderr is not None
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
    for line in proc.stdout:
        if line.startswith("ready "):
            return proc, line.split()[1], lines
    raise RuntimeError("bls serve did not start:\n" + "".join(lines))


async def outcomes(url: str, requests: int, concurrency: int) -> tuple[float, list[dict]]:
    results: list[dict] = []
    todo = list(range(requests))
    async with httpx.AsyncClient(timeout=300) as client:

        async def worker() -> None:
            while todo:
                seed = todo.pop()
                body = {"question": "How many moons do Mars and Jupiter have?", "seed": seed}
                answer = await client.post(f"{url}/v1/scripts/agent", json=body)
                answer.raise_for_status()
                results.append(answer.json())

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started, results


def cancel_runs(url: str, count: int) -> int:
    """Start ``count`` runs and leave each 50-600 ms in; how many had answered by then."""
    target = urlsplit(url)
    rng = random.Random(0)
    answered = 0
    for seed in range(count):
        body = json.dumps({"question": "moons?", "max_steps": 1000, "seed": seed}).encode()
        with socket.create_connection((target.hostname, target.port), timeout=30) as sock:
            sock.sendall(
                b"POST /v1/scripts/agent HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            time.sleep(rng.uniform(0.05, 0.6))  # (a bench: where the cancel lands varies)
            sock.setblocking(False)
            try:
                answered += sock.recv(16).startswith(b"HTTP/1.1 ")
            except BlockingIOError:  # no answer yet: the run is cut short
                pass
    return answered


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--cancels", type=int, default=20)
    opts = ap.parse_args()

    from bls.models import tiny

    tiny.build()
    procs: list[subprocess.Popen[str]] = []
    try:
        binds, tool_metrics = [], {}
        for port, (name, function) in enumerate(
            (("calculator", "calculate"), ("lookup", "lookup"))
        ):
            metrics_port = 19311 + port
            worker, address = spawn(
                [BLS, "worker", f"{TOOLS}:{function}", "--listen", "tcp://127.0.0.1:0",
                 "--metrics-port", str(metrics_port)]
            )  # fmt: skip
            procs.append(worker)
            binds += ["--bind", f"{name}={address}"]
            tool_metrics[name] = f"http://127.0.0.1:{metrics_port}"
        server, url, lines = serve(binds)
        procs.append(server)
        asyncio.run(outcomes(url, 4, 2))  # warm up

        request = f"@{ROOT}/examples/agent/request.json"
        bench = subprocess.run(
            [BLS, "bench", url, "--entry", "agent", "--input", request,
             "-c", str(opts.concurrency), "-n", str(opts.requests), "--json"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        summary = json.loads(bench.stdout)
        elapsed, results = asyncio.run(outcomes(url, opts.requests, opts.concurrency))
        steps = [len(r["steps"]) for r in results]
        ended = collections.Counter(r["ended"] for r in results)
        tools = collections.Counter(s["tool"] for r in results for s in r["steps"])

        before = len([line for line in lines if "aborted bls-" in line])
        cancelled = metric(url, "bls_cancellations_total")
        answered = cancel_runs(url, opts.cancels)
        deadline = time.monotonic() + 60
        while metric(url, "bls_requests_in_flight") > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        aborts = [line for line in lines if "aborted bls-" in line][before:]
        held = [int(a.rsplit(":", 1)[1].strip(" )\n")) for a in aborts]
        left_requests = metric(url, "bls_requests_in_flight")
        cancels_seen = metric(url, "bls_cancellations_total") - cancelled
        left_tools = {n: metric(u, "bls_worker_inflight_calls") for n, u in tool_metrics.items()}
    finally:
        stop_all(procs)

    print("examples/agent on the tiny vLLM engine (in process), tools in bls worker processes\n")
    print(f"`bls bench -c {opts.concurrency} -n {opts.requests}` (request.json, no seed):")
    print(json.dumps(summary))
    print(
        f"\nseeded load, {opts.requests} requests at concurrency {opts.concurrency}: "
        f"{opts.requests / elapsed:.2f} requests/s; steps per request median "
        f"{statistics.median(steps):g}, mean {statistics.mean(steps):.2f}, max {max(steps)}; "
        f"ended {dict(ended)}; tool calls {dict(tools)}"
    )
    print(
        f"\n{opts.cancels} runs whose client left after 50-600 ms: {answered} had answered "
        f"by then; cancelled by the server {cancels_seen:g}; engine requests aborted "
        f"{len(aborts)}, held by the engine after each abort {sorted(set(held)) or '-'}; "
        f"requests left in flight {left_requests:g}; tool calls left in flight {left_tools}"
    )


if __name__ == "__main__":
    main()
