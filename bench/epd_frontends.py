"""EPD's encoder behind two frontends: encoder calls per unique image, by where the
embedding cache lives and how calls are placed.

    python bench/epd_frontends.py [--requests 40] [--pool 12] [--per-request 4]

Two `bls worker bls.models.encoder:VisionEncoder` replicas (random weights) and two
`bls serve bench/serving/encode.py` frontends sharing nothing; the requests alternate
between the frontends, each carrying --per-request images drawn (seeded) from a pool of
--pool distinct ones. Three set-ups, fresh processes each:

- frontend cache: each frontend keeps its own cache (`cache = {...}` on the stage), the
  encoder placed by load: every frontend encodes each image once;
- worker cache: the cache in each encoder worker (`bls worker --cache`), placed by load;
- worker cache + affinity: and `affinity = { function = "bls.cache:content_key" }`, so
  every frontend sends an image to the replica whose cache holds it.

Printed: encoder calls (cache misses, summed over the caches) per unique image sent.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _procs import BLS, spawn, stop_all  # noqa: E402
from epd import pool  # noqa: E402  (the same distinct images)

SCRIPT = str(HERE / "serving" / "encode.py")
ENCODER = "bls.models.encoder:VisionEncoder"


def misses(urls: list[str]) -> float:
    """The cache misses the /metrics at ``urls`` count, summed."""
    total = 0.0
    for url in urls:
        for line in httpx.get(url, timeout=10).text.splitlines():
            if line.startswith("bls_cache_misses_total"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def run(mode: str, bodies: list[dict[str, object]], tmp: Path) -> float:
    procs: list[subprocess.Popen[str]] = []
    try:
        workers, metrics = [], []
        for n in range(2):
            args = [BLS, "worker", ENCODER, "--listen", "tcp://127.0.0.1:0"]
            if mode != "frontend cache":
                port = 9300 + n
                args += ["--cache", "capacity_mb=64", "--metrics-port", str(port)]
                metrics.append(f"http://127.0.0.1:{port}/metrics")
            proc, address = spawn(args)
            procs.append(proc)
            workers.append(address)
        table = f"[stages.encoder]\nremote = [{', '.join(repr(w) for w in workers)}]\n"
        table = table.replace("'", '"')
        if mode == "frontend cache":
            table += "cache = { capacity_mb = 64 }\n"
        if mode == "worker cache + affinity":
            table += 'affinity = { function = "bls.cache:content_key", balance = 4 }\n'
        config = tmp / f"{mode.replace(' ', '_')}.toml"
        config.write_text(table)
        frontends = []
        for _ in range(2):
            proc, url = spawn([BLS, "serve", SCRIPT, "--port", "0", "--config", str(config),
                               "--no-access-log", "--log-level", "warning"])  # fmt: skip
            procs.append(proc)
            frontends.append(url)
        with httpx.Client(timeout=120) as client:
            for i, body in enumerate(bodies):
                answer = client.post(f"{frontends[i % 2]}/v1/scripts/encode", json=body)
                assert answer.status_code == 200, answer.text
        if mode == "frontend cache":
            metrics = [f"{url}/metrics" for url in frontends]
        return misses(metrics)
    finally:
        stop_all(procs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--pool", type=int, default=12)
    parser.add_argument("--per-request", type=int, default=4)
    args = parser.parse_args()
    images = pool(args.pool)
    rng = random.Random(1)
    bodies: list[dict[str, object]] = [
        {"images": rng.sample(images, args.per_request)} for _ in range(args.requests)
    ]
    unique = len({i for body in bodies for i in body["images"]})  # type: ignore[attr-defined]
    print(f"{args.requests} requests x {args.per_request} images from {unique} unique, "
          "2 frontends, 2 encoder replicas")  # fmt: skip
    print("| set-up | encoder calls | per unique image |")
    print("| --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("frontend cache", "worker cache", "worker cache + affinity"):
            calls = run(mode, bodies, Path(tmp))
            print(f"| {mode} | {calls:.0f} | {calls / unique:.2f} |", flush=True)


if __name__ == "__main__":
    main()
