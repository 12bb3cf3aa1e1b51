"""A run's events, the log ``GET /v1/runs/ID/events`` follows: written by the frontend
running the run (:class:`Live`), one at a time and in the order of their numbers, so a
reader that has read event N never finds an N-1 written after it (a batch's lines note
theirs side by side; a store's write may wait in a worker thread); read back by anyone
from the store, a page at a time (:func:`journaled`)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel

from ..journal import Journal, RunLost
from ..resume import JournalRecorder
from ..scope import Reason, RequestScope

__all__ = ["Live", "journaled", "nothing"]

log = logging.getLogger("bls.runs")


class Live:
    """A run running here, ``owner``'s (this frontend's): its scope, its recorder (an
    entry's run has one; a job's journals no stage call), its next event's number, and who
    waits for its next event (:attr:`changed`, set and replaced at each). Its events, and
    its recorder's calls, are written only while the run is ``owner``'s: one that finds
    it another frontend's stops it here (:meth:`lost`)."""

    __slots__ = (
        "changed",
        "journal",
        "next_event",
        "owner",
        "recorder",
        "run_id",
        "scope",
        "stopping",
        "writing",
    )

    def __init__(
        self,
        journal: Journal,
        run_id: str,
        scope: RequestScope,
        recorder: JournalRecorder | None,
        next_event: int,
        owner: str,
    ) -> None:
        self.journal = journal
        self.run_id = run_id
        self.owner = owner
        self.scope = scope
        self.recorder = recorder
        self.next_event = next_event
        self.changed = anyio.Event()
        self.writing = anyio.Lock()  # (one event written at a time: see the module)
        self.stopping = False  # stopped for another frontend to go on with: no outcome
        if recorder is not None:
            recorder.owner = owner
            recorder.on_lost = self.lost

    def stop(self, reason: Reason) -> None:
        """Stop the run here and leave it to another frontend (``reason``: why): no
        outcome is written, and its calls in flight stay in flight in the journal."""
        self.stopping = True
        if self.recorder is not None:
            self.recorder.stop()
        self.scope.cancel(reason)

    def lost(self) -> None:
        """The run is another frontend's now (found as this one wrote for it): stopped
        here, nothing more written."""
        if not self.stopping:
            log.warning("run %s: taken over by another frontend; stopping here", self.run_id)
            self.stop(Reason.DRAIN)

    async def write(
        self, kind: str, data: bytes, *, start: tuple[str, float] | None = None
    ) -> None:
        """Event ``kind``, saved; with ``start`` (the run's owner and lease), in one
        transaction with the run's start (its first event)."""
        journal = self.journal
        async with self.writing:
            event = (self.next_event, kind, data)
            if start is None:
                try:
                    await journal.do(journal.event, self.run_id, *event, self.owner)
                except RunLost:
                    self.lost()
                    raise
            else:
                await journal.do(journal.started, self.run_id, *start, event=event)
            self.next_event += 1
        self._changed()

    async def finish(
        self, status: str, result: bytes | None, error: bytes | None, end: bytes
    ) -> bool:
        """The run's outcome and its last event (``end``), in one transaction; False when
        it had an outcome already."""
        journal = self.journal
        async with self.writing:
            event = (self.next_event, "end", end)
            run_id = self.run_id
            if not await journal.do(
                journal.finish, run_id, status, result=result, error=error, event=event
            ):
                return False
            self.next_event += 1
        self._changed()
        return True

    def _changed(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


async def journaled(journal: Journal, run_id: str, wanted: str) -> AsyncIterator[bytes]:
    """The data of a run's events of kind ``wanted`` (a streaming entry's ``item``s, a
    batch's ``line``s), in order, read a page at a time."""
    after = 0
    while page := await journal.do(journal.events, run_id, after):
        for _, kind, data in page:
            if kind == wanted:
                yield data
        after = page[-1][0]
        await anyio.lowlevel.checkpoint()  # (a page at a time, the loop serves others)


async def nothing() -> AsyncIterator[bytes]:
    """No items (a run not recovered sent none before)."""
    return
    yield
