"""Scaling out through etcd: throughput with 1, 2 and 4 replicas on separate hosts, and how
fast a replica joins and leaves.

    python bench/scale.py [--seconds 5] [--concurrency 32]     (as root: it builds hosts)

Builds network namespaces as hosts (tests/e2e/hosts.py): etcd, the frontend, the client
and one host per worker. Each worker serves the `serial` stage — one call at a time,
10 ms each, so a replica serves at most 100 calls/s whatever the cores (this machine
has two, fewer than the replicas) — and registers in etcd; the frontend
(`bls serve bench/serving/scale_app.py`) finds them through etcd; `bls bench` drives it
from the client host. Then, under load: the time from a worker's start to its
registration and to the frontend routing to it, and from its death (SIGKILL) to the
frontend dropping its connection and to etcd removing it (the lease).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
from e2e.etcd import EtcdServer  # noqa: E402
from e2e.hosts import can_build_hosts, hosts  # noqa: E402
from e2e.procs import Proc, start, stop, wait_for  # noqa: E402

BLS = str(Path(sys.executable).with_name("bls"))
APP = str(HERE / "serving" / "scale_app.py")
STAGE = f"{HERE}/_stages.py:serial"


def stamp(line: str) -> float:
    """The epoch time of a log line ("2026-12-03 13:13:48,305 ...", local time)."""
    when = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return when.timestamp()


def first(proc: Proc, text: str, after: float = 0.0) -> float:
    for line in proc.lines:
        if text in line and line[:4].isdigit() and stamp(line) >= after:
            return stamp(line)
    raise AssertionError(f"{text!r} not in the log")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    why = can_build_hosts()
    if why:
        sys.exit(f"bench/scale.py needs network namespaces: {why}")
    names = ["etcd", "front", "client", "w1", "w2", "w3", "w4"]
    with hosts(names, delay_ms=0.5) as net, tempfile.TemporaryDirectory() as tmp:
        etcd = EtcdServer(Path(tmp) / "etcd", host=net.address("etcd"), run=net.run("etcd"))
        etcd.start()
        procs: list[Proc] = []
        try:
            frontend = start(
                ["serve", APP, "--host", net.address("front"), "--port", "8000",
                 "--bind", "serial=etcd:serial", "--discovery", etcd.url,
                 "--connect-timeout", "0.5", "--max-inflight", "1024", "--no-access-log"],
                program=[*net.run("front"), BLS],
            )  # fmt: skip
            procs.append(frontend)
            url = frontend.address

            def worker(host: str) -> Proc:
                proc = start(
                    ["worker", STAGE, "--listen", f"tcp://{net.address(host)}:5555",
                     "--discovery", etcd.url, "--log-level", "info"],
                    program=[*net.run(host), BLS],
                )  # fmt: skip
                procs.append(proc)
                return proc

            def load(seconds: float) -> dict[str, object]:
                out = subprocess.run(
                    [*net.run("client"), BLS, "bench", url, "--entry", "encode",
                     "--input", '{"data": ""}', "-c", str(args.concurrency),
                     "-d", str(seconds), "--json"],
                    capture_output=True, text=True, timeout=seconds + 60,
                )  # fmt: skip
                return dict(json.loads(out.stdout))

            def routed() -> int:
                return sum("answered: it takes calls now" in line for line in frontend.lines)

            rows = []
            workers: list[Proc] = []
            for n in (1, 2, 4):
                while len(workers) < n:
                    workers.append(worker(f"w{len(workers) + 1}"))
                wait_for(lambda n=n: routed() >= n, timeout=20)  # type: ignore[misc]
                load(1.0)  # warm up
                runs = [load(args.seconds) for _ in range(args.rounds)]
                rps = sorted(float(r["requests_per_s"]) for r in runs)  # type: ignore[arg-type]
                p50 = sorted(r["latency_ms"]["p50"] for r in runs)  # type: ignore[index]
                errors = sum(sum(r["errors"].values()) for r in runs)  # type: ignore[attr-defined]
                rows.append((n, rps, p50, errors))

            # Join under load: a fifth worker would need a host; reuse w4's slot after a
            # leave instead. Leave first: SIGKILL w4's worker mid-load.
            victim = workers[-1]
            background = subprocess.Popen(
                [*net.run("client"), BLS, "bench", url, "--entry", "encode", "--input",
                 '{"data": ""}', "-c", str(args.concurrency), "-d", "8", "--json"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
            time.sleep(1.5)
            killed = time.time()
            victim.signal(9)
            wait_for(lambda: " left" in frontend.log(), timeout=15)
            lost = first(frontend, "lost tcp://", after=killed - 0.01)
            left = first(frontend, " left", after=killed - 0.01)
            stop(victim.popen)
            workers.pop()
            spawned = time.time()
            newcomer = worker("w4")
            wait_for(lambda: routed() >= 5, timeout=20)
            registered = first(newcomer, "registered in etcd")
            taken = first(frontend, "answered: it takes calls now", after=spawned)
            during, _ = background.communicate(timeout=60)
            during_errors = json.loads(during)["errors"]
        finally:
            for proc in procs:
                stop(proc.popen)
            etcd.stop()

    base = rows[0][1][len(rows[0][1]) // 2]
    print(
        f"bls scaling through etcd: `serial` replicas (10 ms per call, one at a time) on "
        f"separate hosts, {args.concurrency} connections from a client host, "
        f"{args.rounds} runs of {args.seconds:g} s; {os.cpu_count()} cores"
        + (f"; no added latency ({net.no_delay})" if net.no_delay else "; 0.5 ms each way")
        + "\n"
    )
    print(
        "| replicas | requests/s, median [min-max] | per replica ÷ one replica | p50 ms | errors |"
    )
    print("| --- | --- | --- | --- | --- |")
    for n, rps, p50, errors in rows:
        mid = rps[len(rps) // 2]
        print(
            f"| {n} | {mid:.0f} [{rps[0]:.0f}-{rps[-1]:.0f}] | {mid / n / base:.2f} "
            f"| {p50[len(p50) // 2]:.1f} | {errors} |"
        )
    print()
    print(f"- a worker's start to its registration in etcd: {registered - spawned:.2f} s")
    print(f"- registration to the frontend routing calls to it: {taken - registered:.3f} s")
    print(f"- a worker killed to the frontend dropping its connection: {lost - killed:.3f} s")
    print(f"- killed to its removal from the replica set (lease expiry): {left - killed:.2f} s")
    print(
        f"- errors in the 8 s of load across the kill and the join: {during_errors or 'none'}"
        " (calls the killed worker had started: they fail, they are not re-run)"
    )


if __name__ == "__main__":
    main()
