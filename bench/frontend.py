"""`bls serve` vs a bare Starlette route on the same server doing the same work.

    python bench/frontend.py [--quick] [--backend asyncio|trio] [--recording] [--wrk]

Starts a `bls worker` (the remote stage), `bls serve bench/serving/app.py` and the floor
(bench/serving/app.py run directly: Starlette on Uvicorn), then drives each with a
keep-alive HTTP/1.1 load generator in its own process at several concurrencies and prints
req/s, p50 and the server's CPU time per request (user + system, from /proc) side by
side. The two take turns for ``--rounds`` rounds; ratios are bls / floor per round, as
median [min-max]. Absolute times drift on shared machines; compare within one run.

``--wrk`` drives them with wrk (one thread, the same POST) instead of bench/_load.py:
the load generator most HTTP benchmarks use, where it is installed (req/s and CPU only).

``--recording`` measures what recording costs instead: `bls serve` against `bls serve
--record DIR` (every request's stage calls written to a file), the same way.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from _load import Load
from _procs import BLS, SERVING_APP, cpu_seconds, serve_app, spawn, spread, stop_all


def measure(url: str, path: str, concurrency: int, seconds: float) -> tuple[float, float, float]:
    """(req/s, p50 ms, p99 ms) for ``concurrency`` keep-alive connections (bench/_load.py,
    in a process of its own, on uvloop), each answer a 200."""
    body = b'{"text":"hello"}'
    with Load(url, path, {}, concurrency, seconds, body=body, warm=0.3, uvloop=True) as load:
        rows = load.result()
    refused = [status for _, status in rows if status != 200]
    if refused:
        raise RuntimeError(f"unexpected answer: HTTP {refused[0]} ({len(refused)} of {len(rows)})")
    latencies = sorted(t for t, _ in rows)
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    return len(latencies) / seconds, p50, p99


def measure_wrk(url: str, path: str, concurrency: int, seconds: float) -> tuple:
    """(req/s, p50 ms, p99 ms) as wrk counts them, one thread, ``concurrency`` connections."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(
            'wrk.method = "POST"\nwrk.body = \'{"text":"hello"}\'\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
        )
        script.flush()
        command = ["wrk", "-t1", f"-c{concurrency}", f"-d{seconds:g}s", "--latency"]
        command += ["-s", script.name]
        out = subprocess.run([*command, url + path], capture_output=True, text=True).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"unexpected answers or errors:\n{out}")
    found = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if found is None:
        raise RuntimeError(f"wrk said:\n{out}")
    return float(found.group(1)), _wrk_ms(out, "50%"), _wrk_ms(out, "99%")


def _wrk_ms(out: str, percentile: str) -> float:
    """A latency percentile of wrk's --latency distribution, in ms."""
    found = re.search(rf"^\s*{percentile}\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
    if found is None:
        return float("nan")
    return float(found.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[found.group(2)]


def measure_server(
    pid: int, url: str, path: str, concurrency: int, seconds: float, wrk: bool = False
) -> tuple:
    """(req/s, p50 ms, p99 ms, server CPU µs per request)."""
    cpu = cpu_seconds(pid)
    rps, p50, p99 = (measure_wrk if wrk else measure)(url, path, concurrency, seconds)
    used = cpu_seconds(pid) - cpu
    return rps, p50, p99, used / max(rps * seconds, 1) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--seconds", type=float, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the two taking turns")
    parser.add_argument(
        "--entries",
        nargs="+",
        default=["noop", "inline", "remote"],
        help="scripts to measure: noop (no stage), inline (one stage in process), remote; "
        "spin4 and spin8 (inline, with 4 or 8 µs of CPU more: what a fixed cost added to a "
        "request costs the server)",
    )
    parser.add_argument("--levels", type=int, nargs="+", help="concurrencies")
    parser.add_argument("--wrk", action="store_true", help="drive the load with wrk (installed)")
    parser.add_argument(
        "--recording",
        action="store_true",
        help="compare bls serve with bls serve --record instead of with the floor",
    )
    parser.add_argument(
        "--record-in",
        metavar="DIR",
        help="with --recording: the file system the records go to (default: $TMPDIR)",
    )
    args = parser.parse_args()
    if args.wrk and shutil.which("wrk") is None:
        parser.error("--wrk: wrk is not installed (apt-get install wrk)")
    seconds = args.seconds or (1.0 if args.quick else 3.0)
    levels = args.levels or ([1, 8, 32] if args.quick else [1, 4, 16, 64])

    procs = []
    records = tempfile.mkdtemp(prefix="bls-bench-records-", dir=args.record_in)
    try:
        worker, address = spawn(
            [BLS, "worker", f"{SERVING_APP}:echo", "--listen", "tcp://127.0.0.1:0"]
        )
        procs.append(worker)
        server, bls_url = serve_app(address, "--backend", args.backend, "--max-inflight", "1024")
        procs.append(server)
        if args.recording:  # the floor is bls itself; the contender records
            floor, floor_url = server, bls_url
            server, bls_url = serve_app(
                address, "--backend", args.backend, "--max-inflight", "1024", "--record", records
            )
            procs.append(server)
            what = f"bls serve --record ({args.backend}) vs bls serve"
        else:
            floor, floor_url = spawn([sys.executable, SERVING_APP, address])
            procs.append(floor)
            what = f"bls serve ({args.backend}) vs bare Starlette on Uvicorn"

        # (the columns named as the docs' tables name them: floor and bls, or, with
        # --recording, plain and recording)
        base, contender = ("plain", "recording") if args.recording else ("floor", "bls")
        print(
            f"{what}, {seconds:g} s each{' under wrk' if args.wrk else ''}, "
            f"{args.rounds} round(s); {contender} / {base} per round: median [min-max]\n"
        )
        print(
            f"| script | concurrency | {base} req/s | {contender} req/s | throughput ratio "
            f"| {base} / {contender} p50 ms | server CPU µs/request {base} / {contender} "
            "| CPU ratio |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for entry in args.entries:
            for c in levels:
                path = f"/v1/scripts/{entry}"
                floors, blss = [], []
                for r in range(args.rounds):
                    pair = [(floor.pid, floor_url, floors), (server.pid, bls_url, blss)]
                    for pid, url, out in pair if r % 2 == 0 else pair[::-1]:
                        out.append(measure_server(pid, url, path, c, seconds, args.wrk))
                med = statistics.median
                pairs = list(zip(floors, blss, strict=True))
                print(
                    f"| {entry} | {c} | {med(f[0] for f in floors):,.0f} "
                    f"| {med(b[0] for b in blss):,.0f} "
                    f"| {spread([b[0] / f[0] for f, b in pairs], '.2f')} "
                    f"| {med(f[1] for f in floors):.3f} / {med(b[1] for b in blss):.3f} "
                    f"| {med(f[3] for f in floors):.0f} / {med(b[3] for b in blss):.0f} "
                    f"| {spread([b[3] / f[3] for f, b in pairs], '.2f')} |",
                    flush=True,
                )
    finally:
        stop_all(procs)
        shutil.rmtree(records, ignore_errors=True)


if __name__ == "__main__":
    main()
