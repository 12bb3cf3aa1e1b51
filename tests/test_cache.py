"""The stage result cache: transparent, byte-bounded, single-flight, partial hits."""

from __future__ import annotations

import anyio
import numpy as np
import pytest

import bls
from bls import stage
from bls.bindings import InlineBinding
from bls.cache import CachedBinding, CacheOptions
from bls.config import ConfigError, StageConfig, _cached

pytestmark = pytest.mark.anyio


class Image(bls.Message):
    pixels: bytes
    size: int = 4


class Vector(bls.Message):
    values: list[float]


class Batch(bls.Message):
    images: list[Image]
    normalise: bool = True


class Vectors(bls.Message):
    vectors: list[Vector]


class Encoder:
    """Counts calls; sleeps so that concurrent callers overlap."""

    def __init__(self) -> None:
        self.calls = 0
        self.items = 0

    async def one(self, req: Image) -> Vector:
        self.calls += 1
        await anyio.sleep(0.01)
        return Vector(values=[float(b) for b in req.pixels[: req.size]])

    async def many(self, req: Batch) -> Vectors:
        self.calls += 1
        self.items += len(req.images)
        await anyio.sleep(0.01)
        return Vectors(vectors=[Vector(values=[float(b) for b in i.pixels]) for i in req.images])


def cached(fn: object, capacity_mb: float = 1, **extra: str) -> CachedBinding:
    options = CacheOptions(capacity_mb=capacity_mb, **extra)  # type: ignore[arg-type]
    return CachedBinding(InlineBinding("encoder", fn), options, {"stage": "encoder"})


async def test_results_are_identical_with_and_without_the_cache() -> None:
    enc = Encoder()
    images = [Image(pixels=bytes([i, i + 1, i + 2, i + 3])) for i in range(5)]
    async with bls.Runtime({"encoder": enc.one}):
        plain = [await stage("encoder", img) for img in images]
    async with bls.Runtime({"encoder": cached(enc.one)}):
        first = [await stage("encoder", img) for img in images]
        again = [await stage("encoder", img) for img in images]
    assert plain == first == again
    assert all(isinstance(v, Vector) for v in again)


async def test_a_hit_does_not_call_the_worker() -> None:
    enc = Encoder()
    binding = cached(enc.one)
    async with bls.Runtime({"encoder": binding}):
        await stage("encoder", Image(pixels=b"abcd"))
        await stage("encoder", {"pixels": b"abcd"})  # the same content, as a dict
        await stage("encoder", Image(pixels=b"abcd", size=2))  # another request
    assert enc.calls == 2
    assert (binding.stats.hits, binding.stats.misses) == (1, 2)


async def test_keys_hash_array_contents_not_identity() -> None:
    enc = Encoder()

    async def encode(req: object) -> int:
        enc.calls += 1
        return 1

    binding = cached(encode)
    async with bls.Runtime({"encoder": binding}):
        await stage("encoder", {"array": np.arange(8, dtype=np.float32)})
        await stage("encoder", {"array": np.arange(8, dtype=np.float32)})  # a new object
        await stage("encoder", {"array": np.arange(8, dtype=np.float64)})  # another dtype
    assert enc.calls == 2


async def test_capacity_is_respected_least_recently_used_first() -> None:
    enc = Encoder()

    async def blob(req: Image) -> bytes:
        enc.calls += 1
        return req.pixels * 1000  # ~4 KB results

    binding = cached(blob, capacity_mb=10_000 / 1024 / 1024)  # room for two
    async with bls.Runtime({"encoder": binding}):
        for name in (b"aaaa", b"bbbb", b"aaaa", b"cccc"):  # c evicts b (a was used)
            await stage("encoder", Image(pixels=name))
        assert binding.stats.bytes <= binding.capacity
        assert binding.stats.evictions == 1
        calls = enc.calls
        await stage("encoder", Image(pixels=b"aaaa"))
        assert enc.calls == calls  # still there
        await stage("encoder", Image(pixels=b"bbbb"))
        assert enc.calls == calls + 1  # evicted


async def test_concurrent_identical_misses_are_computed_once() -> None:
    enc = Encoder()
    binding = cached(enc.one)
    results = []
    async with bls.Runtime({"encoder": binding}):

        async def call() -> None:
            results.append(await stage("encoder", Image(pixels=b"same")))

        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(call)
    assert enc.calls == 1
    assert len(results) == 20 and all(r == results[0] for r in results)


