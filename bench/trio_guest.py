"""Serving trio: bls's own trio HTTP driver against trio as a guest of the asyncio loop.

    python bench/trio_guest.py [--seconds S] [--rounds N] [--levels C ...] [--wrk]

Three servers, the same one-stage inline script's work: the floor (bare Starlette on
Uvicorn, asyncio), the floor with that work handed to a trio run hosted by its asyncio loop
(``trio.lowlevel.start_guest_run``: Uvicorn keeps the HTTP, trio runs the script — the
least a guest-mode design would cost, before any of bls's own work), and `bls serve
--backend trio` (bls's sans-io HTTP core on its trio driver). They take turns for
``--rounds`` rounds; each ratio is the contender's / the floor's in that round, median
[min-max], with the server's CPU per request (user + system, /proc).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys

from _procs import BLS, SERVING_APP, serve_app, spawn, spread, stop_all
from frontend import measure_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the three taking turns")
    parser.add_argument("--levels", type=int, nargs="+", default=[32], help="concurrencies")
    parser.add_argument("--wrk", action="store_true", help="drive the load with wrk (installed)")
    args = parser.parse_args()
    if args.wrk and shutil.which("wrk") is None:
        parser.error("--wrk: wrk is not installed (apt-get install wrk)")
    procs = []
    try:
        worker, address = spawn(
            [BLS, "worker", f"{SERVING_APP}:echo", "--listen", "tcp://127.0.0.1:0"]
        )
        procs.append(worker)
        floor, floor_url = spawn([sys.executable, SERVING_APP, address])
        guest, guest_url = spawn([sys.executable, SERVING_APP, address, "--trio-guest"])
        server, bls_url = serve_app(address, "--backend", "trio", "--max-inflight", "1024")
        procs += [floor, guest, server]
        contenders = [
            ("floor", floor.pid, floor_url),
            ("trio guest", guest.pid, guest_url),
            ("bls trio", server.pid, bls_url),
        ]
        load = " under wrk" if args.wrk else ""
        print(
            f"inline script, {args.seconds:g} s each{load}, {args.rounds} round(s);"
            " ratios to the floor per round: median [min-max]\n"
        )
        print("| server | concurrency | req/s | throughput ratio | CPU µs/request | CPU ratio |")
        print("| --- | --- | --- | --- | --- | --- |")
        for c in args.levels:
            got: dict[str, list[tuple]] = {name: [] for name, _, _ in contenders}
            for r in range(args.rounds):
                turn = contenders[r % 3 :] + contenders[: r % 3]
                for name, pid, url in turn:
                    got[name].append(
                        measure_server(pid, url, "/v1/scripts/inline", c, args.seconds, args.wrk)
                    )
            for name, _, _ in contenders:
                pairs = list(zip(got["floor"], got[name], strict=True))
                print(
                    f"| {name} | {c} | {statistics.median(m[0] for m in got[name]):,.0f} "
                    f"| {spread([m[0] / f[0] for f, m in pairs])} "
                    f"| {statistics.median(m[3] for m in got[name]):.0f} "
                    f"| {spread([m[3] / f[3] for f, m in pairs])} |",
                    flush=True,
                )
    finally:
        stop_all(procs)


if __name__ == "__main__":
    main()
