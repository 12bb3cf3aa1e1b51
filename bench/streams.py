"""Many slow SSE streams: `bls serve` (a script streaming from an inline stage) vs a bare
Starlette `StreamingResponse` on the same Uvicorn, one event a second per stream.

    python bench/streams.py [--streams 10000] [--events 15] [--rounds 2]

Opens ``--streams`` keep-alive connections from a load process of its own (connecting in
batches, so the listen backlog keeps up), each asking for ``--events`` events one second
apart, and reads every stream to its end. Reports, per contender and round: the streams
that completed with every event and without error, how long the slowest took against
the ``--events`` seconds real time needs, the server's CPU per event (user + system from
/proc) and, in the first round, its memory per open stream (RSS growth while all are
open; freed memory is reused, not returned, so later rounds cannot show it). The contenders
take turns; ratios are bls / bare per round, median [min-max].
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import sys
import time
from typing import Any

from _procs import SERVING_APP, cpu_seconds, rss_bytes, serve_app, spawn, spread, stop_all


def _raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- the load (a process of its own) -----------------------------------------------------


async def _stream(host: str, port: int, request: bytes, events: int) -> tuple[bool, float]:
    """(every event arrived and the stream ended cleanly, seconds it took)."""
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False, 0.0
    try:
        writer.write(request)
        seen = b""
        while not seen.endswith(b"0\r\n\r\n"):
            chunk = await reader.read(65536)
            if not chunk:
                break
            seen += chunk
        ok = seen.startswith(b"HTTP/1.1 200") and seen.count(b'data: {"') == events
        ok = ok and b"event: error" not in seen
        return ok, time.perf_counter() - start
    except OSError:
        return False, time.perf_counter() - start
    finally:
        writer.close()


def _load(url: str, streams: int, events: int, opened: Any, queue: Any) -> None:
    _raise_fd_limit()

    async def main() -> list[tuple[bool, float]]:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        body = b'{"count": %d, "interval": 1.0}' % events
        request = (
            b"POST /v1/scripts/ticks HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"accept: text/event-stream\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        tasks = []
        for i in range(streams):
            tasks.append(asyncio.create_task(_stream(host, int(port), request, events)))
            if i % 500 == 499:
                await asyncio.sleep(0.05)  # the listen backlog is finite
        opened.set()
        return await asyncio.gather(*tasks)

    queue.put(asyncio.run(main()))


def run(pid: int, url: str, streams: int, events: int) -> dict[str, float]:
    rss0, cpu0 = rss_bytes(pid), cpu_seconds(pid)
    opened, queue = multiprocessing.Event(), multiprocessing.Queue()
    load = multiprocessing.Process(target=_load, args=(url, streams, events, opened, queue))
    t0 = time.perf_counter()
    load.start()
    opened.wait()
    time.sleep(min(events / 2, 5))  # all open, mid-stream
    rss = rss_bytes(pid) - rss0
    results = queue.get()
    load.join()
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(pid) - cpu0
    ok = sum(1 for good, _ in results if good)
    slowest = max((took for _, took in results), default=0.0)
    return {
        "ok": ok,
        "slowest": slowest,
        "wall": wall,
        "cpu_per_event_us": cpu / max(ok * events, 1) * 1e6,
        "kb_per_stream": rss / streams / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    _raise_fd_limit()
    procs = []
    try:
        server, bls_url = serve_app("tcp://127.0.0.1:9", "--max-inflight", str(args.streams + 100))
        procs.append(server)
        floor, floor_url = spawn([sys.executable, SERVING_APP, "tcp://127.0.0.1:9"])
        procs.append(floor)
        print(
            f"{args.streams} SSE streams x {args.events} events, 1 s apart: bls serve vs bare "
            f"Starlette StreamingResponse on Uvicorn, {args.rounds} round(s)\n",
            flush=True,
        )
        print(
            "| round | server | streams ok | slowest s (real time: "
            f"{args.events}) | CPU µs/event | KB/stream |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        for proc, url in ((floor, floor_url), (server, bls_url)):
            run(proc.pid, url, 200, 1)  # warm up: first connections, lazy imports
        runs: dict[str, list[dict[str, float]]] = {"bare": [], "bls": []}
        for r in range(args.rounds):
            order = [("bare", floor, floor_url), ("bls", server, bls_url)]
            for name, proc, url in order if r % 2 == 0 else order[::-1]:
                m = run(proc.pid, url, args.streams, args.events)
                runs[name].append(m)
                # Freed memory is reused, not returned: only a first run's growth counts.
                kb = f"{m['kb_per_stream']:.1f}" if r == 0 else "-"
                print(
                    f"| {r + 1} | {name} | {m['ok']:,.0f} | {m['slowest']:.1f} "
                    f"| {m['cpu_per_event_us']:.0f} | {kb} |",
                    flush=True,
                )
        pairs = list(zip(runs["bare"], runs["bls"], strict=True))

        def ratio(key: str, pairs: list[tuple[dict[str, float], dict[str, float]]]) -> str:
            return spread([b[key] / f[key] for f, b in pairs])

        print(
            f"\nbls / bare: CPU per event {ratio('cpu_per_event_us', pairs)}, memory per "
            f"stream {ratio('kb_per_stream', pairs[:1])}, slowest stream {ratio('slowest', pairs)}"
        )
    finally:
        stop_all(procs)


if __name__ == "__main__":
    main()
