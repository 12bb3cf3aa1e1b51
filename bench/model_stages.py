"""Model workers: vLLM through bls vs vLLM directly, dynamic batching, the stage cache.

    python bench/model_stages.py [--quick] [--only vllm|batching|cache]

- vLLM: the tiny model (bls.models.tiny), 16 concurrent streams x 128 tokens, driven by
  vLLM's AsyncLLM directly, then through a bls runtime with the same engine inline, then
  through a `bls worker` running its own engine (remote, loopback tcp): tokens/s and
  time to first token, side by side.
- Batching: VisionEncoder with 32 concurrent callers, max_batch_size 32 vs 1.
- Cache: a repeated-image workload at 0 %, 50 % and 90 % hit rates in front of the
  batched encoder (a larger configuration, so the encoder is the bottleneck), against no
  cache; and the cost of a hit.

Absolute times drift on shared machines; compare within one run.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
from _procs import spawn

import bls
from bls import stage
from bls.bindings import InlineBinding
from bls.cache import CachedBinding, CacheOptions
from bls.models import tiny
from bls.models.encoder import EncodeRequest, VisionEncoder, VisionOptions
from bls.models.vllm import (
    GenerateItem,
    GenerateRequest,
    VllmOptions,
    VllmWorker,
    engine_environment,
)

BLS = str(Path(sys.executable).with_name("bls"))
ENGINE = {"max_model_len": 256, "enforce_eager": True, "dtype": "float32"}


# -- vLLM ------------------------------------------------------------------------------


async def _streams(run_one: Any, streams: int) -> tuple[float, float]:
    """(tokens/s, median time to first token in ms) for ``streams`` concurrent runs."""
    ttft: list[float] = []
    tokens = 0

    async def one(i: int) -> None:
        nonlocal tokens
        start = time.perf_counter()
        first = True
        async for count in run_one(i):
            if first:
                ttft.append(time.perf_counter() - start)
                first = False
            tokens += count

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(streams):
            tg.start_soon(one, i)
    return tokens / (time.perf_counter() - started), statistics.median(ttft) * 1000


async def bench_vllm(streams: int, max_tokens: int, rounds: int) -> list[tuple[str, float, float]]:
    from vllm import SamplingParams

    model = str(tiny.build())
    worker = VllmWorker(VllmOptions(model=model, **ENGINE))  # type: ignore[arg-type]
    await worker.setup()
    engine = worker.engine

    def request(i: int) -> GenerateRequest:
        return GenerateRequest(
            prompt=f"describe picture {i}", max_tokens=max_tokens, ignore_eos=True, seed=i
        )

    async def direct(i: int) -> Any:
        req = request(i)
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=i)
        sent = 0
        async for out in engine.generate(req.prompt, params, f"direct-{i}-{time.time()}"):
            n = len(out.outputs[0].token_ids)
            yield n - sent
            sent = n

    async def through_bls(i: int) -> Any:
        async for item in stage.stream("generator", request(i)):
            yield len(item.token_ids)

    async def generator(req: GenerateRequest) -> AsyncIterator[GenerateItem]:
        async with aclosing(worker(req)) as items:
            async for item in items:
                yield item

    bls.StreamStage("remote", GenerateRequest, GenerateItem)  # typed results, like inline

    results: dict[str, list[tuple[float, float]]] = {"direct": [], "inline": [], "remote": []}
    proc, address = spawn(
        [
            BLS,
            "worker",
            "bls.models.vllm:VllmWorker",
            "--listen",
            "tcp://127.0.0.1:0",
            "--option",
            f"model={model}",
            *[f"--option={k}={json.dumps(v)}" for k, v in ENGINE.items()],
        ]
    )
    try:
        async with bls.Runtime({"generator": generator, "remote": address}):

            async def through_remote(i: int) -> Any:
                async for item in stage.stream("remote", request(i)):
                    yield len(item.token_ids)

            await _streams(direct, 2)  # warm up both paths
            await _streams(through_remote, 2)
            for _ in range(rounds):  # interleaved: drift hits every column alike
                results["direct"].append(await _streams(direct, streams))
                results["inline"].append(await _streams(through_bls, streams))
                results["remote"].append(await _streams(through_remote, streams))
    finally:
        proc.terminate()
        proc.wait(30)
        await worker.teardown()
    return [
        (name, max(r[0] for r in runs), min(r[1] for r in runs)) for name, runs in results.items()
    ]


# -- encoders: batching and the cache ------------------------------------------------------


def png(seed: int, size: int) -> bytes:
    from PIL import Image

    data = random.Random(seed).randbytes(size * size * 3)  # distinct per seed
    img = Image.frombytes("RGB", (size, size), data)
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


async def _throughput(name: str, images: list[bytes], callers: int) -> float:
    """Encodes per second with ``callers`` concurrent callers working through ``images``."""
    queue = list(reversed(images))

    async def caller() -> None:
        while queue:
            await stage(name, EncodeRequest(image=queue.pop()))

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(callers):
            tg.start_soon(caller)
    return len(images) / (time.perf_counter() - started)


async def bench_batching(requests: int) -> tuple[float, float]:
    images = [png(i, 64) for i in range(64)]
    work = [images[i % 64] for i in range(requests)]
    batched = VisionEncoder(VisionOptions(max_batch_size=32, max_delay_ms=2))
    single = VisionEncoder(VisionOptions(max_batch_size=1, max_delay_ms=0))
    async with bls.Runtime({"batched": batched, "single": single}):
        await _throughput("batched", work[:64], 32)
        await _throughput("single", work[:64], 32)
        return await _throughput("single", work, 32), await _throughput("batched", work, 32)


async def bench_cache(requests: int) -> tuple[list[tuple[int, float, float]], float]:
    options = VisionOptions(image_size=224, hidden=256, layers=4, max_batch_size=32)
    encoder = VisionEncoder(options)
    plain = {"encoder": encoder}
    rows = []
    hot = [png(i, 96) for i in range(8)]
    fresh = iter(png(1000 + i, 96) for i in range(requests * 3))
    async with bls.Runtime(plain):
        base = await _throughput("encoder", [next(fresh) for _ in range(requests)], 32)
    for rate in (0, 50, 90):
        cached = CachedBinding(
            InlineBinding("encoder", encoder),
            CacheOptions(capacity_mb=256),
            {"stage": "encoder"},
        )
        async with bls.Runtime({"encoder": cached}):
            for img in hot:  # the repeats are cached already
                await stage("encoder", EncodeRequest(image=img))
            work = [
                hot[i % len(hot)] if (i * 100 // requests) % 100 < rate else next(fresh)
                for i in range(requests)
            ]
            rows.append((rate, await _throughput("encoder", work, 32), base))
    cached = CachedBinding(
        InlineBinding("encoder", encoder),
        CacheOptions(capacity_mb=256),
        {"stage": "encoder"},
    )
    async with bls.Runtime({"encoder": cached}):
        req = EncodeRequest(image=hot[0])
        await stage("encoder", req)
        n = 2000
        started = time.perf_counter()
        for _ in range(n):
            await stage("encoder", req)
        hit_us = (time.perf_counter() - started) / n * 1e6
    return rows, hit_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and tokens")
    parser.add_argument("--only", choices=["vllm", "batching", "cache"])
    args = parser.parse_args()
    engine_environment()
    quick = args.quick

    if args.only in (None, "vllm"):
        tokens = 64 if quick else 128
        rows = anyio.run(bench_vllm, 16, tokens, 1 if quick else 5)
        direct = rows[0]
        print(
            f"\nvLLM, tiny model, 16 streams x {tokens} tokens "
            "(best round: tokens/s, and median TTFT of the 16 streams)\n"
        )
        print("| path | tokens/s | ratio | TTFT p50 ms | TTFT added ms |")
        print("| --- | --- | --- | --- | --- |")
        for name, tps, ttft in rows:
            print(
                f"| {name} | {tps:,.0f} | {tps / direct[1]:.2f}x | {ttft:.1f} | "
                f"{ttft - direct[2]:+.1f} |",
                flush=True,
            )

    if args.only in (None, "batching"):
        single, batched = anyio.run(bench_batching, 256 if quick else 1024)
        print("\nVisionEncoder (64x64, hidden 128), 32 concurrent callers\n")
        print("| max_batch_size | encodes/s | ratio |")
        print("| --- | --- | --- |")
        print(f"| 1 | {single:,.0f} | 1.00x |")
        print(f"| 32 | {batched:,.0f} | {batched / single:.2f}x |", flush=True)

    if args.only in (None, "cache"):
        rows, hit_us = anyio.run(bench_cache, 128 if quick else 512)
        print(
            "\nStage cache in front of VisionEncoder (224x224, hidden 256, 4 layers), 32 callers\n"
        )
        print("| hit rate | no cache enc/s | cached enc/s | ratio |")
        print("| --- | --- | --- | --- |")
        for rate, tput, base in rows:
            print(f"| {rate} % | {base:,.0f} | {tput:,.0f} | {tput / base:.2f}x |")
        print(f"\ncost of a hit through stage(): {hit_us:.1f} us", flush=True)


if __name__ == "__main__":
    main()
