"""`bls serve --processes 2` against one process, on the same script, under wrk.

    python bench/frontend_processes.py [--rounds 3] [--seconds 3] [--connections 64]

Starts a `bls worker` (bench/serving/app.py's remote echo, bound but unused here) and two
servers of bench/serving/app.py: one with `--processes 2`, one without, each with
`--max-inflight 1024`. wrk (one thread) drives `noop` (no stage) and `inline` (one stage
in process) on each in turn, over --rounds rounds. CPU per request is the serving
processes' (the children's, for --processes 2), from /proc; the table gives the median
[min-max] over rounds of throughput and CPU, and their ratios (2 processes / 1).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _procs import BLS, SERVING_APP, cpu_seconds, serve_app, spawn, spread, stop_all  # noqa: E402
from frontend import measure_wrk  # noqa: E402


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (Linux's /proc/PID/task/PID/children)."""
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def measure(pids: list[int], url: str, path: str, connections: int, seconds: float) -> tuple:
    """(req/s, CPU µs per request over ``pids``)."""
    before = sum(cpu_seconds(p) for p in pids)
    rps, _, _ = measure_wrk(url, path, connections, seconds)
    used = sum(cpu_seconds(p) for p in pids) - before
    return rps, used / max(rps * seconds, 1) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=64)
    args = parser.parse_args()
    procs = []
    try:
        worker, address = spawn(
            [BLS, "worker", f"{SERVING_APP}:echo", "--listen", "tcp://127.0.0.1:0"]
        )
        procs.append(worker)
        one, one_url = serve_app(address, "--max-inflight", "1024")
        procs.append(one)
        two, two_url = serve_app(address, "--max-inflight", "1024", "--processes", "2")
        procs.append(two)
        pids = {"1 process": [one.pid], "2 processes": children(two.pid)}
        urls = {"1 process": one_url, "2 processes": two_url}
        print(f"wrk -t1 -c{args.connections}, {args.seconds:g} s each, {args.rounds} rounds\n")
        print("| script | processes | req/s | CPU µs/request |")
        print("| --- | --- | --- | --- |")
        for entry in ("noop", "inline"):
            got: dict[str, list[tuple[float, float]]] = {k: [] for k in pids}
            for r in range(args.rounds):
                order = list(pids) if r % 2 == 0 else list(pids)[::-1]
                for kind in order:
                    path = f"/v1/scripts/{entry}"
                    got[kind].append(
                        measure(pids[kind], urls[kind], path, args.connections, args.seconds)
                    )
            for kind, rows in got.items():
                rate = spread([r for r, _ in rows], ",.0f")
                print(f"| {entry} | {kind} | {rate} | {spread([c for _, c in rows], '.0f')} |")
            pairs = list(zip(got["1 process"], got["2 processes"], strict=True))
            print(
                f"| {entry} | 2 / 1 | {spread([b[0] / a[0] for a, b in pairs])} "
                f"| {spread([b[1] / a[1] for a, b in pairs])} |",
                flush=True,
            )
    finally:
        stop_all(procs)


if __name__ == "__main__":
    main()
