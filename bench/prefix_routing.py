"""Cache-aware routing for an LLM stage: a multi-turn chat workload (`bls bench --chat
--turns`) through two frontends (processes that share nothing) onto FakeLLM replicas
with a simulated prefix cache, affinity by prompt prefix against least-outstanding, and
one replica alone (every turn finds its conversation's prefix: the hit rate to reach).

    python bench/prefix_routing.py [--rounds 3] [--conversations 16] [--turns 6]
                                   [--cache-blocks 20000,192] [--tpot-ms 10] [--replicas 2]
                                   [--balance B] [--prefill-lanes 1] [--policy TOML]

The frontends serve examples/chat/chat.py (the OpenAI chat endpoint) with its generator
on the replicas. `bls bench` holds ``--conversations`` conversations side by side, one a
connection: each turn sends the whole conversation so far, the engine's answers
included, and a conversation's turns go to the two frontends in turn (as a round-robin
load balancer sends them). The replicas (`bls worker bls.models.fakellm:FakeLLM`) take
``prefill_ms`` per prompt token their cache does not hold before the first token, then
``--tpot-ms`` between tokens; each prefills ``--prefill-lanes`` prompts at a time (the
others wait their turn, as prompts wait for an engine's compute; 0: each prompt as if
alone), so that a miss delays the turns behind it too; and they report the tokens their
cache held in each answer's ``usage``. The whole run is made once per cache size
(``--cache-blocks``: blocks of 16 tokens a replica keeps; the one replica of the first
mode keeps ``--replicas`` times as many, the memory of them all): a roomy one, where
every replica holds every conversation it saw, and a full one (192 blocks), where each
replica holds the blocks of half the conversations by their last turn but not those of
all of them, as a real engine's KV cache is full under load. Each mode starts fresh
workers and frontends; the modes take turns for ``--rounds`` rounds. The stage keeps its
defaults but for ``--balance`` (affinity's bound) and each ``--policy`` line (both
modes: ``--policy "eject = { slower = 0 }"`` turns ejection's lag rule off, as
docs/policy.md advises with prefix affinity). Prints the prefix-cache hit rate (cached /
prompt tokens, over every turn after a conversation's first), time to first token of
those turns and the replicas ejected (the frontends' ``bls_stage_ejections_total``),
median [min-max] over rounds, and the ratios the targets are stated in.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from _procs import BLS, spawn, spread, stop_all

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "examples/chat/chat.py")
FAKE = [
    "--option", "ttft_ms=2", "--option", "prefill_ms=0.5", "--option", "block_tokens=16",
]  # fmt: skip
MODES = {  # name: (one replica alone, affinity)
    "one replica": (True, False),
    "affinity": (False, True),
    "least outstanding": (False, False),
}
FIRST_TURN = {
    "model": "tiny",
    "messages": [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "tell me about this topic, in detail: " * 6},
    ],
    "max_tokens": 48,
    "ignore_eos": True,
}


def converse(urls: list[str], conversations: int, turns: int) -> dict[str, Any]:
    """`bls bench`'s summary of ``conversations`` conversations of ``turns`` turns."""
    command = [
        BLS, "bench", *urls, "--chat", "--turns", str(turns), "--stream", "--json",
        "-c", str(conversations), "-n", str(conversations * turns),
        "--input", json.dumps(FIRST_TURN),
    ]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"bls bench failed: {out.stderr[-2000:]}")
    summary = json.loads(out.stdout)
    if summary["errors"]:
        raise RuntimeError(f"bls bench: errors {summary['errors']}")
    return summary["conversations"]


def ejected(url: str) -> float:
    """The replicas the frontend at ``url`` took out of rotation (``/metrics``)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as got:
        lines = got.read().decode().splitlines()
    return sum(float(x.split()[-1]) for x in lines if x.startswith("bls_stage_ejections_total{"))


def run_mode(name: str, opts: argparse.Namespace, blocks: int) -> dict[str, float]:
    alone, affinity = MODES[name]
    replicas = 1 if alone else opts.replicas
    cache = ["--option", f"prefix_cache={blocks * opts.replicas // replicas}"]  # (same memory)
    cache += [
        "--option",
        f"tpot_ms={opts.tpot_ms}",
        "--option",
        f"prefill_lanes={opts.prefill_lanes}",
    ]
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
        lines += opts.policy
        if affinity:
            balance = f", balance = {opts.balance}" if opts.balance else ""
            lines.append(f'affinity = {{ function = "bls.models.vllm:prefix_key"{balance} }}')
        config.write_text("\n".join(lines) + "\n")
        urls = []
        for _ in range(2):
            proc, url = spawn(
                [BLS, "serve", SCRIPT, "--port", "0", "--config", str(config),
                 "--no-access-log", "--log-level", "warning"]
            )  # fmt: skip
            procs.append(proc)
            urls.append(url)
        talks = converse(urls, opts.conversations, opts.turns)
        ejections = sum(ejected(url) for url in urls)
    finally:
        stop_all(procs)
    firsts = talks["later_first_item_ms"]
    return {
        "hit rate": talks["hit_rate"],
        "ttft p50 ms": firsts["p50"],
        "ttft p90 ms": firsts["p90"],
        "ejections": ejections,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--cache-blocks", default="20000,192", help="per replica, comma-separated")
    ap.add_argument(
        "--tpot-ms", type=float, default=10, help="between an answer's tokens (default: 10)"
    )
    ap.add_argument(
        "--replicas", type=int, default=2, help="for affinity and least outstanding (default: 2)"
    )
    ap.add_argument("--balance", type=float, help="affinity's load bound (default: the stage's)")
    ap.add_argument(
        "--policy", action="append", default=[], metavar="TOML",
        help="a line for the stage's table, both modes (e.g. 'eject = { slower = 0 }')",
    )  # fmt: skip
    ap.add_argument(
        "--prefill-lanes", type=int, default=1,
        help="prompts a replica prefills at once (default: 1; 0: no limit)",
    )  # fmt: skip
    opts = ap.parse_args()
    for blocks in (int(b) for b in opts.cache_blocks.split(",")):
        seen: dict[str, list[dict[str, float]]] = {name: [] for name in MODES}
        names = list(MODES)
        for r in range(opts.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                got = run_mode(name, opts, blocks)
                seen[name].append(got)
        report(seen, opts, blocks)


def report(seen: dict[str, list[dict[str, float]]], opts: argparse.Namespace, blocks: int) -> None:
    print(
        f"\n{opts.conversations} conversations x {opts.turns} turns, 2 frontends, "
        f"{blocks} cached blocks a replica ({blocks * opts.replicas} for one alone), "
        f"{opts.prefill_lanes or 'unlimited'} prefill lane(s), {opts.rounds} "
        "round(s): median [min-max] over rounds (turns after the first)\n"
    )
    print("| mode | replicas | prefix-cache hit rate | TTFT p50 ms | TTFT p90 ms | ejections |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, runs in seen.items():
        cells = [spread([run[k] for run in runs], f) for k, f in
                 (("hit rate", ".3f"), ("ttft p50 ms", ".1f"), ("ttft p90 ms", ".1f"),
                  ("ejections", ".0f"))]  # fmt: skip
        replicas = 1 if MODES[name][0] else opts.replicas
        print(f"| {name} | {replicas} | " + " | ".join(cells) + " |")
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
