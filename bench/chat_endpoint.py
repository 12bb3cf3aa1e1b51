"""`bls serve examples/chat/chat.py` against `vllm serve`, driven by vLLM's own benchmark
client, on the same tiny model, engine settings and load.

    python bench/chat_endpoint.py [--rounds 3] [--concurrency 1 8 32] [--quick]

Starts `vllm serve` (vLLM's OpenAI API server), `bls serve` of the chat example with the
generator in process, and `bls serve` with the generator in a `bls worker`; all three stay
up. Then, for several rounds, each load (random prompts of ~32 tokens, 64-96 output
tokens, --ignore-eos) runs against each server in turn, the order rotating every round.
It prints, per concurrency, the median and spread over rounds of bls's figures as ratios
of vLLM's: output tokens/s, median inter-token latency, median end-to-end latency, and
the frontend's CPU time per generated token, read from /proc: the process that serves
HTTP (for vLLM and bls inline it also runs the engine client, AsyncLLM); with the
generator remote, a second figure adds the `bls worker` process, which runs the engine
client there. Engine core processes are counted on neither side. CPU time is the steady
figure on a small shared machine; wall-clock ratios swing between runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Keep this folder's modules (traffic.py, streams.py, ...) from shadowing packages that
# vLLM imports, and find the bench helpers after the real packages.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

from _procs import cpu_seconds, spawn, spread  # noqa: E402

BLS = str(Path(sys.executable).with_name("bls"))
ENGINE = {"max_model_len": 512, "enforce_eager": True, "dtype": "float32"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[Any], timeout: float = 300) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not come up within {timeout}s")


class Server:
    """One contender: its base URL and the processes whose CPU time counts."""

    def __init__(self, name: str, url: str, procs: list[subprocess.Popen[Any]]):
        self.name = name
        self.url = url
        self.procs = procs  # the HTTP server last

    def cpu(self) -> tuple[float, float]:
        """CPU seconds of the HTTP server process, and of all the counted processes."""
        each = [cpu_seconds(p.pid) for p in self.procs]
        return each[-1], sum(each)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def start_vllm(model: str, extra: list[str] | None = None) -> Server:
    """`vllm serve` on ``model`` with the engine settings above (and ``extra`` flags)."""
    port = _free_port()
    args = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        f"--model={model}",
        "--served-model-name=tiny",
        f"--port={port}",
        "--host=127.0.0.1",
        f"--max-model-len={ENGINE['max_model_len']}",
        "--enforce-eager",
        f"--dtype={ENGINE['dtype']}",
        "--disable-uvicorn-access-log",  # as bls serve --no-access-log
        *(extra or []),
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    _wait_http(f"{url}/v1/models", proc)
    return Server("vllm serve", url, [proc])


def start_bls(model: str, remote: bool) -> Server:
    options = [f"--option={k}={json.dumps(v)}" for k, v in {"model": model, **ENGINE}.items()]
    procs: list[subprocess.Popen[Any]] = []
    if remote:
        worker, address = spawn(
            [BLS, "worker", "bls.models.vllm:VllmWorker", "--listen", "tcp://127.0.0.1:0", *options]
        )
        procs.append(worker)
        binds = ["--bind", f"generator={address}"]
    else:
        config = Path(os.environ.get("TMPDIR", "/tmp")) / f"bls-bench-chat-{os.getpid()}.toml"
        table = ", ".join(f"{k} = {json.dumps(v)}" for k, v in {"model": model, **ENGINE}.items())
        config.write_text(
            f'[stages.generator]\ninline = "bls.models.vllm:VllmWorker"\noptions = {{ {table} }}\n'
        )
        binds = ["--config", str(config)]
    server, url = spawn(
        [BLS, "serve", str(ROOT / "examples/chat/chat.py"), "--port=0", "--no-access-log", *binds]
    )
    procs.append(server)
    name = "bls remote" if remote else "bls inline"
    return Server(name, url, procs)


def run_load(server: Server, model: str, concurrency: int, prompts: int) -> dict[str, float]:
    """One load with vLLM's benchmark client; its figures and the frontend's CPU time."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(
        [
            "--backend=openai-chat",
            f"--base-url={server.url}",
            "--endpoint=/v1/chat/completions",
            f"--model={model}",
            "--served-model-name=tiny",
            "--dataset-name=random",
            "--random-input-len=32",
            "--random-output-len=80",
            "--random-range-ratio=0.2",
            "--ignore-eos",
            f"--num-prompts={prompts}",
            f"--max-concurrency={concurrency}",
            "--percentile-metrics=ttft,tpot,itl,e2el",
            "--disable-tqdm",
            "--save-detailed",  # keeps the per-request chunk timings in the result
            f"--seed={concurrency}",
        ]
    )
    front, total = server.cpu()
    with contextlib.redirect_stdout(sys.stderr):
        result = main(args)
    front_after, total_after = server.cpu()
    if result["failed"] or result["completed"] != prompts:
        raise RuntimeError(f"{server.name}: {result['failed']} of {prompts} requests failed")
    tokens = result["total_output_tokens"]
    itls = result.get("itls") or [[]]
    return {
        "tok_s": float(result["output_throughput"]),
        "tpot": float(result["median_tpot_ms"]),
        "itl": float(result["median_itl_ms"]),
        "chunks": sum(len(i) + 1 for i in itls) / len(itls),  # content chunks per answer
        "e2e": float(result["median_e2el_ms"]),
        "cpu": (front_after - front) / tokens * 1e6,  # µs per generated token
        "cpu_all": (total_after - total) / tokens * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--quick", action="store_true", help="one round, fewer prompts")
    opts = ap.parse_args()
    rounds = 1 if opts.quick else opts.rounds

    from bls.models import tiny

    model = str(tiny.build())
    print("starting vllm serve, bls serve (inline) and bls serve + bls worker...", file=sys.stderr)
    servers = [start_vllm(model), start_bls(model, remote=False), start_bls(model, remote=True)]
    try:
        for server in servers:  # warm up: first requests load kernels and caches
            run_load(server, model, 8, 16)
        figures: dict[tuple[str, int], list[dict[str, float]]] = {}
        for r in range(rounds):
            order = servers[r % 3 :] + servers[: r % 3]
            for c in opts.concurrency:
                prompts = max(16 if opts.quick else 32, 4 * c)
                for server in order:
                    got = run_load(server, model, c, prompts)
                    figures.setdefault((server.name, c), []).append(got)
                    print(f"round {r + 1} c={c} {server.name}: {got}", file=sys.stderr)
    finally:
        for server in servers:
            server.stop()

    print(f"bls serve vs vllm serve, vLLM's benchmark client, {rounds} round(s); ratios are")
    print("bls / vllm per round: median [min-max]. tok/s: higher is better; the rest lower.")
    print("CPU: the HTTP server process; CPU+w adds the bls worker (remote generator).")
    print()
    columns = ("tok/s", "TPOT p50", "ITL p50", "E2E p50", "CPU/token", "CPU+w/token")
    header = f"{'generator':<9} {'conc':>4}  " + " ".join(f"{c:<18}" for c in columns)
    header += "  CPU µs/token bls | vllm"
    print(header)
    print("-" * len(header))
    for mode in ("inline", "remote"):
        for c in opts.concurrency:
            ours, theirs = figures[(f"bls {mode}", c)], figures[("vllm serve", c)]
            cells = []
            for key, base in (
                ("tok_s", "tok_s"),
                ("tpot", "tpot"),
                ("itl", "itl"),
                ("e2e", "e2e"),
                ("cpu", "cpu"),
                ("cpu_all", "cpu"),
            ):
                ratios = [o[key] / t[base] for o, t in zip(ours, theirs, strict=True)]
                cells.append(f"{spread(ratios):<18}")
            cpu_ours = statistics.median(o["cpu"] for o in ours)
            cpu_all = statistics.median(o["cpu_all"] for o in ours)
            cpu_theirs = statistics.median(t["cpu"] for t in theirs)
            mine = f"{cpu_ours:.0f}" + (f" (+w {cpu_all:.0f})" if mode == "remote" else "")
            print(f"{mode:<9} {c:>4}  " + " ".join(cells) + f"  {mine} | {cpu_theirs:.0f}")
    chunks = {
        name: statistics.median(f["chunks"] for f in runs) for (name, _), runs in figures.items()
    }
    print()
    print(
        "Chunks per answer (median): "
        + ", ".join(f"{name} {n:.1f}" for name, n in sorted(chunks.items()))
        + '. vLLM also sends a chunk for an engine step that decoded no text ("content": "");'
    )
    print("bls does not, so its chunks are fewer and some inter-chunk gaps span two steps: its ITL")
    print("median reads higher for the same token rate. TPOT (per token) is not affected.")


if __name__ == "__main__":
    main()
