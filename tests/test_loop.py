"""The backend seam (bls/loop/), on asyncio and trio: a waiter wakes its one task, a
deadline set through the seam ends a scope and one cleared does not, NaN is refused,
deadlines a shared delay away end in order, a spawned task
stops when told, delays hand keys over in order and never early, and the shared timers
fire in order, never early."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import anyio
import pytest

from bls import loop
from bls.loop._asyncio import Timers

pytestmark = pytest.mark.anyio


async def test_a_waiter_wakes_its_task_and_says_when_it_was_cancelled() -> None:
    backend = loop.backend()
    waiter = backend.waiter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter.wait)
        await anyio.sleep(0.01)  # it waits now
        assert waiter.wake()
    if backend.name == "asyncio":  # a future cancelled with its task cannot be woken
        gone = backend.waiter()
        with anyio.move_on_after(0.01):
            await gone.wait()
        assert not gone.wake()


async def test_a_deadline_through_the_seam_ends_its_scope_and_a_cleared_one_does_not() -> None:
    backend = loop.backend()
    with anyio.CancelScope() as scope:
        backend.deadline(scope).at(backend.now() + 0.01)
        await anyio.sleep(5)
    assert scope.cancelled_caught
    with anyio.CancelScope() as kept:
        deadline = backend.deadline(kept)
        deadline.after(0.01)
        deadline.clear()
        await anyio.sleep(0.05)
    assert not kept.cancelled_caught


async def test_a_deadline_refuses_nan() -> None:
    deadline = loop.backend().deadline(anyio.CancelScope())
    for set_it in (deadline.at, deadline.after):
        with pytest.raises(ValueError, match="not NaN"):
            set_it(math.nan)


async def test_a_distant_deadline_ends_its_scope_on_time_not_early() -> None:
    backend = loop.backend()
    with anyio.CancelScope() as scope:
        wanted = backend.now() + 1.2  # filed under its whole second first (asyncio)
        backend.deadline(scope).at(wanted)
        await anyio.sleep(5)
    assert scope.cancelled_caught
    assert wanted <= backend.now() < wanted + 0.5


async def test_a_deadline_moved_later_fires_no_earlier_than_the_new_one() -> None:
    backend = loop.backend()
    start = backend.now()
    with anyio.CancelScope() as scope:
        deadline = backend.deadline(scope)
        deadline.at(start + 0.01)
        deadline.at(start + 0.05)  # later: the first may stay filed, and files itself again
        await anyio.sleep(5)
    assert scope.cancelled_caught and backend.now() >= start + 0.05


async def test_deadlines_a_shared_delay_away_wait_in_one_queue_and_fire_in_order() -> None:
    backend = loop.backend()
    backend.share(0.03)
    ended: dict[str, float] = {}
    began = backend.now()

    async def request(name: str, clear: bool = False) -> None:
        with anyio.CancelScope() as scope:
            deadline = backend.deadline(scope)
            deadline.after(0.03)  # the shared delay
            if clear:
                deadline.clear()
                deadline.after(0.06)  # (not the shared delay: its own)
            await anyio.sleep(5)
        ended[name] = backend.now()

    async with anyio.create_task_group() as tg:
        for name in ("a", "b"):
            tg.start_soon(request, name)
            await anyio.sleep(0.005)
        tg.start_soon(request, "moved", True)
    assert ended["a"] <= ended["b"] < ended["moved"]
    assert ended["a"] >= began + 0.03 and ended["moved"] >= began + 0.06


async def test_a_spawned_task_runs_beside_the_caller_and_stops_when_told() -> None:
    backend = loop.backend()
    ran: list[str] = []
    started = anyio.Event()
    stopped = anyio.Event()

    async def watcher() -> None:
        ran.append("started")
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            ran.append("stopped")
            stopped.set()

    stop = backend.spawn(watcher)
    with anyio.fail_after(5):
        await started.wait()
    stop()
    with anyio.fail_after(5):
        await stopped.wait()
    assert ran == ["started", "stopped"]


async def test_delays_hand_keys_over_in_order_never_early_and_not_once_discarded() -> None:
    backend = loop.backend()
    fired: list[tuple[str, float]] = []
    last = anyio.Event()

    def fire(key: str) -> None:
        fired.append((key, backend.now()))
        if key == "a":
            last.set()

    delays = backend.delays(0.03, fire)
    added = {}
    for key in "abcd":
        added[key] = backend.now()
        delays.add(key)
        await anyio.sleep(0.005)
    delays.discard("b")
    delays.add("a")  # added again: its delay starts again, after the others'
    added["a"] = backend.now()
    delays.discard("never added")
    with anyio.fail_after(5):
        await last.wait()  # "a" is the last due: "b", due before it, would have come first
    assert [key for key, _ in fired] == ["c", "d", "a"]
    assert all(when >= added[key] + 0.03 for key, when in fired)


async def test_delays_keep_handing_over_after_a_callback_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = loop.backend()
    fired: list[str] = []
    done = anyio.Event()

    def fire(key: str) -> None:
        if key == "bad":
            raise RuntimeError("a bug")
        fired.append(key)
        done.set()

    delays = backend.delays(0.01, fire)
    delays.add("bad")
    delays.add("good")
    with anyio.fail_after(5):
        await done.wait()
    assert fired == ["good"]
    assert "a delayed callback failed" in caplog.text
    done = anyio.Event()
    delays.add("again")  # and the next key after a quiet spell too
    with anyio.fail_after(5):
        await done.wait()
    assert fired == ["good", "again"]


def test_shared_timers_fire_in_order_never_early_and_not_once_removed() -> None:
    async def main() -> None:
        running = asyncio.get_running_loop()
        wheel = Timers(running)
        fired: list[tuple[str, float]] = []
        done = asyncio.Event()
        start = running.time()

        def at(name: str) -> Callable[[], None]:
            def fn() -> None:
                fired.append((name, running.time()))
                if name == "last":
                    done.set()

            return fn

        def ms(seconds: float) -> int:  # the bucket of loop time start + seconds
            return math.ceil((start + seconds) * 1000)

        late, early, gone = at("late"), at("early"), at("gone")
        wheel.add_key(ms(0.03), late)
        wheel.add_key(ms(0.01), early)  # sooner than what the loop timer is armed for
        key = wheel.add_key(ms(0.02), gone)
        wheel.add_key(ms(0.05), at("last"))
        wheel.remove(key, gone)
        await asyncio.wait_for(done.wait(), 5)
        assert [name for name, _ in fired] == ["early", "late", "last"]
        wanted = {"early": 0.01, "late": 0.03, "last": 0.05}
        assert all(when >= start + wanted[name] for name, when in fired)

    asyncio.run(main())
