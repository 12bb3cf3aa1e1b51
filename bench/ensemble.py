"""The ensemble script under `bls serve` vs the hand-written baseline, same workers, same load.

    python bench/ensemble.py [--rounds 3] [--seconds 8] [--levels 1,8,32] [--max-tokens 16]

Starts `bls worker` processes for the encoder, the classifier and the vLLM generator (the
tiny local model), then `bls serve examples/ensemble/ensemble.py` with every stage bound
to them (no result cache, so both do the same work) and `examples/ensemble/bespoke.py`
on the same workers. At each concurrency the two take turns for several rounds, driven by
a keep-alive HTTP/1.1 load generator in its own process that reads each event stream to
its end. Prints streams/s, p50 latency and time to first event, bls ÷ bespoke, as the
median [min-max] over the rounds, with each frontend's CPU time per request from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from _procs import cpu_seconds, spawn, spread

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BLS = str(Path(sys.executable).with_name("bls"))
SCRIPT = ROOT / "examples/ensemble/ensemble.py"
BESPOKE = ROOT / "examples/ensemble/bespoke.py"
GENERATOR = [
    "max_model_len=256",
    "enforce_eager=true",
    "enable_prompt_embeds=true",
    "dtype=float32",
]
END = b"event: end\ndata: {}\n\n"


# -- the load generator (a process of its own) -------------------------------------------


async def _connection(
    host: str, port: int, request: bytes, until: float, out: list[tuple[float, float]]
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    perf = time.perf_counter
    try:
        while perf() < until:
            t0 = perf()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"unexpected answer: {head[:200]!r}")
            # A chunked event stream: read to its end event, then the last chunk.
            body, first = b"", 0.0
            while END not in body:
                body += await reader.read(65536)
                if not first and b"data: " in body:
                    first = perf() - t0
            while not body.endswith(b"0\r\n\r\n"):
                body += await reader.read(65536)
            out.append((perf() - t0, first))
    finally:
        writer.close()


async def _load(
    url: str, body: bytes, concurrency: int, seconds: float
) -> list[tuple[float, float]]:
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    request = (
        f"POST /v1/scripts/ensemble HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    await _connection(host, port, request, time.perf_counter() + 0.5, [])  # warm up
    out: list[tuple[float, float]] = []
    until = time.perf_counter() + seconds
    await asyncio.gather(
        *(_connection(host, port, request, until, out) for _ in range(concurrency))
    )
    return out


def _run_load(url: str, body: bytes, c: int, seconds: float, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    queue.put(asyncio.run(_load(url, body, c, seconds)))


def measure(url: str, pid: int, body: bytes, c: int, seconds: float) -> dict[str, float]:
    queue: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    proc = multiprocessing.Process(target=_run_load, args=(url, body, c, seconds, queue))
    cpu0 = cpu_seconds(pid)
    proc.start()
    results = queue.get(timeout=seconds + 120)
    proc.join()
    cpu = cpu_seconds(pid) - cpu0
    lat = sorted(r[0] for r in results)
    return {
        "rps": len(results) / seconds,
        "p50_ms": statistics.median(lat) * 1000,
        "ttfe_ms": statistics.median(r[1] for r in results) * 1000,
        "cpu_ms": cpu / max(1, len(results)) * 1000,  # includes the warm-up's few requests
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="per measurement")
    parser.add_argument("--levels", default="1,8,32", help="concurrencies")
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    request = json.loads((ROOT / "examples/ensemble/request.json").read_text())
    body = json.dumps({**request, "max_tokens": args.max_tokens}).encode()
    procs = []
    try:
        addresses = {}
        for name, target, extra in (
            ("encoder", "bls.models.encoder:VisionEncoder", []),
            ("classifier", "bls.models.encoder:Classifier", []),
            (
                "generator",
                "bls.models.vllm:VllmWorker",
                [a for o in GENERATOR for a in ("--option", o)],
            ),
        ):
            proc, addresses[name] = spawn(
                [
                    BLS,
                    "worker",
                    target,
                    "--listen",
                    "tcp://127.0.0.1:0",
                    "--log-level",
                    "error",
                    *extra,
                ]
            )
            procs.append(proc)
        config = Path(tempfile.mkdtemp(prefix="bls-bench-")) / "bls.toml"
        config.write_text(
            "".join(f'[stages.{n}]\nremote = ["{a}"]\n\n' for n, a in addresses.items())
        )
        server, bls_url = spawn(
            [
                BLS,
                "serve",
                str(SCRIPT),
                "--port",
                "0",
                "--config",
                str(config),
                "--no-access-log",
                "--log-level",
                "warning",
                "--max-inflight",
                "1024",
            ]
        )
        procs.append(server)
        bespoke, bespoke_url = spawn(
            [
                sys.executable,
                str(BESPOKE),
                "--port",
                "0",
                *(f"--{n}={a}" for n, a in addresses.items()),
            ]
        )
        procs.append(bespoke)
        contenders = {"bls": (bls_url, server.pid), "bespoke": (bespoke_url, bespoke.pid)}
        print(
            f"ensemble: bls serve vs bespoke, same workers; {args.rounds} rounds of "
            f"{args.seconds:g} s, max_tokens {args.max_tokens}, {os.cpu_count()} cores\n"
        )
        print(
            "| concurrency | bespoke streams/s | bls streams/s | throughput bls/bespoke "
            "| p50 ms bespoke / bls | p50 bls - bespoke ms | first event ms bespoke / bls "
            "| frontend CPU ms/req bespoke / bls |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for c in [int(x) for x in args.levels.split(",")]:
            runs: dict[str, list[dict[str, float]]] = {k: [] for k in contenders}
            for r in range(args.rounds):
                order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
                for name in order:
                    url, pid = contenders[name]
                    runs[name].append(measure(url, pid, body, c, args.seconds))
            b, h = runs["bls"], runs["bespoke"]

            def med(rows: list[dict[str, float]], key: str) -> float:
                return statistics.median(x[key] for x in rows)

            print(
                f"| {c} | {med(h, 'rps'):.1f} | {med(b, 'rps'):.1f} "
                f"| {spread([x['rps'] / y['rps'] for x, y in zip(b, h, strict=True)])} "
                f"| {med(h, 'p50_ms'):.1f} / {med(b, 'p50_ms'):.1f} "
                f"| {spread([x['p50_ms'] - y['p50_ms'] for x, y in zip(b, h, strict=True)])} "
                f"| {med(h, 'ttfe_ms'):.1f} / {med(b, 'ttfe_ms'):.1f} "
                f"| {med(h, 'cpu_ms'):.2f} / {med(b, 'cpu_ms'):.2f} |",
                flush=True,
            )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except Exception:
                proc.kill()


if __name__ == "__main__":
    main()
