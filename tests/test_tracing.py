"""Request traces: spans of the task tree, their outcomes, and what crosses the wire."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel
import pytest

import bls
from bls.scope import CallContext, enter, leave
from bls.tracing import Span, Trace, TraceStore, outcome_of
from bls.transport.wire import decode_spans, encode_spans

pytestmark = pytest.mark.anyio


async def test_outcomes_name_what_ended_a_span() -> None:
    assert outcome_of(bls.DeadlineExceeded("late")) == ("deadline", "")
    assert outcome_of(bls.StageError("s", "deadline", "late")) == ("deadline", "")
    assert outcome_of(bls.StageError("s", "ValueError", "bad")) == ("error", "ValueError")
    assert outcome_of(KeyError("k")) == ("error", "KeyError")
    with anyio.CancelScope() as scope:
        scope.cancel()
        try:
            await anyio.sleep(1)
        except anyio.get_cancelled_exc_class() as exc:
            assert outcome_of(exc) == ("cancelled", "")
            raise


def test_worker_spans_join_the_tree_under_the_call_that_made_them() -> None:
    worker = Trace("r", "stage")
    top = worker.open("stage", 0, "worker")
    inner = worker.open("nested", top.id, "inline")
    worker.close(inner, "ok")
    worker.close(top, "ok")
    spans = decode_spans(encode_spans(worker.spans))  # as they travel in a frame header

    caller = Trace("r", "entry")
    root = caller.open("entry", 0, "script")
    call = caller.open("stage", root.id, "remote")
    caller.adopt(spans, call.id)
    adopted = {s.name: s for s in caller.spans if s.remote}
    assert adopted["stage"].parent == call.id
    assert adopted["nested"].parent == adopted["stage"].id
    assert len({s.id for s in caller.spans}) == len(caller.spans)  # renumbered, unique


def test_the_store_keeps_the_most_recent_traces() -> None:
    store = TraceStore(keep=2)
    for i in range(3):
        store.add(Trace(f"r{i}", "e"))
    assert store.get("r0") is None and store.get("r2") is not None
    assert [t.id for t in store.recent()] == ["r2", "r1"]
    again = Trace("r1", "e")  # a client that sends the same X-Request-Id again
    store.add(again)
    assert [t.id for t in store.recent()] == ["r1", "r2"] and store.get("r1") is again
    none = TraceStore(keep=0)  # --trace-keep 0
    none.add(again)
    assert none.recent() == [] and none.get("r1") is None


async def test_a_stream_left_by_break_still_ends_its_span() -> None:
    ended: list[Span] = []

    async def words(req: str) -> AsyncIterator[str]:
        for word in req.split():
            yield word

    @bls.script
    async def first(req: str) -> str:
        async for word in bls.stage.stream("words", req):
            return word  # leaves the loop without closing the stream
        return ""

    trace = Trace("r", "first", ended.append)
    root = trace.open("first", 0, "script")
    token = enter(CallContext(trace=trace, span=root))
    try:
        async with bls.Runtime({"words": words}) as rt:
            assert await rt.run(first, "a b c") == "a"
            gc.collect()
            await anyio.lowlevel.checkpoint()
    finally:
        leave(token)
    (span,) = [s for s in ended if s.name == "words"]
    assert span.outcome == "cancelled" and span.kind == "closed early" and span.end > 0
