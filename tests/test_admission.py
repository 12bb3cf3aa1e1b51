"""The frontend's admission on its own: weighted turns between tenants, a request
cancelled while it waits gives its place up, and the fast path stays a counter."""

from __future__ import annotations

import anyio
import pytest

from bls.config import AdmissionConfig, Limit
from bls.serve.admission import GRANTED, Admission
from bls.serve.framing import HttpError

pytestmark = pytest.mark.anyio


async def test_without_limits_or_a_queue_admission_is_a_counter() -> None:
    admission = Admission(2, AdmissionConfig())
    assert admission.simple
    tickets = [admission.enter("e", None, 0) for _ in range(2)]
    assert tickets == [GRANTED, GRANTED]
    with pytest.raises(HttpError) as caught:
        admission.enter("e", None, 0)
    assert caught.value.status == 429
    admission.leave(tickets[0])
    assert admission.enter("e", None, 0) is GRANTED


async def test_tenants_take_turns_by_weight() -> None:
    config = AdmissionConfig(max_queued=100, tenants={"gold": Limit(weight=3)})
    admission = Admission(1, config)
    running = admission.enter("e", "x", 0)
    waiting = [admission.enter("e", t, 0) for t in ["plain"] * 8 + ["gold"] * 8]
    served: list[str] = []
    current = running
    for _ in range(8):
        admission.leave(current)
        current = next(t for t in waiting if t.granted and t.tenant is not None)
        waiting.remove(current)
        assert current.tenant is not None
        served.append(current.tenant.name)
    assert served.count("gold") == 6 and served.count("plain") == 2, served


async def test_a_request_cancelled_while_it_waits_gives_its_place_up() -> None:
    admission = Admission(1, AdmissionConfig(max_queued=4))
    running = admission.enter("e", None, 0)
    first = admission.enter("e", None, 0)
    second = admission.enter("e", None, 0)
    assert admission.queued == 2
    with anyio.move_on_after(0.01):
        await first.wait()
    admission.leave(first)  # its handler's finally, after the cancel
    assert admission.queued == 1
    admission.leave(running)
    assert second.granted and admission.running == 1 and admission.queued == 0
    await second.wait()


async def test_a_tenant_over_its_rate_gets_the_seconds_until_its_next_token() -> None:
    admission = Admission(10, AdmissionConfig(tenants={"*": Limit(rate=0.25, burst=1)}))
    admission.leave(admission.enter("e", "a", 0))
    with pytest.raises(HttpError) as caught:
        admission.enter("e", "a", 0)
    assert (b"retry-after", b"4") in caught.value.headers
    assert admission.running == 0


async def test_reserved_slots_are_for_requests_above_priority_0() -> None:
    admission = Admission(3, AdmissionConfig(reserved=1, max_queued=4))
    low = [admission.enter("e", None, 0) for _ in range(3)]
    assert [t.granted for t in low] == [True, True, False]  # the third waits
    high = admission.enter("e", None, 1)
    assert high.granted  # the reserved slot
    urgent = admission.enter("e", None, 2)
    assert not urgent.granted
    admission.leave(low[0])
    assert urgent.granted and not low[2].granted  # the queue's highest first
    admission.leave(high)
    assert not low[2].granted  # a freed reserved slot is not for priority 0
    admission.leave(low[1])
    assert low[2].granted


async def test_with_reserved_slots_and_no_queue_the_429_says_why() -> None:
    admission = Admission(2, AdmissionConfig(reserved=1))
    admission.enter("e", None, 0)
    with pytest.raises(HttpError) as caught:
        admission.enter("e", None, 0)
    assert "(1 of them kept for requests of priority above 0)" in caught.value.message
    assert admission.enter("e", None, 5).granted


async def test_a_tenants_rate_holds_however_many_other_tenants_come() -> None:
    config = AdmissionConfig(tenants={"*": Limit(rate=0.5, burst=1)})
    admission = Admission(100_000, config)
    admission.leave(admission.enter("e", "mallory", 0))  # its one token spent
    for i in range(10_000):  # other names, each leaving at once: forgettable or not
        admission.leave(admission.enter("e", f"t{i}", 0))
    with pytest.raises(HttpError) as caught:
        admission.enter("e", "mallory", 0)
    assert caught.value.status == 429 and "over its rate" in caught.value.message


async def test_tenants_that_hold_nothing_are_forgotten_and_the_table_is_bounded() -> None:
    from bls.serve import admission as module

    admission = Admission(10, AdmissionConfig(tenants={"*": Limit(max_inflight=5)}))
    for i in range(20_000):  # no rate: each is forgettable once it has left
        admission.leave(admission.enter("e", f"t{i}", 0))
    assert len(admission._tenants) <= 2 * module._FORGET_AT

    rated = Admission(10**6, AdmissionConfig(tenants={"*": Limit(rate=0.001, burst=1)}))
    for i in range(module.MAX_TENANTS):  # each bucket stays empty for a long while
        rated.leave(rated.enter("e", f"t{i}", 0))
    with pytest.raises(HttpError) as caught:
        rated.enter("e", "one-more", 0)
    assert caught.value.status == 429 and "tracks 65536 tenants" in caught.value.message
    with pytest.raises(HttpError) as known:  # a known one is judged by its own bucket
        rated.enter("e", "t5", 0)
    assert "over its rate" in known.value.message
