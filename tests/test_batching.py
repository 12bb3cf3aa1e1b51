"""@bls.batch: concurrent single calls coalesced into batches, inline, on both backends."""

from __future__ import annotations

import anyio
import pytest

import bls
from bls import stage

pytestmark = pytest.mark.anyio


class Item(bls.Message):
    x: int


class Doubled(bls.Message):
    y: int


class Doubler(bls.Worker):
    def __init__(self, options: object = None) -> None:
        super().__init__(options)
        self.sizes: list[int] = []
        self.seen: list[int] = []
        self.gate: anyio.Event | None = None

    @bls.batch(max_batch_size=4, max_delay_ms=20)
    async def __call__(self, reqs: list[Item]) -> list[Doubled]:
        self.sizes.append(len(reqs))
        self.seen.extend(r.x for r in reqs)
        if self.gate is not None:
            await self.gate.wait()
        if any(r.x < 0 for r in reqs):
            raise ValueError("negative")
        return [Doubled(y=2 * r.x) for r in reqs]


async def test_concurrent_calls_share_batches_and_get_their_own_results() -> None:
    worker = Doubler()
    results: dict[int, int] = {}
    async with bls.Runtime({"double": worker}):

        async def one(i: int) -> None:
            results[i] = (await stage("double", Item(x=i))).y

        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(one, i)
    assert results == {i: 2 * i for i in range(10)}
    assert sum(worker.sizes) == 10
    assert max(worker.sizes) == 4  # never over max_batch_size
    assert len(worker.sizes) == 3  # 4 + 4 + 2


async def test_a_lone_call_runs_after_max_delay() -> None:
    worker = Doubler()
    async with bls.Runtime({"double": worker}):
        started = anyio.current_time()
        assert (await stage("double", {"x": 3})).y == 6
        assert anyio.current_time() - started >= 0.015
    assert worker.sizes == [1]


async def test_signature_is_the_item_types() -> None:
    async with bls.Runtime({"double": Doubler()}) as rt:
        sig = rt.bindings["double"].signature
    assert (sig.request, sig.response, sig.streaming) == (Item, Doubled, False)


async def test_a_cancelled_caller_is_dropped_from_a_batch_not_yet_run() -> None:
    worker = Doubler()
    worker.gate = anyio.Event()
    async with bls.Runtime({"double": worker}):
        results: dict[int, int] = {}

        async def one(i: int) -> None:
            results[i] = (await stage("double", Item(x=i))).y

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 0)  # the first batch: holds the worker at the gate
            with anyio.fail_after(5):
                while not worker.sizes:  # noqa: ASYNC110 - polling a plain list, bounded
                    await anyio.sleep(0.001)
            for i in (1, 2, 3):
                tg.start_soon(one, i)  # these wait for the next batch
            batcher = worker.__call__
            async with anyio.create_task_group() as inner:
                inner.start_soon(one, 99)
                with anyio.fail_after(5):
                    while batcher.waiting < 4:  # noqa: ASYNC110 - a plain count, bounded
                        await anyio.sleep(0.001)
                inner.cancel_scope.cancel()  # 99 is cancelled while it waits
            assert batcher.waiting == 3  # taken out of the queue, not run
            worker.gate.set()
    assert 99 not in worker.seen
    assert results == {0: 0, 1: 2, 2: 4, 3: 6}


async def test_a_failing_batch_fails_every_caller_in_it() -> None:
    worker = Doubler()
    async with bls.Runtime({"double": worker}):
        errors: list[bls.StageError] = []

        async def one(x: int) -> None:
            try:
                await stage("double", Item(x=x))
            except bls.StageError as err:
                errors.append(err)

        async with anyio.create_task_group() as tg:
            for x in (1, -1, 2, 3):
                tg.start_soon(one, x)
    assert worker.sizes == [4]
    assert [e.kind for e in errors] == ["ValueError"] * 4


async def test_options_override_the_decorator() -> None:
    class Options(bls.Message):
        max_batch_size: int = 2

    class Small(Doubler):
        pass

    Small.Options = Options
    worker = Small(Options())
    async with bls.Runtime({"double": worker}):
        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(stage, "double", Item(x=i))
    assert worker.sizes == [2, 2, 2]


async def test_an_exception_in_place_of_a_result_fails_that_caller_only() -> None:
    @bls.batch(max_batch_size=3, max_delay_ms=50)
    async def halve(reqs: list[int]) -> list[int | ValueError]:
        return [r // 2 if r % 2 == 0 else ValueError(f"{r} is odd") for r in reqs]

    assert halve.__bls_signature__.response is int  # the exception is no result type
    got: dict[int, object] = {}

    async def one(r: int) -> None:
        try:
            got[r] = await halve(r)
        except ValueError as exc:
            got[r] = str(exc)

    async with anyio.create_task_group() as tg:
        for r in (2, 3, 4):
            tg.start_soon(one, r)
    assert halve.batches == 1
    assert got == {2: 1, 3: "3 is odd", 4: 2}
