"""The same work in bls, Ray Serve and the Dynamo runtime, side by side in one run.

    python bench/compare_peers.py [--rounds 3] [--calls 3000] [--inflight 64]

Two measurements each, every contender on this host:

- a unary no-op remote call (100-byte payload), sequential: p50 and p99 latency;
- a two-stage composition (the caller → a first stage → a second stage, each in its own
  process), 64 calls in flight: calls/s.

bls: `bls worker` processes, the caller a bls runtime. Ray Serve 2.60.0: deployments
composed through DeploymentHandles, the caller the driver (Ray on 127.0.0.1, dashboard and
usage stats off). Dynamo runtime 1.6.1: components served with `serve_unary_endpoint`,
called with `UnaryClient`, file discovery and the TCP request plane (no etcd, no NATS).
Each peer installs into a virtual environment of its own, made here under
bench/.peers/ on first use; a peer that cannot be installed is skipped with the reason.
The contenders take turns for several rounds; prints medians [min-max] and ratios to bls.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = HERE / ".peers"
REQUIREMENTS = {"ray": ["ray[serve]==2.60.0"], "dynamo": ["ai-dynamo-runtime==1.6.1"]}


def environment(name: str) -> tuple[str | None, str]:
    """The peer's Python (installing it the first time), or None and why not."""
    folder = PEERS / name
    python = folder / "bin" / "python"
    marker = folder / ".installed"
    if marker.exists():
        return str(python), ""
    try:
        venv.create(folder, with_pip=True, clear=True)
        out = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
             *REQUIREMENTS[name]],
            capture_output=True, text=True, timeout=1200,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"cannot create its environment: {exc}"
    if out.returncode != 0:
        return None, "pip install failed: " + (out.stderr.strip().splitlines() or ["?"])[-1]
    marker.write_text(" ".join(REQUIREMENTS[name]))
    return str(python), ""


def run(
    python: str, driver: str, calls: int, inflight: int, env: dict[str, str]
) -> dict[str, float]:
    # Dynamo's file discovery outlives killed processes: each run gets a fresh store.
    env = {**env, "DYN_FILE_KV": tempfile.mkdtemp(prefix="bls-bench-dyn-")}
    out = subprocess.run(
        [python, str(HERE / "peers" / driver), str(calls), str(inflight)],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{driver} failed: {out.stderr.strip()[-2000:]}")
    return dict(json.loads(lines[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--inflight", type=int, default=64)
    args = parser.parse_args()
    contenders: dict[str, tuple[str, str]] = {"bls": (sys.executable, "bls_driver.py")}
    skipped = {}
    for name, driver in (("ray", "ray_driver.py"), ("dynamo", "dynamo_driver.py")):
        python, why = environment(name)
        if python is None:
            skipped[name] = why
        else:
            contenders[name] = (python, driver)
    env = dict(os.environ)
    env.update(
        DYN_DISCOVERY_BACKEND="file", DYN_REQUEST_PLANE="tcp", DYN_LOG="error,router=error",
        DYN_TCP_RPC_HOST="127.0.0.1", DYN_TCP_RESPONSE_STREAM_HOST="127.0.0.1",
        RAY_USAGE_STATS_ENABLED="0",
    )  # fmt: skip
    results: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
    failed = {}
    for r in range(args.rounds):
        order = list(contenders)[r % len(contenders) :] + list(contenders)[: r % len(contenders)]
        for name in order:
            if name in failed:
                continue
            python, driver = contenders[name]
            try:
                results[name].append(run(python, driver, args.calls, args.inflight, env))
            except RuntimeError as exc:
                failed[name] = str(exc)
            print(f"round {r + 1}: {name} done", file=sys.stderr, flush=True)

    def cell(name: str, key: str, fmt: str) -> str:
        values = [row[key] for row in results[name]]
        return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"

    print(
        f"bls vs Ray Serve vs Dynamo on one host ({os.cpu_count()} cores), {args.rounds} "
        f"rounds, median [min-max]; ratios are the peer's median over bls's\n"
    )
    print("| contender | unary p50 µs | unary p99 µs | two-stage chain, calls/s at "
          f"{args.inflight} in flight | p50 ÷ bls | calls/s ÷ bls |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- |")
    base = {k: statistics.median(r[k] for r in results["bls"]) for k in results["bls"][0]}
    for name in contenders:
        if not results[name]:
            continue
        p50 = statistics.median(r["unary_p50_us"] for r in results[name])
        rps = statistics.median(r["chain_rps"] for r in results[name])
        print(
            f"| {name} | {cell(name, 'unary_p50_us', '.0f')} | {cell(name, 'unary_p99_us', '.0f')} "
            f"| {cell(name, 'chain_rps', ',.0f')} | {p50 / base['unary_p50_us']:.2f} "
            f"| {rps / base['chain_rps']:.2f} |"
        )
    for name, why in {**skipped, **failed}.items():
        print(f"\n{name}: skipped: {why}")


if __name__ == "__main__":
    main()
