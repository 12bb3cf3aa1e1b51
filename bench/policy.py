"""Traffic policy against real `bls worker` replicas: hedging one slow replica away, and
ejecting one that fails every call.

    python bench/policy.py [--calls 200] [--rounds 3]

Hedging: three replicas of a stage, one answering in 200 ms and two in 2 ms; calls one at
a time from a bls runtime, with neither hedging nor ejection, with ejection alone (the
default), with `hedge = { after_ms = 20 }` with and without ejection, and with
`after = "p95"`; the contenders take turns each round; p50/p99 per round, median
[min-max], the extra copies hedging sent, and the p99 of the fast replicas alone (the
target: hedged p99 under twice that). Ejection: three replicas, one failing every call;
how many of the calls fail for the client without ejection, with it, and with it and a
retry.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _procs import BLS, spread
from policy_stages import Done, Job

import bls
from bls.traffic import policy_from

STAGES = str(Path(__file__).resolve().parent / "policy_stages.py")


def replica(name: str, **env: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            BLS,
            "worker",
            f"{STAGES}:work",
            "--listen",
            "tcp://127.0.0.1:0",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "BLS_REPLICA_NAME": name, **env},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("ready "):
            return proc, line.split()[1]
    raise RuntimeError(f"replica {name} did not start")


async def run_calls(
    addresses: list[str], policy: dict[str, Any], calls: int, warm: int = 20
) -> tuple[list[float], int, Any]:
    """(latencies in ms, calls that failed, the binding's traffic counts), after ``warm``
    calls not measured."""
    from bls.bindings import binding_for

    binding = binding_for("work", ",".join(addresses))
    if policy:
        binding.set_policy(policy_from("work", policy))
    handle = bls.Stage("work", Job, Done)
    latencies: list[float] = []
    failed = 0
    async with bls.Runtime({"work": binding}, declared=[handle]) as rt:

        @bls.script
        async def one(req: Job) -> Done:
            return await handle(req)

        for n in range(warm):  # connections, and the latencies "p95" needs
            try:
                await rt.run(one, Job(n=-n))
            except bls.StageError:
                pass
        for n in range(calls):
            t0 = time.perf_counter()
            try:
                await rt.run(one, Job(n=n), timeout=5)
            except bls.StageError:
                failed += 1
            latencies.append((time.perf_counter() - t0) * 1000)
    return latencies, failed, binding.traffic


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    procs = []
    try:
        fast = [replica(f"fast{i}", BLS_REPLICA_DELAY_MS="2") for i in range(2)]
        slow = replica("slow", BLS_REPLICA_DELAY_MS="200")
        procs += [p for p, _ in [*fast, slow]]
        everyone = [a for _, a in fast] + [slow[1]]
        off = {"eject": {"failures": 0, "slower": 0}}
        hedge = {"idempotent": True, "hedge": {"after_ms": 20}}
        contenders = {
            "fast replicas alone": ([a for _, a in fast], off),
            "nothing (ejection off)": (everyone, off),
            "ejection (the default)": (everyone, {}),
            "hedge after_ms=20, ejection off": (everyone, {**hedge, **off}),
            "hedge after_ms=20 + ejection": (everyone, hedge),
            "hedge after=p95, ejection off": (
                everyone,
                {**hedge, "hedge": {"after": "p95"}, **off},
            ),
            "hedge after=p95 + ejection": (everyone, {**hedge, "hedge": {"after": "p95"}}),
        }
        results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in contenders}
        for r in range(args.rounds):
            order = list(contenders) if r % 2 == 0 else list(contenders)[::-1]
            for name in order:
                addresses, policy = contenders[name]
                lat, _, traffic = anyio.run(run_calls, addresses, policy, args.calls)
                extra = traffic.hedges / (args.calls + 20) * 100
                results[name].append((pct(lat, 0.5), pct(lat, 0.99), extra))
        print(
            f"Hedging: 3 replicas (2 answer in 2 ms, 1 in 200 ms), {args.calls} calls one at "
            f"a time, {args.rounds} rounds: median [min-max]\n"
        )
        print("| contender | p50 ms | p99 ms | extra calls sent |")
        print("| --- | --- | --- | --- |")
        for name, rows in results.items():
            print(
                f"| {name} | {spread([x[0] for x in rows], '.1f')} "
                f"| {spread([x[1] for x in rows], '.1f')} "
                f"| {spread([x[2] for x in rows], '.1f')} % |"
            )
        fast_p99 = statistics.median(x[1] for x in results["fast replicas alone"])
        for name in list(contenders)[1:]:
            ratio = statistics.median(x[1] for x in results[name]) / fast_p99
            print(f"\n{name}: p99 / fast replicas' p99 = {ratio:.2f} (target < 2)")

        broken, broken_addr = replica("broken", BLS_REPLICA_FAILS="crash")
        procs.append(broken)
        three = [a for _, a in fast] + [broken_addr]
        print(
            f"\nEjection: 3 replicas, 1 failing every call, {args.calls} calls one at a time, "
            "none before\n"
        )
        print("| policy | calls that failed | ejections |")
        print("| --- | --- | --- |")
        for name, policy in (
            ("eject = { failures = 0 } (off)", {"eject": {"failures": 0}}),
            ("default eject (5 failures, 1 s, doubling)", {}),
            ("default eject + retry", {"idempotent": True, "retry": {"on": ["RuntimeError"]}}),
        ):
            _, failed, traffic = anyio.run(run_calls, three, policy, args.calls, 0)
            print(f"| {name} | {failed} of {args.calls} | {traffic.ejections} |")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


if __name__ == "__main__":
    main()
