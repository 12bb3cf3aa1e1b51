"""Added cost of ``await stage()`` bound inline over a bare ``await fn(req)``.

    python bench/inline.py [--calls 200000]

Prints µs per call for both, and the ratio, on asyncio and trio, measured side by side
in one run (absolute times on a shared machine drift; compare the columns).
"""

from __future__ import annotations

import argparse
import time

import anyio

import bls
from bls import stage


class Req(bls.Message):
    text: str


class Resp(bls.Message):
    n: int


async def work(req: Req) -> Resp:
    return Resp(n=len(req.text))


async def bare(calls: int) -> float:
    req = Req(text="x" * 100)
    start = time.perf_counter()
    for _ in range(calls):
        await work(req)
    return time.perf_counter() - start


async def via_stage(calls: int) -> float:
    req = Req(text="x" * 100)
    async with bls.Runtime({"work": work}):
        start = time.perf_counter()
        for _ in range(calls):
            await stage("work", req)
        return time.perf_counter() - start


async def via_handle(calls: int) -> float:
    handle = bls.Stage("work", Req, Resp)
    req = Req(text="x" * 100)
    async with bls.Runtime({"work": work}):
        start = time.perf_counter()
        for _ in range(calls):
            await handle(req)
        return time.perf_counter() - start


async def measure(calls: int, rounds: int) -> dict[str, float]:
    best: dict[str, float] = {}
    for _ in range(rounds):  # interleaved, best of N: the least disturbed run of each
        for name, fn in (("bare", bare), ("stage", via_stage), ("handle", via_handle)):
            t = await fn(calls) / calls * 1e6
            best[name] = min(best.get(name, t), t)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"inline stage overhead, {args.calls} calls, best of {args.rounds}")
    print(
        f"{'backend':8} {'bare µs':>9} {'stage() µs':>11} {'added µs':>9} {'ratio':>6}"
        f" {'Stage µs':>9} {'added µs':>9}"
    )
    for backend in ("asyncio", "trio"):
        r = anyio.run(measure, args.calls, args.rounds, backend=backend)
        print(
            f"{backend:8} {r['bare']:9.3f} {r['stage']:11.3f} {r['stage'] - r['bare']:9.3f}"
            f" {r['stage'] / r['bare']:6.2f} {r['handle']:9.3f} {r['handle'] - r['bare']:9.3f}"
        )


if __name__ == "__main__":
    main()
