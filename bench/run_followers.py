"""How soon a streaming background run's items reach a client that follows it through
another frontend on the same store (`bls serve --processes N`, or several frontends on
one store), against a client that follows it through the frontend running it.

    python bench/run_followers.py [--rounds 3] [--streams 1,20] [--items 100]
                                  [--interval 0.02] [--store sqlite|postgresql]

Starts two `bls serve bench/serving/app.py --runs URL` on one store (SQLite in a temporary
folder, or a PostgreSQL cluster of its own as bench/background_runs.py makes it). Per
round and level, S runs of the `ticks` entry (ITEMS items, one every INTERVAL seconds)
are submitted to the first, and each is followed through both at once (`GET
/v1/runs/ID/events`). An item's delay is when the second frontend's stream gave it after
the first's did (the first few items of a run left out: the two streams connect at
different moments). The table gives the median, 90th percentile and largest delay over
all rounds, the second frontend's CPU time (from /proc) per item and as a share of a core
while the streams ran, and the first's share (it runs the runs, writes their events and
serves its own streams), median [min-max] over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _procs import SERVING_APP, cpu_seconds, serve_app, spread, stop_all  # noqa: E402
from background_runs import _postgres  # noqa: E402

_SKIP = 3  # the first items of a run, which a stream may find already written


async def _follow(client: httpx.AsyncClient, url: str, run_id: str) -> dict[int, float]:
    """When each item event of the run came, by its id."""
    came: dict[int, float] = {}
    event = 0
    async with client.stream("GET", f"{url}/v1/runs/{run_id}/events") as answer:
        async for line in answer.aiter_lines():
            if line.startswith("id: "):
                event = int(line[4:])
            elif line == "event: item":
                came[event] = time.monotonic()
    return came


async def _round(
    owner: str, other: str, pids: tuple[int, int], streams: int, items: int, interval: float
) -> tuple[list[float], float, float, float]:
    """(each item's delay in seconds, the other frontend's CPU seconds per item, its
    share of a core, the owner's share of a core) for ``streams`` runs followed through
    both frontends."""
    limits = httpx.Limits(max_connections=4 * streams + 4)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        body = {"count": items, "interval": interval}
        ids = []
        for _ in range(streams):
            answer = await client.post(
                f"{owner}/v1/scripts/ticks", json=body, headers={"prefer": "respond-async"}
            )
            assert answer.status_code == 202, answer.text
            ids.append(answer.json()["id"])
        cpu0, t0 = [cpu_seconds(pid) for pid in pids], time.monotonic()
        pairs = await asyncio.gather(
            *(asyncio.gather(_follow(client, owner, r), _follow(client, other, r)) for r in ids)
        )
        wall = time.monotonic() - t0
        mine, theirs = (cpu_seconds(pid) - before for pid, before in zip(pids, cpu0, strict=True))
    delays = [
        there[event] - here[event]
        for here, there in pairs
        for event in sorted(here)[_SKIP:]
        if event in there
    ]
    assert len(delays) == streams * (items - _SKIP), "an item did not come through both"
    return delays, theirs / (streams * items), theirs / wall, mine / wall


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", default="1,20", help="runs followed at once, comma-separated")
    parser.add_argument("--items", type=int, default=100, help="items a run gives")
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between items")
    parser.add_argument("--store", choices=["sqlite", "postgresql"], default="sqlite")
    args = parser.parse_args()
    procs = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        try:
            store = f"sqlite://{tmp}/runs.sqlite3" if args.store == "sqlite" else _postgres(stack)
            echo = f"{SERVING_APP}:echo"  # (not called: the ticks entry streams inline)
            first, owner = serve_app(echo, "--runs", store)
            procs.append(first)
            second, other = serve_app(echo, "--runs", store)
            procs.append(second)
            pids = (first.pid, second.pid)
            print(f"store: {args.store}; {args.items} items a run, {args.interval}s apart")
            head = f"{'streams':>7} {'delay ms median / p90 / max':>28} {'CPU µs/item':>18}"
            print(f"{head} {'CPU % of a core':>18} {'owner CPU %':>18}")
            for level in (int(x) for x in args.streams.split(",")):
                delays: list[float] = []
                per_item, share, owner_share = [], [], []
                for _ in range(args.rounds):
                    got = asyncio.run(_round(owner, other, pids, level, args.items, args.interval))
                    delays += got[0]
                    per_item.append(got[1] * 1e6)
                    share.append(got[2] * 100)
                    owner_share.append(got[3] * 100)
                ms = [_quantile(delays, q) * 1000 for q in (0.5, 0.9, 1.0)]
                shown = " / ".join(f"{m:.0f}" for m in ms)
                print(
                    f"{level:>7} {shown:>28} {spread(per_item, '.0f'):>18} "
                    f"{spread(share, '.1f'):>18} {spread(owner_share, '.1f'):>18}"
                )
        finally:
            stop_all(procs)


if __name__ == "__main__":
    main()
