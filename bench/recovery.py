"""Recovery of background runs after a frontend is killed with SIGKILL.

    python bench/recovery.py [--runs 200] [--steps 6] [--slow 0.2] [--lease 2]

A `bls worker` serves `slow` (each call noted as it starts, answered after --slow s);
`bls serve bench/serving/steps.py --runs sqlite://TMP` runs `steps` (--steps calls to
`slow` in turn) as background runs. --runs runs are submitted at once; when about half
of their calls have started, the frontend gets SIGKILL; a second one starts on the same
store. Printed: how long the second took to start, how long until every unfinished run
was running in it again (its leases run --lease s past the kill), until every run
ended; the calls executed twice, split into those the journal had finished before the
kill (the target is 0) and those in flight then (sent again: the stage is idempotent);
and whether every run answered what an uninterrupted run answers.
"""

from __future__ import annotations

import argparse
import collections
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import msgspec

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _procs import BLS, spawn, stop_all  # noqa: E402

STEPS = str(HERE / "serving" / "steps.py")


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def _finished(db: Path) -> set[tuple[int, int]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT call FROM calls WHERE done = 1").fetchall()
    out = set()
    for (data,) in rows:
        req = msgspec.msgpack.decode(msgspec.msgpack.decode(data)["request"])
        out.add((req["run"], req["step"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--slow", type=float, default=0.2)
    parser.add_argument("--lease", type=float, default=2.0)
    args = parser.parse_args()
    procs: list[subprocess.Popen[str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        calls = Path(tmp) / "calls"
        db = Path(tmp) / "runs.sqlite3"
        env = {"BLS_BENCH_CALLS": str(calls), "BLS_BENCH_SLOW_S": str(args.slow)}
        try:
            worker, address = spawn(
                [BLS, "worker", f"{STEPS}:slow", "--listen", "tcp://127.0.0.1:0"], env=env
            )
            procs.append(worker)
            config = Path(tmp) / "bls.toml"
            config.write_text(
                f'[stages.slow]\nremote = "{address}"\nidempotent = true\n'
                f"[runs]\nlease_s = {args.lease}\nmax_running = {args.runs}\n"
            )
            store = f"sqlite://{db}"
            quiet = ["--no-access-log", "--log-level", "warning"]
            serve = [BLS, "serve", STEPS, "--port", "0", "--runs", store, "--config", str(config)]
            serve += quiet
            first, url = spawn(serve)
            procs.append(first)
            ids = {}
            with httpx.Client(timeout=30) as http:
                for n in range(args.runs):
                    answer = http.post(
                        f"{url}/v1/scripts/steps",
                        json={"n": n, "steps": args.steps},
                        headers={"prefer": "respond-async"},
                    )
                    ids[n] = answer.json()["id"]
            half = args.runs * args.steps // 2
            while (len(calls.read_text().splitlines()) if calls.exists() else 0) < half:
                time.sleep(0.01)
            first.send_signal(signal.SIGKILL)
            killed = time.perf_counter()
            first.wait()
            finished = _finished(db)
            with sqlite3.connect(db) as conn:
                unfinished = conn.execute(
                    "SELECT count(*) FROM runs WHERE status IN ('queued', 'running')"
                ).fetchone()[0]
            second, url = spawn(serve)
            procs.append(second)
            ready = time.perf_counter() - killed
            while _metric(url, "bls_runs_in_flight") + _metric(url, "bls_runs_ended") < unfinished:
                time.sleep(0.01)
            running = time.perf_counter() - killed
            with httpx.Client(timeout=30) as http:
                right = 0
                for n, run_id in ids.items():
                    while (done := http.get(f"{url}/v1/runs/{run_id}").json())["status"] in (
                        "queued",
                        "running",
                    ):
                        time.sleep(0.02)
                    want = {"n": n, "out": [f"{n}:{s}" for s in range(args.steps)]}
                    right += done["status"] == "succeeded" and done["result"] == want
            ended = time.perf_counter() - killed
            started = collections.Counter(
                tuple(map(int, line.split())) for line in calls.read_text().splitlines()
            )
            twice = {key for key, count in started.items() if count > 1}
            print(f"{args.runs} runs x {args.steps} calls of {args.slow}s, lease {args.lease}s")
            print(f"killed with {unfinished} run(s) unfinished, {len(finished)} call(s) finished")
            print(f"second frontend ready after       {ready:6.2f} s")
            print(f"every unfinished run running again {running:6.2f} s after the kill")
            print(f"every run ended                   {ended:6.2f} s after the kill")
            print(f"finished calls executed twice: {len(twice & finished)} (target 0)")
            print(f"in-flight calls sent again:    {len(twice - finished)}")
            print(f"runs answered as uninterrupted: {right}/{args.runs}")
        finally:
            stop_all(procs)


if __name__ == "__main__":
    main()
