"""`bls serve` vs a bare Starlette route on the same server doing the same work.

    python bench/frontend.py [--quick] [--backend asyncio|trio]

Starts a `bls worker` (the remote stage), `bls serve bench/serving/app.py` and the floor
(bench/serving/app.py run directly: Starlette on Uvicorn), then drives each with a
keep-alive HTTP/1.1 load generator in its own process at several concurrencies and prints
req/s, p50 and p99 side by side, with the ratio of bls's throughput to the floor's.
Absolute times drift on shared machines; compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from _procs import spawn

HERE = Path(__file__).resolve().parent
BLS = str(Path(sys.executable).with_name("bls"))
APP = str(HERE / "serving" / "app.py")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--seconds", type=float, help="seconds per measurement")
    args = parser.parse_args()
    seconds = args.seconds or (1.0 if args.quick else 3.0)
    levels = [1, 8, 32] if args.quick else [1, 4, 16, 64]

    procs = []
    try:
        worker, address = spawn([BLS, "worker", f"{APP}:echo", "--listen", "tcp://127.0.0.1:0"])
        procs.append(worker)
        server, bls_url = spawn(
            [
                BLS,
                "serve",
                APP,
                "--port",
                "0",
                "--bind",
                f"echo={address}",
                "--backend",
                args.backend,
                "--no-access-log",
                "--log-level",
                "warning",
                "--max-inflight",
                "1024",
            ]
        )
        procs.append(server)
        floor, floor_url = spawn([sys.executable, APP, address])
        procs.append(floor)

        print(f"bls serve ({args.backend}) vs bare Starlette on Uvicorn, {seconds:g} s each\n")
        print(
            "| script | concurrency | floor req/s | bls req/s | ratio "
            "| floor p50 / p99 ms | bls p50 / p99 ms |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for entry in ("noop", "remote"):
            for c in levels:
                path = f"/v1/scripts/{entry}"
                f_rps, f50, f99 = measure(floor_url, path, c, seconds)
                b_rps, b50, b99 = measure(bls_url, path, c, seconds)
                print(
                    f"| {entry} | {c} | {f_rps:,.0f} | {b_rps:,.0f} | {b_rps / f_rps:.2f}x | "
                    f"{f50:.3f} / {f99:.3f} | {b50:.3f} / {b99:.3f} |",
                    flush=True,
                )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


if __name__ == "__main__":
    main()