async def test_a_cancelled_computation_is_taken_over_by_a_waiter() -> None:
    first_started = anyio.Event()
    calls = 0

    async def encode(req: Image) -> Vector:
        nonlocal calls
        calls += 1
        if calls == 1:
            first_started.set()
            await anyio.sleep_forever()  # this computation's caller will go away
        return Vector(values=[float(b) for b in req.pixels])

    binding = cached(encode)
    async with bls.Runtime({"encoder": binding}):
        result: list[Vector] = []

        async def waiter() -> None:
            result.append(await stage("encoder", Image(pixels=b"late")))

        async with anyio.create_task_group() as tg:
            async with anyio.create_task_group() as inner:
                inner.start_soon(stage, "encoder", Image(pixels=b"late"))  # computes it
                await first_started.wait()
                tg.start_soon(waiter)
                await anyio.wait_all_tasks_blocked()  # the waiter waits on that computation
                inner.cancel_scope.cancel()  # the computing caller goes away
        assert result == [Vector(values=[108.0, 97.0, 116.0, 101.0])]
    assert calls == 2


async def test_errors_are_shared_not_cached() -> None:
    calls = 0

    async def flaky(req: Image) -> Vector:
        nonlocal calls
        calls += 1
        await anyio.sleep(0.01)
        raise ValueError("model fell over")

    binding = cached(flaky)
    async with bls.Runtime({"encoder": binding}):
        errors = []

        async def call() -> None:
            try:
                await stage("encoder", Image(pixels=b"x"))
            except bls.StageError as err:
                errors.append(err.kind)

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(call)
        assert errors == ["ValueError"] * 3 and calls == 1
        await call()
    assert calls == 2


async def test_partial_hits_compute_only_the_missing_items_in_order() -> None:
    enc = Encoder()
    binding = cached(enc.many, items="images", results="vectors")
    imgs = [Image(pixels=bytes([i])) for i in range(6)]
    async with bls.Runtime({"encoder": binding}):
        first = await stage("encoder", Batch(images=imgs[:3]))
        assert enc.items == 3
        mixed = await stage("encoder", Batch(images=[imgs[4], imgs[1], imgs[5], imgs[0]]))
        assert enc.items == 5  # only 4 and 5 were computed
        assert [v.values for v in mixed.vectors] == [[4.0], [1.0], [5.0], [0.0]]
        assert isinstance(mixed, Vectors) and first.vectors[1] == mixed.vectors[1]
        other = await stage("encoder", Batch(images=imgs[:3], normalise=False))
        assert enc.items == 8  # other preprocessing options: other keys
    assert other.vectors == first.vectors


async def test_a_streaming_stage_cannot_be_cached() -> None:
    async def stream(req: Image):  # type: ignore[no-untyped-def]
        yield 1

    with pytest.raises(bls.BindingError, match="unary stages only"):
        async with bls.Runtime({"encoder": cached(stream)}):
            pass


def test_bad_cache_table_names_the_stage() -> None:
    stage_config = StageConfig(inline="x:y", cache={"capacity_mb": 1, "items": "images"})
    with pytest.raises(ConfigError, match=r"stage 'enc'.*'items' and 'results' go together"):
        _cached("enc", stage_config, InlineBinding("enc", Encoder().one))
    with pytest.raises(ConfigError, match="stage 'enc'"):
        _cached(
            "enc", StageConfig(inline="x:y", cache={"size": 1}), InlineBinding("enc", Encoder().one)
        )


async def test_cache_report_counts_the_hits_and_misses_inside_its_block() -> None:
    enc = Encoder()
    imgs = [Image(pixels=bytes([i] * 4)) for i in range(4)]
    async with bls.Runtime({"encoder": cached(enc.one), "plain": enc.one}):
        with bls.cache_report() as first:
            await stage("encoder", imgs[0])
        assert (first.hits, first.misses) == (0, 1)
        with bls.cache_report() as again:
            await stage("encoder", imgs[0])
            await stage("plain", imgs[0])  # no cache: counts nothing
        assert (again.hits, again.misses) == (1, 0)
        # Calls in the tasks a fan-out starts count too.
        with bls.cache_report() as fanned:
            await bls.gather(*(stage("encoder", img) for img in imgs))
        assert (fanned.hits, fanned.misses) == (1, 3)
    async with bls.Runtime({"encoder": cached(enc.many, items="images", results="vectors")}):
        await stage("encoder", Batch(images=imgs[:2]))
        with bls.cache_report() as partial:
            await stage("encoder", Batch(images=imgs[:3]))  # two items cached, one new
        assert (partial.hits, partial.misses) == (2, 1)
