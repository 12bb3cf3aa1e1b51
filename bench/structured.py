"""Structured against free decoding on one engine, and typed calls through bls against the
same requests through `vllm serve`'s `response_format`.

    python bench/structured.py [--rounds 3] [--requests 48] [--concurrency 8]

Starts `vllm serve` on the tiny model (with the structured-output settings the vLLM
worker uses: llguidance, compact JSON) and `bls serve bench/serving/typed.py` with the
same engine in process. Each round sends the same questions (each with its own seed,
temperature 1) four ways, the order rotating: `vllm serve` free and with a JSON-schema
`response_format`, bls `free` (`bls.ask` for `str`) and `typed` (`bls.ask` for a
`Verdict`, the same schema). Same engine, prompt, seed and constraint give the same
tokens, and the run checks that they do; token counts come from `vllm serve`'s usage.

Prints tokens/s and the frontend's CPU time per token (the HTTP server process, which
also runs the engine client; engine cores are counted on neither side): structured /
free on each server, and bls / vllm for each kind, per round, median [min-max].
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from _procs import BLS, spawn, spread
from chat_endpoint import ENGINE, ROOT, Server, start_vllm

SCHEMA_SOURCE = ROOT / "bench/serving/typed.py"
QUESTION = "Judge this answer to 'what is 2 + 2': it says {n}."
STRUCTURED = {"backend": "guidance", "disable_any_whitespace": True}


def start_bls(model: str) -> Server:
    config = Path("/tmp") / f"bls-bench-structured-{id(model)}.toml"
    table = ", ".join(f"{k} = {json.dumps(v)}" for k, v in {"model": model, **ENGINE}.items())
    config.write_text(
        f'[stages.generator]\ninline = "bls.models.vllm:VllmWorker"\noptions = {{ {table} }}\n'
    )
    proc, url = spawn(
        [BLS, "serve", str(SCHEMA_SOURCE), "--port=0", "--no-access-log", "--config", str(config)]
    )
    return Server("bls", url, [proc])


def verdict_schema() -> dict[str, Any]:
    sys.path.insert(0, str(SCHEMA_SOURCE.parent))
    from typed import Verdict

    import bls

    constraint = bls.constraints.constraint_for(Verdict)
    assert constraint is not None and constraint.json is not None
    return constraint.json


async def _one(client: httpx.AsyncClient, server: Server, kind: str, n: int, schema: Any) -> Any:
    text = QUESTION.format(n=n)
    if server.name == "bls":
        body = {"text": text, "seed": n, "max_tokens": 96}
        answer = await client.post(f"{server.url}/v1/scripts/{kind}", json=body)
        answer.raise_for_status()
        return answer.json(), None
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": text}],
        "seed": n,
        "temperature": 1.0,
        "max_tokens": 96,
    }
    if kind == "typed":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "Verdict", "schema": schema},
        }
    answer = await client.post(f"{server.url}/v1/chat/completions", json=body)
    answer.raise_for_status()
    done = answer.json()
    content = done["choices"][0]["message"]["content"]
    value = json.loads(content) if kind == "typed" else content
    return value, done["usage"]["completion_tokens"]


async def load(
    server: Server, kind: str, requests: int, concurrency: int, schema: Any
) -> tuple[float, float, list[Any]]:
    """(seconds, frontend CPU seconds, [(value, tokens)] in request order)."""
    results: list[Any] = [None] * requests
    queue = list(range(requests))
    async with httpx.AsyncClient(timeout=120) as client:

        async def worker() -> None:
            while queue:
                n = queue.pop()
                results[n] = await _one(client, server, kind, n, schema)

        cpu = server.cpu()[0]
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        used = server.cpu()[0] - cpu
    return elapsed, used, results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=8)
    opts = ap.parse_args()

    from bls.models import tiny

    model = str(tiny.build())
    schema = verdict_schema()
    print("starting vllm serve and bls serve...", file=sys.stderr)
    extra = [f"--structured-outputs-config={json.dumps(STRUCTURED)}"]
    servers = [start_vllm(model, extra), start_bls(model)]
    contenders = [(s, kind) for s in servers for kind in ("free", "typed")]
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for server, kind in contenders:  # warm up: kernels, grammar compilation
            asyncio.run(load(server, kind, 8, 4, schema))
        for r in range(opts.rounds):
            answers: dict[tuple[str, str], list[Any]] = {}
            for server, kind in contenders[r % 4 :] + contenders[: r % 4]:
                elapsed, cpu, results = asyncio.run(
                    load(server, kind, opts.requests, opts.concurrency, schema)
                )
                answers[(server.name, kind)] = results
                runs.setdefault((server.name, kind), []).append((elapsed, cpu))
            for kind in ("free", "typed"):  # the same tokens both ways, or the figures lie
                theirs = [v for v, _ in answers[("vllm serve", kind)]]
                ours = [v for v, _ in answers[("bls", kind)]]
                if ours != theirs:
                    raise RuntimeError(f"{kind}: bls and vllm serve answered differently")
            tokens = {k: sum(t for _, t in answers[("vllm serve", k)]) for k in ("free", "typed")}
            for key in list(runs):
                elapsed, cpu = runs[key][-1]
                runs[key][-1] = (tokens[key[1]] / elapsed, cpu / tokens[key[1]] * 1e6)
            print(f"round {r + 1}: {runs}", file=sys.stderr)
    finally:
        for server in servers:
            server.stop()

    def column(key: tuple[str, str], i: int) -> list[float]:
        return [run[i] for run in runs[key]]

    print(
        f"{opts.requests} questions, concurrency {opts.concurrency}, {opts.rounds} round(s); "
        "median [min-max] over rounds\n"
    )
    print("| server | kind | tokens/s | frontend CPU µs/token |")
    print("| --- | --- | --- | --- |")
    for server_name, kind in runs:
        key = (server_name, kind)
        print(
            f"| {server_name} | {kind} | {statistics.median(column(key, 0)):,.0f} "
            f"| {statistics.median(column(key, 1)):.0f} |"
        )
    print("\n| ratio | tokens/s | CPU/token |")
    print("| --- | --- | --- |")
    pairs = [
        ("vllm serve: structured / free", ("vllm serve", "typed"), ("vllm serve", "free")),
        ("bls: typed / free", ("bls", "typed"), ("bls", "free")),
        ("free: bls / vllm serve", ("bls", "free"), ("vllm serve", "free")),
        ("typed: bls / vllm serve", ("bls", "typed"), ("vllm serve", "typed")),
    ]
    for label, top, bottom in pairs:
        rates = [a / b for a, b in zip(column(top, 0), column(bottom, 0), strict=True)]
        cpus = [a / b for a, b in zip(column(top, 1), column(bottom, 1), strict=True)]
        print(f"| {label} | {spread(rates)} | {spread(cpus)} |")


if __name__ == "__main__":
    main()
