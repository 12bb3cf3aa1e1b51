"""Cache-aware routing for an LLM stage: a multi-turn chat workload through two
frontends (processes that share nothing) onto FakeLLM replicas with a simulated prefix
cache, affinity by prompt prefix against least-outstanding, and one replica alone (every
turn finds its conversation's prefix: the hit rate to reach).

    python bench/prefix_routing.py [--rounds 3] [--conversations 16] [--turns 6]
                                   [--cache-blocks 20000,192] [--tpot-ms 1]

Each conversation is a system prompt and a first question, then turns that each send
the whole conversation so far; its turns go to the two frontends in turn (as a
round-robin load balancer sends them), the conversations side by side. The replicas
(`bls worker bls.models.fakellm:FakeLLM`) take ``prefill_ms`` per prompt token their
cache does not hold before the first token, then ``--tpot-ms`` between tokens. The
whole run is made once per cache size (``--cache-blocks``: blocks of 16 tokens a replica
keeps; the one replica of the first mode keeps twice as many, the memory of the two): a
roomy one, where every replica holds every conversation it saw, and a full one (192
blocks), where each replica holds the blocks of half the conversations by their last
turn but not those of all of them, as a real engine's KV cache is full under load. Each
mode starts fresh workers and frontends; the modes take turns for ``--rounds`` rounds.
Prints the prefix-cache hit rate (cached / prompt tokens, over every turn after a
conversation's first) and time to first token, median [min-max] over rounds, and the
ratios the targets are stated in.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _procs import BLS, spawn, spread, stop_all

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "bench/serving/turns.py")
FAKE = [
    "--option", "ttft_ms=2", "--option", "prefill_ms=0.5", "--option", "block_tokens=16",
]  # fmt: skip
MODES = {  # name: (replicas, affinity)
    "one replica": (1, False),
    "affinity": (2, True),
    "least outstanding": (2, False),
}
SYSTEM = "You are a careful assistant."


def opening(c: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"conversation {c}: tell me about topic {c} " * 6},
    ]


async def one_turn(
    client: httpx.AsyncClient, url: str, messages: list[Any]
) -> tuple[float, int, int, str]:
    """(time to the first item, prompt tokens, cached tokens, the answer's text)."""
    began = time.perf_counter()
    headers = {"accept": "application/x-ndjson"}
    first: dict[str, Any] | None = None
    ttft, text = 0.0, ""
    body = {"messages": messages}
    async with client.stream("POST", f"{url}/v1/scripts/turn", json=body, headers=headers) as got:
        got.raise_for_status()
        async for line in got.aiter_lines():
            if not line.strip():
                continue
            item = json.loads(line)
            if first is None:
                first, ttft = item, time.perf_counter() - began
            text += item["text"]
    if first is None:
        raise RuntimeError("no item")
    return ttft, first["prompt_tokens"], first["cached_tokens"], text


async def workload(
    urls: list[str], conversations: int, turns: int
) -> list[tuple[int, float, int, int]]:
    """(turn, ttft s, prompt tokens, cached tokens) of every turn. Each turn sends the
    conversation so far, the engine's own answers included (as a chat client does)."""
    results: list[tuple[int, float, int, int]] = []
    async with httpx.AsyncClient(timeout=60) as client:

        async def talk(c: int) -> None:
            messages = opening(c)
            for t in range(turns):
                url = urls[(c + t) % len(urls)]  # (a round-robin balancer's choice)
                ttft, prompt, cached, answer = await one_turn(client, url, messages)
                results.append((t, ttft, prompt, cached))
                messages += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": f"go on with part {t + 2}, please"},
                ]

        await asyncio.gather(*(talk(c) for c in range(conversations)))
    return results


def run_mode(
    name: str, conversations: int, turns: int, blocks: int, tpot_ms: float
) -> dict[str, float]:
    replicas, affinity = MODES[name]
    cache = ["--option", f"prefix_cache={blocks * 2 // replicas}"]  # (the same memory in all)
    cache += ["--option", f"tpot_ms={tpot_ms}"]
    procs = []
    try:
        addresses = []
        for _ in range(replicas):
            proc, address = spawn(
                [BLS, "worker", "bls.models.fakellm:FakeLLM", "--listen", "tcp://127.0.0.1:0",
                 *FAKE, *cache]
            )  # fmt: skip
            procs.append(proc)
            addresses.append(address)
        config = Path(tempfile.mkdtemp()) / "bls.toml"
        lines = ["[stages.generator]", f"remote = {json.dumps(addresses)}"]
        if affinity:
            lines.append('affinity = { function = "bls.models.vllm:prefix_key" }')
        config.write_text("\n".join(lines) + "\n")
        urls = []
        for _ in range(2):
            proc, url = spawn(
                [BLS, "serve", SCRIPT, "--port", "0", "--config", str(config),
                 "--no-access-log", "--log-level", "warning"]
            )  # fmt: skip
            procs.append(proc)
            urls.append(url)
        results = asyncio.run(workload(urls, conversations, turns))
    finally:
        stop_all(procs)
    later = [r for r in results if r[0] > 0]
    return {
        "hit rate": sum(r[3] for r in later) / sum(r[2] for r in later),
        "ttft p50 ms": statistics.median(r[1] for r in later) * 1000,
        "ttft p90 ms": statistics.quantiles([r[1] for r in later], n=10)[-1] * 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--cache-blocks", default="20000,192", help="per replica, comma-separated")
    ap.add_argument(
        "--tpot-ms", type=float, default=1, help="between an answer's tokens (default: 1)"
    )
    opts = ap.parse_args()
    for blocks in (int(b) for b in opts.cache_blocks.split(",")):
        seen: dict[str, list[dict[str, float]]] = {name: [] for name in MODES}
        names = list(MODES)
        for r in range(opts.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                got = run_mode(name, opts.conversations, opts.turns, blocks, opts.tpot_ms)
                seen[name].append(got)
        report(seen, opts, blocks)


def report(seen: dict[str, list[dict[str, float]]], opts: argparse.Namespace, blocks: int) -> None:
    print(
        f"\n{opts.conversations} conversations x {opts.turns} turns, 2 frontends, "
        f"{blocks} cached blocks a replica ({blocks * 2} for one alone), {opts.rounds} "
        "round(s): median [min-max] over rounds (turns after the first)\n"
    )
    print("| mode | replicas | prefix-cache hit rate | TTFT p50 ms | TTFT p90 ms |")
    print("| --- | --- | --- | --- | --- |")
    for name, runs in seen.items():
        cells = [spread([run[k] for run in runs], f) for k, f in
                 (("hit rate", ".3f"), ("ttft p50 ms", ".1f"), ("ttft p90 ms", ".1f"))]  # fmt: skip
        print(f"| {name} | {MODES[name][0]} | " + " | ".join(cells) + " |")
    rounds = range(opts.rounds)
    hit = [seen["affinity"][i]["hit rate"] / seen["one replica"][i]["hit rate"] for i in rounds]
    ttft = [
        seen["least outstanding"][i]["ttft p50 ms"] / seen["affinity"][i]["ttft p50 ms"]
        for i in rounds
    ]
    print(f"\naffinity hit rate / one replica's: {spread(hit)} (target >= 0.9)")
    print(f"TTFT p50, least outstanding / affinity: {spread(ttft)} (target >= 2)")


if __name__ == "__main__":
    main()
