"""gather / race / map / collect: results, ordering, and structured cancellation."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel
import pytest
from conftest import live_tasks

import bls

pytestmark = pytest.mark.anyio


async def value(x: int, delay: float = 0.0) -> int:
    await anyio.sleep(delay)
    return x


async def boom(delay: float = 0.0) -> int:
    await anyio.sleep(delay)
    raise KeyError("boom")


class Sleeper:
    def __init__(self) -> None:
        self.cancelled = 0

    async def __call__(self, seconds: float = 10) -> int:
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        return 0


async def test_gather_returns_results_in_argument_order() -> None:
    assert await bls.gather(value(1, 0.02), value(2, 0.0), value(3, 0.01)) == [1, 2, 3]
    assert await bls.gather() == []


async def test_gather_raises_first_error_itself_and_cancels_the_rest() -> None:
    sleeper = Sleeper()
    before = live_tasks()
    with pytest.raises(KeyError, match="boom"):
        await bls.gather(sleeper(), boom(0.01), sleeper())
    assert sleeper.cancelled == 2
    assert live_tasks() == before


async def test_race_first_success_wins_and_losers_are_cancelled() -> None:
    sleeper = Sleeper()
    before = live_tasks()
    assert await bls.race(sleeper(), value(7, 0.01), sleeper()) == 7
    assert sleeper.cancelled == 2
    assert live_tasks() == before


async def test_race_skips_failures_until_one_succeeds() -> None:
    assert await bls.race(boom(), value(5, 0.02)) == 5


async def test_race_raises_first_error_when_all_fail() -> None:
    with pytest.raises(KeyError):
        await bls.race(boom(), boom(0.01))
    with pytest.raises(ValueError, match="at least one"):
        await bls.race()


async def test_map_keeps_order_and_bounds_concurrency() -> None:
    running = peak = 0

    async def work(x: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.001 * (10 - x))
        running -= 1
        return x * x

    assert await bls.map(work, range(10), limit=3) == [x * x for x in range(10)]
    assert peak == 3
    assert await bls.map(work, [], limit=3) == []


async def test_map_failure_cancels_the_rest() -> None:
    sleeper = Sleeper()

    async def work(x: int) -> int:
        if x == 2:
            await boom(0.01)
        return await sleeper()

    with pytest.raises(KeyError):
        await bls.map(work, range(5), limit=3)
    assert sleeper.cancelled == 2


async def test_map_rejects_bad_limit() -> None:
    with pytest.raises(ValueError, match="positive"):
        await bls.map(value, [1], limit=0)


async def test_collect_joins_strings_and_lists_other_items() -> None:
    async def words():  # type: ignore[no-untyped-def]
        for w in ["a", "b", "c"]:
            yield w

    async def numbers():  # type: ignore[no-untyped-def]
        for n in [1, 2]:
            yield n

    assert await bls.collect(words()) == "abc"
    assert await bls.collect(numbers()) == [1, 2]


async def test_collect_closes_the_iterator_on_error() -> None:
    closed = []

    async def failing():  # type: ignore[no-untyped-def]
        try:
            yield "a"
            raise RuntimeError("mid-stream")
        finally:
            closed.append(True)

    with pytest.raises(RuntimeError):
        await bls.collect(failing())
    assert closed == [True]


async def test_cancelling_the_caller_cancels_every_child() -> None:
    sleeper = Sleeper()
    before = live_tasks()
    with anyio.move_on_after(0.05):
        await bls.gather(sleeper(), sleeper(), bls.race(sleeper(), sleeper()))
    assert sleeper.cancelled == 4
    assert live_tasks() == before


# -- beside ----------------------------------------------------------------------------


async def test_beside_runs_alongside_the_block_and_gives_its_result() -> None:
    in_block = anyio.Event()

    async def waits_for_the_block() -> int:
        await in_block.wait()  # would never return if the two did not run together
        return 7

    async with bls.beside(waits_for_the_block()) as later:
        in_block.set()
        assert await later == 7  # awaited inside the block
    assert await later == 7  # and after it


async def test_beside_error_cancels_the_block_and_is_raised_as_itself() -> None:
    sleeper = Sleeper()
    with pytest.raises(KeyError, match="boom"):
        async with bls.beside(boom(0.01)):
            await sleeper()
    assert sleeper.cancelled == 1


async def test_an_error_in_the_block_cancels_what_runs_beside() -> None:
    sleeper = Sleeper()
    with pytest.raises(ValueError, match="block"):
        async with bls.beside(sleeper()):
            await anyio.sleep(0.01)
            raise ValueError("block")
    assert sleeper.cancelled == 1


class Ticket(bls.Message):
    n: int


@bls.script
async def streams_beside(req: Ticket) -> AsyncIterator[int]:
    async with bls.beside(value(100, 0.02)) as extra:
        for i in range(req.n):
            yield i
            await anyio.lowlevel.checkpoint()
    yield await extra


async def test_a_streaming_script_yields_inside_beside() -> None:
    async with bls.Runtime() as rt:
        got: list[int] = []

        async def sink(item: int) -> None:
            got.append(item)

        await rt.feed(streams_beside, Ticket(n=3), sink)
        assert got == [0, 1, 2, 100]
        async with rt.run_stream(streams_beside, Ticket(n=3)) as items:
            assert [i async for i in items] == [0, 1, 2, 100]
        # Leaving early closes the script, and what ran beside it, at once.
        before = live_tasks()
        async with rt.run_stream(streams_beside, Ticket(n=1000)) as items:
            async for first in items:
                assert first == 0
                break
        assert live_tasks() <= before
