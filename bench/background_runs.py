"""What the journal costs: background runs of a three-stage remote script against
synchronous requests of the same script, side by side, on one `bls serve`, for each store
(SQLite, PostgreSQL).

    python bench/background_runs.py [--rounds 3] [--runs 200] [--levels 1,16]
                                    [--stores sqlite,postgresql]

Starts a `bls worker` (the remote `echo` stage) and, per store, `bls serve
bench/serving/app.py --runs sqlite://TMP/runs.sqlite3` or `--runs postgresql://...` (a
PostgreSQL cluster of its own, made in TMP and started on loopback with the server's
defaults, as tests/e2e/postgres.py makes it: Debian's `postgresql`, and psycopg, are
needed for that store). At each concurrency level, C clients each send their
share of requests one after another: a synchronous client sends `POST
/v1/scripts/three` and reads the answer; a background client sends it with `Prefer:
respond-async`, then reads `GET /v1/runs/ID/events` to the run's `end` (what a client
of a background run does: two requests, and a third to read the run); a "bg submit"
client only submits its runs, and the round ends when none is queued or running (what
the runs themselves cost the server). The contenders alternate over rounds; the table
gives the median [min-max] of throughput (runs a second) and of the server's CPU time per
run (from /proc), and their ratios (background / synchronous).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from _procs import BLS, SERVING_APP, cpu_seconds, serve_app, spawn, spread, stop_all  # noqa: E402

BODY = {"text": "hello"}


async def _sync(client: httpx.AsyncClient, url: str, n: int) -> None:
    for _ in range(n):
        answer = await client.post(f"{url}/v1/scripts/three", json=BODY)
        assert answer.status_code == 200, answer.text


async def _background(client: httpx.AsyncClient, url: str, n: int) -> None:
    for _ in range(n):
        answer = await client.post(
            f"{url}/v1/scripts/three", json=BODY, headers={"prefer": "respond-async"}
        )
        assert answer.status_code == 202, answer.text
        run_id = answer.json()["id"]
        async with client.stream("GET", f"{url}/v1/runs/{run_id}/events") as events:
            async for line in events.aiter_lines():
                if line == "event: end":
                    break
        done = (await client.get(f"{url}/v1/runs/{run_id}")).json()
        assert done["status"] == "succeeded", done


async def _submitted(client: httpx.AsyncClient, url: str, n: int) -> None:
    for _ in range(n):
        answer = await client.post(
            f"{url}/v1/scripts/three", json=BODY, headers={"prefer": "respond-async"}
        )
        assert answer.status_code == 202, answer.text


async def _all_ended(client: httpx.AsyncClient, url: str) -> None:
    """Until no run is queued or running (looked at every 20 ms)."""
    while True:
        for status in ("queued", "running"):
            page = await client.get(f"{url}/v1/runs", params={"status": status, "limit": 1})
            if page.json()["data"]:
                break
        else:
            return
        await asyncio.sleep(0.02)


CONTENDERS = {"sync": _sync, "background": _background, "bg submit": _submitted}


async def _round(kind: str, url: str, clients: int, runs: int, pid: int) -> tuple[float, float]:
    """(runs a second, server CPU seconds per run) of one contender."""
    each = max(1, runs // clients)
    limits = httpx.Limits(max_connections=clients * 2)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        go = CONTENDERS[kind]
        await go(client, url, 2)  # warm
        await _all_ended(client, url)
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(go(client, url, each) for _ in range(clients)))
        if kind == "bg submit":
            await _all_ended(client, url)
        wall, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    return each * clients / wall, cpu / (each * clients)


def _measure(url: str, pid: int, levels: list[int], rounds: int, runs_each: int) -> None:
    print(f"{'level':>6} {'contender':>11} {'runs/s':>18} {'CPU ms/run':>18}")
    for level in levels:
        runs = runs_each if level > 1 else max(20, runs_each // 4)
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in CONTENDERS}
        for _ in range(rounds):
            for kind in CONTENDERS:
                got[kind].append(asyncio.run(_round(kind, url, level, runs, pid)))
        for kind, rows in got.items():
            rate = spread([r for r, _ in rows], ".0f")
            cpu = spread([c * 1000 for _, c in rows])
            print(f"{level:>6} {kind:>11} {rate:>18} {cpu:>18}")
        for kind in ("background", "bg submit"):
            pairs = list(zip(got["sync"], got[kind], strict=True))
            rates = [b[0] / s[0] for s, b in pairs]
            cpus = [b[1] / s[1] for s, b in pairs]
            print(
                f"{level:>6} {kind + ' / sync':>11} {spread(rates):>18} "
                f"{spread(cpus):>18}   (throughput median {statistics.median(rates):.2f}x)"
            )


def _postgres(stack: contextlib.ExitStack) -> str:
    """A PostgreSQL database of a cluster made for this run (stopped with ``stack``)."""
    from e2e.postgres import PostgresServer, require_postgres

    require_postgres()
    server = PostgresServer()
    stack.callback(server.stop)
    server.start()
    return server.database()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=200, help="per contender and round")
    parser.add_argument("--levels", default="1,16", help="concurrency levels, comma-separated")
    parser.add_argument("--stores", default="sqlite,postgresql", help="comma-separated")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    procs = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        try:
            worker, address = spawn(
                [BLS, "worker", f"{SERVING_APP}:echo", "--listen", "tcp://127.0.0.1:0"]
            )
            procs.append(worker)
            for kind in args.stores.split(","):
                store = f"sqlite://{tmp}/runs.sqlite3" if kind == "sqlite" else _postgres(stack)
                server, url = serve_app(address, "--runs", store, "--max-inflight", "256")
                procs.append(server)
                print(f"store: {kind}")
                _measure(url, server.pid, levels, args.rounds, args.runs)
                stop_all([server])
        finally:
            stop_all(procs)


if __name__ == "__main__":
    main()
