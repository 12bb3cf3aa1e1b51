"""Remote stage calls vs a raw pyzmq DEALER/ROUTER + msgspec floor, side by side.

    python bench/remote_calls.py [--quick]

Starts real `bls worker` processes and a raw ROUTER echo server written here (the
floor: a blocking loop that decodes and re-encodes with msgspec), then prints a table
with ratios. Absolute times drift on shared machines; compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import numpy as np
import zmq
import zmq.asyncio

import bls
from bls import stage

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _procs import spawn  # noqa: E402
from _stages import Blob, Count, Probe, Tensor  # noqa: E402

BLS = str(Path(sys.executable).with_name("bls"))


# -- the raw floor ---------------------------------------------------------------------


def raw_server(address: str) -> None:
    """ROUTER loop: 'e' echoes the decoded payload re-encoded; 's' streams N items;
    't' echoes raw frames zero-copy."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    # Unbounded queues: at the default high-water mark a ROUTER drops what it cannot
    # queue, and a streamed run whose reader fell behind would wait forever for its end.
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.bind(address)
    print("ready", sock.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
    while True:
        frames = sock.recv_multipart(copy=False)
        ident, op, body = frames[0], frames[1].bytes, frames[2:]
        if op == b"e":
            sock.send_multipart([ident, enc.encode(dec.decode(body[0].buffer))])
        elif op == b"s":
            for i in range(dec.decode(body[0].buffer)):
                sock.send_multipart([ident, enc.encode(i)])
            sock.send_multipart([ident, b""])
        else:
            sock.send_multipart([ident, *body], copy=False)


class Raw:
    """The floor's client: zmq.asyncio DEALER + msgspec, on asyncio."""

    def __init__(self, address: str) -> None:
        self.ctx = zmq.asyncio.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.connect(address)
        self.enc, self.dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()

    async def echo(self, payload: dict[str, Any]) -> Any:
        await self.sock.send_multipart([b"e", self.enc.encode(payload)])
        return self.dec.decode((await self.sock.recv_multipart())[0])

    def close(self) -> None:
        self.sock.close(linger=0)


# -- measurements ----------------------------------------------------------------------

PAYLOAD = b"x" * 100


async def bls_rtt(address: str, n: int, idle: dict[str, str] | None = None) -> float:
    """Sequential unary calls; ``idle`` binds more stages that are connected, never called."""
    async with bls.Runtime({"echo": address, **(idle or {})}):
        req = Blob(data=PAYLOAD)
        for _ in range(200):
            await stage("echo", req)
        t = time.perf_counter()
        for _ in range(n):
            await stage("echo", req)
        return (time.perf_counter() - t) / n * 1e6


async def raw_rtt(address: str, n: int) -> float:
    raw = Raw(address)
    req = {"data": PAYLOAD}
    for _ in range(200):
        await raw.echo(req)
    t = time.perf_counter()
    for _ in range(n):
        await raw.echo(req)
    raw.close()
    return (time.perf_counter() - t) / n * 1e6


async def bls_throughput(address: str, n: int, inflight: int = 64) -> float:
    async with bls.Runtime({"echo": address}):
        req = Blob(data=PAYLOAD)

        async def lane(k: int) -> None:
            for _ in range(k):
                await stage("echo", req)

        t = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(inflight):
                tg.start_soon(lane, n // inflight)
        return (n // inflight * inflight) / (time.perf_counter() - t)


async def raw_throughput(address: str, n: int, inflight: int = 64) -> float:
    raw = Raw(address)
    body = raw.enc.encode({"data": PAYLOAD})
    t = time.perf_counter()
    for _ in range(inflight):
        await raw.sock.send_multipart([b"e", body])
    done = 0
    while done < n:
        raw.dec.decode((await raw.sock.recv_multipart())[0])
        done += 1
        if done + inflight <= n:
            await raw.sock.send_multipart([b"e", body])
    rate = n / (time.perf_counter() - t)
    raw.close()
    return rate


async def bls_stream(address: str, n: int) -> float:
    async with bls.Runtime({"ticks": address}):
        t = time.perf_counter()
        count = 0
        async for _ in stage.stream("ticks", Count(n=n)):
            count += 1
        assert count == n
        return n / (time.perf_counter() - t)


async def raw_stream(address: str, n: int) -> float:
    raw = Raw(address)
    t = time.perf_counter()
    await raw.sock.send_multipart([b"s", raw.enc.encode(n)])
    while True:
        frame = (await raw.sock.recv_multipart())[0]
        if not frame:
            break
        raw.dec.decode(frame)
    rate = n / (time.perf_counter() - t)
    raw.close()
    return rate


ARRAY = np.random.default_rng(0).random(2 * 1024 * 1024)  # 16 MiB of float64


async def bls_tensor(address: str, n: int) -> float:
    async with bls.Runtime({"tensor_echo": address}):
        req = Tensor(array=ARRAY)
        out = await stage("tensor_echo", req)
        assert np.array_equal(out.array, ARRAY)
        t = time.perf_counter()
        for _ in range(n):
            await stage("tensor_echo", req)
        return (time.perf_counter() - t) / n * 1e3


async def raw_tensor(address: str, n: int) -> float:
    raw = Raw(address)
    t = time.perf_counter()
    for _ in range(n):
        await raw.sock.send_multipart([b"t", memoryview(ARRAY).cast("B")], copy=False)
        frames = await raw.sock.recv_multipart(copy=False)
        np.frombuffer(frames[0].buffer, dtype=np.float64)
    ms = (time.perf_counter() - t) / n * 1e3
    raw.close()
    return ms


async def bls_cancel(address: str, n: int) -> tuple[float, float]:
    starts: list[float] = []
    async with bls.Runtime({"cancel_probe": address}):
        for _ in range(n):
            items = stage.stream("cancel_probe", Probe(op="wait"))
            await items.__anext__()
            starts.append(time.time())
            await items.aclose()
        await anyio.sleep(0.2)
        ends = [t async for t in stage.stream("cancel_probe", Probe(op="report"))]
    lat = sorted((e - s) * 1e3 for s, e in zip(starts, ends, strict=True))
    return statistics.median(lat), lat[int(len(lat) * 0.99) - 1]


def on(backend: str, fn: Callable[..., Any], *args: Any) -> Any:
    return anyio.run(fn, *args, backend=backend)


def interleaved(rounds: int, runs: list[Callable[[], float]], lower: bool = True) -> list[float]:
    """Best of ``rounds`` for each run, the runs taking turns so drift hits all alike."""
    results: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for out, run in zip(results, runs, strict=True):
            out.append(run())
    return [min(r) if lower else max(r) for r in results]


def ratio_cell(floor: float, a: float, t: float) -> str:
    return f"{a / floor:.2f}x / {t / floor:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--raw-server", metavar="ADDR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_server:
        raw_server(args.raw_server)
        return
    q = 4 if args.quick else 1
    tmp = tempfile.mkdtemp(prefix="bls-bench-")
    procs: list[subprocess.Popen[str]] = []

    def worker(target: str, listen: str, *extra: str) -> str:
        proc, addr = spawn(
            [
                BLS,
                "worker",
                f"{HERE}/_stages.py:{target}",
                "--listen",
                listen,
                "--log-level",
                "error",
                *extra,
            ]
        )
        procs.append(proc)
        return addr

    def raw(listen: str) -> str:
        proc, addr = spawn([sys.executable, __file__, "--raw-server", listen])
        procs.append(proc)
        return addr

    def row(
        name: str,
        unit: str,
        fmt: str,
        rounds: int,
        lower: bool,
        floor_fn: Callable[[], float],
        bls_fn: Callable[[str], float],
    ) -> None:
        f, a, t = interleaved(
            rounds, [floor_fn, lambda: bls_fn("asyncio"), lambda: bls_fn("trio")], lower
        )
        rows.append(
            (name, unit, format(f, fmt), format(a, fmt), format(t, fmt), ratio_cell(f, a, t))
        )

    rows: list[tuple[str, ...]] = []
    try:
        for transport in ("tcp", "ipc"):
            w = worker("echo", "tcp://127.0.0.1:0" if transport == "tcp" else f"ipc://{tmp}/e.sock")
            r = raw("tcp://127.0.0.1:0" if transport == "tcp" else f"ipc://{tmp}/r.sock")
            n = 5000 // q
            row(
                f"unary RTT, 100 B, 1 in flight, {transport}",
                "us",
                ".1f",
                3,
                True,
                lambda r=r, n=n: asyncio.run(raw_rtt(r, n)),  # type: ignore[misc]
                lambda b, w=w, n=n: on(b, bls_rtt, w, n),
            )  # type: ignore[misc]
        w, r = worker("echo", "tcp://127.0.0.1:0"), raw("tcp://127.0.0.1:0")
        idle = {
            f"idle{i}": worker("echo", "tcp://127.0.0.1:0", "--stage", f"idle{i}") for i in range(6)
        }
        n = 5000 // q
        row(
            "unary RTT, 100 B, 6 idle workers connected, tcp",
            "us",
            ".1f",
            3,
            True,
            lambda: asyncio.run(raw_rtt(r, n)),
            lambda b: on(b, bls_rtt, w, n, idle),
        )
        n = 20000 // q
        row(
            "throughput, 64 in flight, tcp",
            "calls/s",
            ",.0f",
            2,
            False,
            lambda: asyncio.run(raw_throughput(r, n)),
            lambda b: on(b, bls_throughput, w, n),
        )
        ws = worker("ticks", "tcp://127.0.0.1:0")
        n = 50000 // q
        row(
            "streamed items, tcp",
            "items/s",
            ",.0f",
            2,
            False,
            lambda: asyncio.run(raw_stream(r, n)),
            lambda b: on(b, bls_stream, ws, n),
        )
        wt = worker("tensor_echo", f"ipc://{tmp}/tensor.sock")
        rt = raw(f"ipc://{tmp}/rawtensor.sock")
        n = 20 // q
        row(
            "16 MiB tensor round trip, ipc",
            "ms",
            ".2f",
            2,
            True,
            lambda: asyncio.run(raw_tensor(rt, n)),
            lambda b: on(b, bls_tensor, wt, n),
        )
        wc = worker("cancel_probe", "tcp://127.0.0.1:0")
        n = 1000 // q
        pa = on("asyncio", bls_cancel, wc, n)
        pt = on("trio", bls_cancel, wc, n)
        rows.append(
            (
                f"cancel -> worker finally, {n} cancels",
                "ms p50/p99",
                "-",
                f"{pa[0]:.2f}/{pa[1]:.2f}",
                f"{pt[0]:.2f}/{pt[1]:.2f}",
                "-",
            )
        )
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    head = ("measurement", "unit", "raw zmq", "bls asyncio", "bls trio", "ratio (asyncio / trio)")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    print(f"bls transport benchmark ({os.cpu_count()} cores; the worker runs on asyncio)")
    for r in [head, tuple("-" * w for w in widths), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
    main()
