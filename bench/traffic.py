"""Traffic policy against real processes: hedging one slow replica away, ejecting one that
fails every call (real `bls worker` replicas), and admission under `bls serve` (a high
priority class, and a quiet tenant, beside a flood at 10x capacity).

    python bench/traffic.py [--part hedging|ejection|priority|tenants] [--calls 200]
                           [--rounds 3] [--seconds 5] [--flood-nice N]

Hedging: three replicas of a stage, one answering in 200 ms and two in 2 ms; calls one at
a time from a bls runtime, with neither hedging nor ejection, with ejection alone (the
default), with `hedge = { after_ms = 20 }` with and without ejection, and with
`after = "p95"`; the contenders take turns each round; p50/p99 per round, median
[min-max], the extra copies hedging sent, and the p99 of the fast replicas alone (the
target: hedged p99 under twice that). Ejection: three replicas, one failing every call;
how many of the calls fail for the client without ejection, with it, and with it and a
retry.

Priority and tenants: `bls serve` of one entry whose stage takes 20 ms (inline), with
`--max-inflight 8 --max-queued 32`: 8 slots, 400 requests a second. The measured class is
2 keep-alive connections in a process of their own, each sending again as soon as it is
answered; the flood, 80 connections in another, sending 4,000 requests a second in all
(10x capacity; a connection whose request waits sends its next when it is answered). Measured:
the measured class's p50/p99 alone and beside the flood (median [min-max] over rounds,
the two taking turns), and the server's CPU per answered request from /proc.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _load import Load
from _procs import BLS, cpu_seconds, spawn, spread
from policy_stages import Done, Job

import bls
from bls.policy import policy_from

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
    from bls.targets import binding_for

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
    return latencies, failed, binding.state.counts


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def hedging(args: argparse.Namespace, procs: list[Any]) -> None:
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
        "hedge after=p95, ejection off": (everyone, {**hedge, "hedge": {"after": "p95"}, **off}),
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


def ejection(args: argparse.Namespace, procs: list[Any]) -> None:
    fast = [replica(f"fast{i}", BLS_REPLICA_DELAY_MS="2") for i in range(2)]
    broken, broken_addr = replica("broken", BLS_REPLICA_FAILS="crash")
    procs += [p for p, _ in fast] + [broken]
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


SLOTS, STAGE_MS, FLOOD = 8, 20, 80


def serving(config: str, folder: Path) -> tuple[Any, str]:
    """``bls serve`` of policy_stages.py's entry, its stage inline taking STAGE_MS."""
    path = folder / "admission.toml"
    path.write_text(config)
    os.environ["BLS_REPLICA_DELAY_MS"] = str(STAGE_MS)
    try:
        return spawn(
            [BLS, "serve", STAGES, "--port", "0", "--bind", f"work={STAGES}:work",
             "--max-inflight", str(SLOTS), "--config", str(path),
             "--no-access-log", "--log-level", "warning"]
        )  # fmt: skip
    finally:
        del os.environ["BLS_REPLICA_DELAY_MS"]


def measured(
    pid: int,
    url: str,
    mine: dict[str, str],
    flood: dict[str, str] | None,
    seconds: float,
    nice: int = 0,
) -> tuple[float, float, float, float, float]:
    """The measured class's (p50 ms, p99 ms, share answered 200), the server's CPU µs
    per answered request, and the flood's answers a second, with the flood beside it or not."""
    cpu = cpu_seconds(pid)
    if flood is None:
        with Load(url, "/v1/scripts/one", mine, 2, seconds) as load:
            rows, other = load.result(), []
    else:
        rate = 10 * SLOTS * 1000 / STAGE_MS / FLOOD  # each connection's share of 10x
        with Load(url, "/v1/scripts/one", flood, FLOOD, seconds + 1.0, rate, nice=nice) as flooding:
            time.sleep(0.5)
            with Load(url, "/v1/scripts/one", mine, 2, seconds) as load:
                rows = load.result()
            other = flooding.result()
    used = cpu_seconds(pid) - cpu
    ok = [t * 1000 for t, status in rows if status == 200]
    answered = len(rows) + len(other)
    flood_rate = len(other) / (seconds + 1.0)
    return pct(ok, 0.5), pct(ok, 0.99), len(ok) / len(rows), used / answered * 1e6, flood_rate


