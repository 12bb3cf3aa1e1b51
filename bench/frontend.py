"""`bls serve` vs a bare Starlette route on the same server doing the same work.

    python bench/frontend.py [--quick] [--backend asyncio|trio] [--recording]

Starts a `bls worker` (the remote stage), `bls serve bench/serving/app.py` and the floor
(bench/serving/app.py run directly: Starlette on Uvicorn), then drives each with a
keep-alive HTTP/1.1 load generator in its own process at several concurrencies and prints
req/s, p50 and the server's CPU time per request (user + system, from /proc) side by
side. The two take turns for ``--rounds`` rounds; ratios are bls / floor per round, as
median [min-max]. Absolute times drift on shared machines; compare within one run.

``--recording`` measures what recording costs instead: `bls serve` against `bls serve
--record DIR` (every request's stage calls written to a file), the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import time
from urllib.parse import urlsplit

from _procs import BLS, SERVING_APP, cpu_seconds, serve_app, spawn, spread, stop_all

# -- the load generator (a process of its own) -------------------------------------------


async def _connection(host: str, port: int, request: bytes, until: float, out: list[float]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    perf = time.perf_counter
    try:
        while perf() < until:
            t0 = perf()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"unexpected answer: {head[:60]!r}")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            out.append(perf() - t0)
    finally:
        writer.close()


async def _load(url: str, path: str, concurrency: int, seconds: float) -> list[float]:
    parts = urlsplit(url)
    body = b'{"text":"hello"}'
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.hostname}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    latencies: list[float] = []
    # Warm up (connections, first-call paths), then measure.
    await _connection(
        parts.hostname or "", parts.port or 80, request, time.perf_counter() + 0.3, []
    )
    until = time.perf_counter() + seconds
    await asyncio.gather(
        *(
            _connection(parts.hostname or "", parts.port or 80, request, until, latencies)
            for _ in range(concurrency)
        )
    )
    return latencies


def _run_load(
    url: str,
    path: str,
    concurrency: int,
    seconds: float,
    queue: multiprocessing.Queue[list[float]],
) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    queue.put(asyncio.run(_load(url, path, concurrency, seconds)))


def measure(url: str, path: str, concurrency: int, seconds: float) -> tuple[float, float, float]:
    """(req/s, p50 ms, p99 ms) for ``concurrency`` keep-alive connections."""
    queue: multiprocessing.Queue[list[float]] = multiprocessing.Queue()
    proc = multiprocessing.Process(target=_run_load, args=(url, path, concurrency, seconds, queue))
    proc.start()
    latencies = queue.get(timeout=seconds + 60)
    proc.join()
    latencies.sort()
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    return len(latencies) / seconds, p50, p99


def measure_server(pid: int, url: str, path: str, concurrency: int, seconds: float) -> tuple:
    """(req/s, p50 ms, p99 ms, server CPU µs per request)."""
    cpu = cpu_seconds(pid)
    rps, p50, p99 = measure(url, path, concurrency, seconds)
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
        help="scripts to measure: noop (no stage), inline (one stage in process), remote",
    )
    parser.add_argument("--levels", type=int, nargs="+", help="concurrencies")
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
            what = f"bls serve --record ({args.backend}) vs bls serve (the floor)"
        else:
            floor, floor_url = spawn([sys.executable, SERVING_APP, address])
            procs.append(floor)
            what = f"bls serve ({args.backend}) vs bare Starlette on Uvicorn"

        print(
            f"{what}, {seconds:g} s each, "
            f"{args.rounds} round(s); bls / floor per round: median [min-max]\n"
        )
        print(
            "| script | concurrency | floor req/s | bls req/s | throughput ratio "
            "| floor / bls p50 ms | server CPU µs/request floor / bls | CPU ratio |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for entry in args.entries:
            for c in levels:
                path = f"/v1/scripts/{entry}"
                floors, blss = [], []
                for r in range(args.rounds):
                    pair = [(floor.pid, floor_url, floors), (server.pid, bls_url, blss)]
                    for pid, url, out in pair if r % 2 == 0 else pair[::-1]:
                        out.append(measure_server(pid, url, path, c, seconds))
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
