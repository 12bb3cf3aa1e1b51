"""Request traces: one span per stage call, nested as the task tree nests.

A :class:`Trace` is active for the task tree of one request (``bls serve`` opens one per
HTTP request; ``bls worker`` opens one for a traced incoming call). While it is active,
every stage call made in that tree records a :class:`Span`: stage name, binding, replica,
start and end (epoch seconds), outcome and bytes on the wire. Calls made inside a stage
(nested scripts, workers calling stages) become children of that stage's span, and fan-
out siblings share a parent. Remote workers report the spans they recorded back to the
caller, so one request's tree crosses processes.

A trace is carried by the request's :class:`bls.scope.CallContext`, which also records
calls into it (``scope.traced_call``); with none (``bls run``, library use) the runtime
skips all of this.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Callable

import anyio
import msgspec

from .errors import DeadlineExceeded, ErrorKind, StageError

__all__ = ["Span", "Trace", "TraceStore", "outcome_of"]


class Span(msgspec.Struct, kw_only=True, gc=False):  # scalars only: nothing to collect
    """One stage call (or the request itself, the root span with ``parent == 0``)."""

    id: int
    parent: int
    name: str
    binding: str = ""
    replica: str = ""
    start: float
    end: float = 0.0
    outcome: str = "running"  # ok | error | cancelled | deadline
    kind: str = ""  # the StageError kind when outcome is "error"
    bytes_out: int = 0  # request bytes sent on the wire
    bytes_in: int = 0  # result / item bytes received
    items: int = 0  # stream items received
    streaming: bool = False
    remote: bool = False  # recorded by a worker process and reported back
    attempt: int = 0  # one copy of a hedged or retried call (1, 2, ...), under the call's
    version: str = ""  # the version of the stage that served it (bls/versions.py)


class Trace:
    """The spans of one request; ``on_end`` sees each span as it finishes."""

    __slots__ = ("_ids", "entry", "id", "on_end", "spans", "start", "status")

    def __init__(
        self, trace_id: str, entry: str, on_end: Callable[[Span], None] | None = None
    ) -> None:
        self.id = trace_id
        self.entry = entry
        self.start = time.time()
        self.spans: list[Span] = []
        self.status = 0
        self.on_end = on_end
        self._ids = itertools.count(1)

    def open(self, name: str, parent: int, binding: str = "", streaming: bool = False) -> Span:
        span = Span(
            id=next(self._ids),
            parent=parent,
            name=name,
            binding=binding,
            start=time.time(),
            streaming=streaming,
        )
        self.spans.append(span)
        return span

    def close(self, span: Span, outcome: str, kind: str = "") -> None:
        span.end = time.time()
        span.outcome = outcome
        span.kind = kind
        if self.on_end is not None:
            self.on_end(span)

    def adopt(self, spans: list[Span], parent: int) -> None:
        """Take in spans a remote worker reported, re-numbered under ``parent``."""
        ids: dict[int, int] = {}
        for span in spans:
            new = next(self._ids)
            ids[span.id] = new
            span.parent = ids.get(span.parent, parent)
            span.id = new
            span.remote = True
            self.spans.append(span)

    @property
    def duration(self) -> float:
        ends = [s.end for s in self.spans if s.end]
        return (max(ends) - self.start) if ends else 0.0


def outcome_of(exc: BaseException) -> tuple[str, str]:
    """(outcome, kind) for a span that ended with ``exc``."""
    if isinstance(exc, DeadlineExceeded) or (
        isinstance(exc, StageError) and exc.kind == ErrorKind.DEADLINE
    ):
        return "deadline", ""
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        return "cancelled", ""
    if isinstance(exc, StageError):
        return "error", exc.kind
    return "error", type(exc).__name__


class TraceStore:
    """The last ``keep`` finished traces (for ``/debug/requests``). Adding one is a ring's
    append, since every request adds one; finding one by request id is a scan, since only
    the debug pages look."""

    def __init__(self, keep: int = 100) -> None:
        self._ring: collections.deque[Trace] = collections.deque(maxlen=max(keep, 0))

    def add(self, trace: Trace) -> None:
        self._ring.append(trace)  # (keep 0: a ring that holds nothing)

    def get(self, trace_id: str) -> Trace | None:
        """The newest trace of request ``trace_id`` (a client may send an id again)."""
        for trace in reversed(self._ring):
            if trace.id == trace_id:
                return trace
        return None

    def recent(self) -> list[Trace]:
        """Newest first, one per request id (the newest)."""
        seen: set[str] = set()
        traces = []
        for trace in reversed(self._ring):
            if trace.id not in seen:
                seen.add(trace.id)
                traces.append(trace)
        return traces
