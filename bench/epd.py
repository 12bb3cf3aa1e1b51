"""EPD with and without the embedding cache: hit rate and the time it saves.

    python bench/epd.py [--requests 60] [--pool 8] [--per-request 4] [--rounds 3]

Starts a `bls worker` for the vision encoder and one for the vLLM generator (the tiny
local model), then two `bls serve examples/epd/epd.py` frontends on them: one with the
encoder behind the cache (as examples/epd/bls.toml has it), one without. Each request
carries `--per-request` images drawn (seeded) from a pool of `--pool` distinct images, so
images repeat across requests as a user's uploads do. The two frontends take turns for
several rounds (each round starts with an empty cache: a fresh frontend); prints the hit
rate, the encode time the script reports, the time to the first caption token and the
whole request, as medians, cached vs uncached.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _procs import spawn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BLS = str(Path(sys.executable).with_name("bls"))
SCRIPT = ROOT / "examples/epd/epd.py"
GENERATOR = [
    "max_model_len=256",
    "enforce_eager=true",
    "enable_prompt_embeds=true",
    "dtype=float32",
]


def pool(n: int) -> list[str]:
    """``n`` distinct 64x64 PNGs (noise), base64."""
    from PIL import Image

    rng = random.Random(0)
    out = []
    for _ in range(n):
        image = Image.frombytes("RGB", (64, 64), rng.randbytes(64 * 64 * 3))
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        out.append(base64.b64encode(buf.getvalue()).decode())
    return out


def drive(url: str, bodies: list[dict[str, object]]) -> dict[str, float]:
    hits = total = 0
    encode, first, whole = [], [], []
    with httpx.Client(timeout=120) as client:
        for body in bodies:
            t0 = time.perf_counter()
            got_first = 0.0
            with client.stream("POST", f"{url}/v1/scripts/epd", json=body) as r:
                assert r.status_code == 200, r.read()
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: {}":
                        continue
                    item = json.loads(line[6:])
                    if "cached" in item:
                        hits += sum(item["cached"])
                        total += len(item["cached"])
                        encode.append(item["encode_ms"])
                    elif not got_first:
                        got_first = time.perf_counter() - t0
            whole.append(time.perf_counter() - t0)
            first.append(got_first)
    return {
        "hit_rate": hits / total,
        "encode_ms": statistics.median(encode),
        "first_token_ms": statistics.median(first) * 1000,
        "request_ms": statistics.median(whole) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=60, help="per frontend and round")
    parser.add_argument("--pool", type=int, default=8, help="distinct images")
    parser.add_argument("--per-request", type=int, default=4, help="images per request")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    *images, spare = pool(args.pool + 1)
    warm_up = [{"images": [spare], "max_tokens": 8}] * 3  # an image no request uses
    rng = random.Random(1)
    bodies: list[dict[str, object]] = [
        {"images": [rng.choice(images) for _ in range(args.per_request)], "max_tokens": 8}
        for _ in range(args.requests)
    ]
    procs = []
    try:
        encoder, enc_addr = spawn(
            [BLS, "worker", "bls.models.encoder:VisionEncoder", "--listen", "tcp://127.0.0.1:0"]
        )
        generator, gen_addr = spawn(
            [BLS, "worker", "bls.models.vllm:VllmWorker", "--listen", "tcp://127.0.0.1:0",
             *(a for o in GENERATOR for a in ("--option", o)), "--log-level", "error"]
        )  # fmt: skip
        procs += [encoder, generator]
        folder = Path(tempfile.mkdtemp(prefix="bls-bench-"))
        configs = {}
        for name, cache in (("cached", "cache = { capacity_mb = 64 }\n"), ("uncached", "")):
            configs[name] = folder / f"{name}.toml"
            configs[name].write_text(
                f'[stages.encoder]\nremote = ["{enc_addr}"]\n{cache}\n'
                f'[stages.generator]\nremote = ["{gen_addr}"]\n'
            )
        results: dict[str, list[dict[str, float]]] = {"cached": [], "uncached": []}
        for r in range(args.rounds):
            for name in ("cached", "uncached") if r % 2 == 0 else ("uncached", "cached"):
                server, url = spawn(
                    [BLS, "serve", str(SCRIPT), "--port", "0", "--config", str(configs[name]),
                     "--no-access-log", "--log-level", "warning"]
                )  # fmt: skip
                try:
                    drive(url, warm_up)
                    results[name].append(drive(url, bodies))
                finally:
                    server.terminate()
                    server.wait(30)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)

    def cell(name: str, key: str) -> str:
        values = [row[key] for row in results[name]]
        return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"

    print(
        f"EPD: {args.requests} requests of {args.per_request} images from a pool of "
        f"{args.pool}, {args.rounds} rounds, median [min-max] over rounds\n"
    )
    print("| frontend | image hit rate | encode ms | first token ms | request ms |")
    print("| --- | --- | --- | --- | --- |")
    for name in ("uncached", "cached"):
        print(
            f"| {name} | {cell(name, 'hit_rate')} | {cell(name, 'encode_ms')} "
            f"| {cell(name, 'first_token_ms')} | {cell(name, 'request_ms')} |"
        )


if __name__ == "__main__":
    main()
