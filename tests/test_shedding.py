"""The one queue of waiting work (bls/shedding.py) the frontend's admission and a worker
share: best first, the worst found to shed, a cancelled one taken out."""

from __future__ import annotations

import itertools

from bls.shedding import Shedding


def test_the_best_key_is_served_first_and_the_worst_is_the_one_to_shed() -> None:
    order = itertools.count()
    queue: Shedding[str] = Shedding()
    for priority, name in [(0, "a"), (5, "urgent"), (0, "b"), (-3, "bulk")]:
        queue.push((-priority, next(order)), name)
    assert len(queue) == 4 and queue.best_key()[0] == -5
    worst = queue.worst()
    assert worst is not None and worst[1] == "bulk"
    assert queue.remove("bulk") and not queue.remove("bulk")
    assert [queue.pop() for _ in range(3)] == ["urgent", "a", "b"]  # then in arrival order
    assert queue.worst() is None and len(queue) == 0


def test_items_are_never_compared_only_their_keys() -> None:
    class Opaque:  # no ordering: a comparison would raise
        pass

    queue: Shedding[Opaque] = Shedding()
    items = [Opaque() for _ in range(5)]
    for n, item in enumerate(items):
        queue.push((0, n), item)
    queue.remove(items[2])
    assert [queue.pop() for _ in range(4)] == [items[0], items[1], items[3], items[4]]