def admission_part(
    args: argparse.Namespace,
    procs: list[Any],
    title: str,
    mine: dict[str, str],
    flood: dict[str, str],
    variants: dict[str, str],
) -> None:
    results: dict[tuple[str, bool], list[tuple[float, float, float, float, float]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, config in variants.items():
            proc, url = serving(config, Path(folder))
            procs.append(proc)
            Load(url, "/v1/scripts/one", mine, 2, 0.5).__enter__().result()  # warm up
            for r in range(args.rounds):
                for flooded in (False, True) if r % 2 == 0 else (True, False):
                    other = flood if flooded else None
                    row = measured(proc.pid, url, mine, other, args.seconds, args.flood_nice)
                    results.setdefault((name, flooded), []).append(row)
            proc.terminate()
            proc.wait(10)
    print(
        f"\n{title}: {SLOTS} slots, stage {STAGE_MS} ms, {args.rounds} rounds of "
        f"{args.seconds:g} s, the flood's generator at nice {args.flood_nice}: median [min-max]\n"
    )
    print(
        "| admission | flood | p50 ms | p99 ms | answered 200 | server CPU µs/answer "
        "| flood answers/s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (name, flooded), rows in results.items():
        print(
            f"| {name} | {'yes' if flooded else 'no'} "
            f"| {spread([x[0] for x in rows], '.1f')} | {spread([x[1] for x in rows], '.1f')} "
            f"| {spread([x[2] * 100 for x in rows], '.0f')} % "
            f"| {spread([x[3] for x in rows], '.0f')} | {spread([x[4] for x in rows], '.0f')} |"
        )
    for name in variants:
        alone = statistics.median(x[1] for x in results[(name, False)])
        flooded = statistics.median(x[1] for x in results[(name, True)])
        print(f"\n{name}: p99 beside the flood / alone = {flooded / alone:.2f}")


def priority(args: argparse.Namespace, procs: list[Any]) -> None:
    admission_part(
        args,
        procs,
        "Priority: X-Priority 1 (2 connections) beside X-Priority -1 (80)",
        {"X-Priority": "1"},
        {"X-Priority": "-1"},
        {
            "queue 32": "[admission]\nmax_queued = 32\n",
            "queue 32, reserved 2": "[admission]\nmax_queued = 32\nreserved = 2\n",
        },
    )


def tenants(args: argparse.Namespace, procs: list[Any]) -> None:
    admission_part(
        args,
        procs,
        "Tenants: X-Tenant quiet (2 connections) beside X-Tenant flood (80)",
        {"X-Tenant": "quiet"},
        {"X-Tenant": "flood"},
        {
            "fair queue 32": "[admission]\nmax_queued = 32\n",
            "fair queue 32, each tenant max_inflight 4": (
                '[admission]\nmax_queued = 32\n[admission.tenants."*"]\nmax_inflight = 4\n'
            ),
        },
    )


PARTS = {"hedging": hedging, "ejection": ejection, "priority": priority, "tenants": tenants}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=list(PARTS), action="append")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--flood-nice",
        type=int,
        default=0,
        metavar="N",
        help="run the flood's load generator at this niceness (10: it takes no CPU the "
        "server or the measured client want, as a flood from other machines would not)",
    )
    args = parser.parse_args()
    procs: list[Any] = []
    try:
        for part in args.part or PARTS:
            PARTS[part](args, procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            proc.wait(10)


if __name__ == "__main__":
    main()
