"""bls.timeout: raises DeadlineExceeded, cancels what is inside, nests."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

import bls

pytestmark = pytest.mark.anyio


async def test_timeout_raises_deadline_exceeded_a_timeout_error() -> None:
    with pytest.raises(bls.DeadlineExceeded) as info:
        async with bls.timeout(0.01):
            await anyio.sleep(5)
    assert isinstance(info.value, TimeoutError)


async def test_timeout_cancels_the_work_inside() -> None:
    cleaned = []

    async def work() -> None:
        try:
            await anyio.sleep(5)
        finally:
            cleaned.append(True)

    with pytest.raises(bls.DeadlineExceeded):
        async with bls.timeout(0.01):
            await bls.gather(work(), work())
    assert cleaned == [True, True]


async def test_no_error_when_the_block_finishes_in_time() -> None:
    async with bls.timeout(5) as scope:
        await anyio.lowlevel.checkpoint()
    assert not scope.cancel_called


async def test_inner_timeout_fires_first_and_outer_block_continues() -> None:
    reached = False
    async with bls.timeout(5):
        with pytest.raises(bls.DeadlineExceeded):
            with bls.timeout(0.01):
                await anyio.sleep(5)
        reached = True
    assert reached


async def test_outer_deadline_is_visible_inside() -> None:
    async with bls.timeout(2):
        with bls.timeout(10):
            remaining = anyio.current_effective_deadline() - anyio.current_time()
    assert 0 < remaining <= 2


async def test_outer_cancellation_is_not_reported_as_deadline() -> None:
    with anyio.CancelScope() as outer:
        async with bls.timeout(5):
            outer.cancel()
            await anyio.sleep(1)
    assert outer.cancelled_caught


def test_negative_timeout_is_rejected() -> None:
    with pytest.raises(ValueError):
        bls.timeout(-1)
