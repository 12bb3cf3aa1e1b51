"""Background runs: a request that outlives its client and its frontend.

``POST /v1/scripts/ENTRY`` with ``Prefer: respond-async`` is admitted as any request is
(429, priorities, tenants), its body read and decoded (400/422 at once), then answered
``202 Accepted`` with ``Location: /v1/runs/ID`` and the run
(:func:`.run_routes.run_body`); the run goes on without the connection, its journal in
the store (:mod:`bls.journal`); :mod:`.run_routes` answers for it.

A run's deadline is its own: ``X-Request-Timeout`` (not capped by ``--request-timeout``,
which bounds synchronous requests), else ``[runs] timeout_s``, counted from its
creation and kept across recoveries. At most ``max_running`` run at once in a frontend;
the others wait in the store as ``queued``, taken by priority, then age.

:class:`Runs` keeps the leases of the runs it owns (:meth:`Runs.keep`, every
``lease_s / 5``, :mod:`.run_leases`): it renews them, carries out a cancel another
frontend was asked for, and takes over runs whose owner's lease ran out (a frontend that
died) or that wait in the store, while it has room. A taken-over run is recovered
(:mod:`bls.resume`). On a drain, runs get the grace period
to finish; the rest are stopped, their leases released, and the next frontend goes on
with them.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec

from ..config import RunsConfig
from ..entry import Script
from ..errors import InvalidRequest
from ..journal import TERMINAL, Journal, JournalError, RunLost, RunRow
from ..lifecycle import Drain
from ..replay import Divergence, importable_from
from ..resume import JournalRecorder, Resume
from ..runtime import Runtime
from ..scope import Reason, RequestScope
from .framing import HttpError, error_for
from .run_events import Live, journaled, nothing
from .run_leases import Leases, cancelled

__all__ = ["Job", "Runs", "error_object", "wants_async"]

log = logging.getLogger("bls.runs")
_encode = msgspec.json.encode

_CANCEL_WAIT_S = 5.0  # how long DELETE waits for a run of its own to end
_RUNNING = b'{"status":"running"}'  # a run's first event


# A job: (its run, its scope, a function that saves an event) -> its result.
Job = Callable[[RunRow, RequestScope, Callable[[str, bytes], Awaitable[None]]], Awaitable[bytes]]


def wants_async(prefer: bytes | None) -> bool:
    """Whether a ``Prefer`` header's value asks ``respond-async`` (RFC 7240)."""
    if prefer is None:
        return False
    tokens = prefer.replace(b";", b",").split(b",")
    return any(t.strip().lower() == b"respond-async" for t in tokens)


class Runs(Leases):
    """The background runs of one frontend over ``journal`` (see the module's
    docstring). ``async with runs.running():`` around the server; its routes are
    :attr:`routes`."""

    def __init__(
        self,
        journal: Journal,
        runtime: Runtime,
        entries: dict[str, Script],
        script: Path,
        config: RunsConfig,
    ) -> None:
        self.journal = journal
        self.runtime = runtime
        self.entries = entries
        self.script = str(script.resolve())
        self.config = config
        self.owner = f"{uuid.uuid4().hex[:12]}"
        self.live: dict[str, Live] = {}
        # The kinds of job a run may be besides an entry's, by the prefix of its entry
        # (``batch:`` for :mod:`.batches`); each registers itself.
        self.jobs: dict[str, Job] = {}
        self.outcomes: dict[str, int] = {}  # runs ended here, by status (for /metrics)
        self._running = 0  # runs started here and not ended (some not in live yet)
        self._drain = Drain(self.live)
        self._tg: anyio.abc.TaskGroup | None = None
        self._room = anyio.Event()  # set when a run ends (the keeper may take another)
        self._clock_read = time.monotonic()  # when the store's clock was read last
        self.used_bytes: int | None = None  # the store's size when last read (Leases._bound)

    # -- life ---------------------------------------------------------------------------

    def _start(self, row: RunRow) -> None:
        assert self._tg is not None
        self._running += 1
        self._tg.start_soon(self._run, row)

    async def drain(self, grace: float) -> bool:
        """Take no more runs; wait up to ``grace`` s for those running here, then stop
        the rest and release them to the next frontend. True if none was stopped."""

        def stop_rest() -> None:
            for live in self.live.values():
                live.stop(Reason.DRAIN)

        unfinished = list(self.live)
        done = await self._drain.drain(grace, stop_rest)
        await self.journal.do(self.journal.release, self.owner, unfinished)
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
        return done

    # -- submitting -----------------------------------------------------------------------

    async def submit(
        self, entry: Script, body: bytes, priority: int, timeout: float | None
    ) -> RunRow:
        """A new run of ``entry`` on ``body`` (decoded already); it starts at once when
        there is room here, else it waits in the store (``queued``): 429 when
        ``max_queued`` wait already."""
        return await self._submit(entry.name, body, priority, timeout)

    async def submit_job(self, kind: str, request: bytes, timeout: float) -> RunRow:
        """A new run of a job (``kind`` is ``KIND:...``, a kind of :attr:`jobs`), as
        :meth:`submit` makes an entry's."""
        return await self._submit(kind, request, 0, timeout)

    async def _submit(self, name: str, body: bytes, priority: int, timeout: float | None) -> RunRow:
        if self.full:
            why = (
                f"the runs store takes more than its {self.config.max_bytes} bytes ([runs] "
                "max_bytes), all of them runs not finished yet"
            )
            raise HttpError(503, "store_full", why, headers=[(b"retry-after", b"5")])
        now = self.journal.now()
        timeout = timeout if timeout is not None else self.config.timeout_s
        start_here = not self._drain.draining and self._running < self.config.max_running
        row = RunRow(
            id=f"run-{uuid.uuid4().hex}",
            script=self.script,
            entry=name,
            status="queued",
            request=body,
            priority=priority,
            created=now,
            deadline=now + timeout if timeout is not None and math.isfinite(timeout) else None,
            owner=self.owner if start_here else None,
            lease=self._lease() if start_here else 0.0,
        )
        journal = self.journal
        if (
            not start_here
            and await journal.do(journal.queued, self.script) >= self.config.max_queued
        ):
            raise HttpError(
                429,
                "too_many_runs",
                f"{self.config.max_queued} runs wait already ([runs] max_queued)",
                headers=[(b"retry-after", b"1")],
            )
        await journal.do(journal.create, row)
        if start_here:
            self._start(row)
        return row

    # -- one run ----------------------------------------------------------------------------

    async def _run(self, row: RunRow) -> None:
        try:
            await self._run_entry(row)
        except RunLost:
            pass  # (another frontend's now: stopped here, as Live.lost logged)
        except JournalError:
            # The store failed (a full disk, a lock held too long): the run stays as the
            # journal has it; its lease runs out, and a frontend recovers it.
            log.exception("run %s: the runs store failed; it is left to recovery", row.id)
        finally:
            self._running -= 1
            self._room.set()

    async def _run_entry(self, row: RunRow) -> None:
        kind, colon, _ = row.entry.partition(":")
        if colon:  # (no entry's name has one: a job's, "KIND:...")
            job = self.jobs.get(kind)
            if job is not None:
                await self._run_job(row, job)
                return
        entry = self.entries.get(row.entry)
        if entry is None:
            why = f"the script has no entry {row.entry!r} now (entries: {', '.join(self.entries)})"
            await self._finish(row.id, "failed", error=HttpError(500, "not_found", why).body())
            return
        try:
            req = entry.decode(row.request)
        except InvalidRequest as exc:
            error = HttpError(422, "invalid_request", exc.message, path=exc.path)
            await self._finish(row.id, "failed", error=error.body())
            return
        journal = self.journal
        resume = None  # (a run never started has no calls and no events yet to read)
        if row.started is not None:
            resume = Resume(await journal.do(journal.calls, row.id), importable_from(entry))
        most = self.config.max_value_bytes
        recorder = JournalRecorder(self.journal, row.id, self.script, resume, most)
        scope = RequestScope(row.id, priority=row.priority, record=recorder)
        if resume is not None:
            resume.on_diverge = lambda: scope.cancel(Reason.CANCELLED)
        async with self._running_here(row, scope, recorder) as live:
            await self._outcome(row, entry, req, live, resume)

    @asynccontextmanager
    async def _running_here(
        self, row: RunRow, scope: RequestScope, recorder: JournalRecorder | None
    ) -> AsyncIterator[Live]:
        """The run as it runs here, an entry's or a job's: its deadline set, its start
        and first event written, then (on the way out) its room given back."""
        journal = self.journal
        if row.deadline is not None:
            scope.expire_at(row.deadline - journal.offset)  # (on this host's clock)
        events = await journal.do(journal.last_event, row.id) if row.started is not None else 0
        live = self.live[row.id] = Live(journal, row.id, scope, recorder, events + 1, self.owner)
        try:
            await live.write("status", _RUNNING, start=(self.owner, self._lease()))
            yield live
        finally:
            del self.live[row.id]
            self._drain.left()
            self._room.set()

    async def _outcome(
        self, row: RunRow, entry: Script, req: Any, live: Live, resume: Resume | None
    ) -> None:
        """Run it; its outcome into the journal (none when the frontend stopped it)."""
        result: bytes | None = None
        failure: BaseException | None = None
        scope = live.scope
        try:
            async with scope:
                if entry.streaming:
                    result = await self._items(row.id, entry, req, live, resume)
                else:
                    result = self._kept(entry, _encode(await self.runtime.run(entry, req)))
                if resume is not None:
                    resume.check_all_made()
        except Exception as exc:
            failure = exc
        diverged = None
        if resume is not None and resume.diverged is not None:
            why = str(resume.diverged)
            diverged = HttpError(500, "recovery_diverged", why, entry=entry.name)
        await self._ended(row, live, result, failure, diverged=diverged)

    def _kept(self, entry: Script, result: bytes) -> bytes:
        """A unary run's result, within ``max_result_bytes`` (else :class:`HttpError`: the
        run fails, rather than leave the store a result it may not hold, its outcome
        never written, the run recovered again and again)."""
        most = self.config.max_result_bytes
        if len(result) > most:
            why = (
                f"the result is {len(result)} bytes, over the {most} a run keeps "
                "([runs] max_result_bytes)"
            )
            raise HttpError(500, "result_too_large", why, entry=entry.name)
        return result

    async def _run_job(self, row: RunRow, job: Job) -> None:
        """A job's run (a batch): as an entry's, but the job's own code, which notes its
        progress in the run's events (each one saved before it goes on) and, recovered,
        reads them back to go on from there; no stage call of it is journaled."""
        scope = RequestScope(row.id, priority=row.priority)
        result: bytes | None = None
        failure: BaseException | None = None
        async with self._running_here(row, scope, None) as live:
            try:
                async with scope:
                    result = await job(row, scope, live.write)
            except Exception as exc:
                failure = exc
            await self._ended(row, live, result, failure)

    async def _ended(
        self,
        row: RunRow,
        live: Live,
        result: bytes | None,
        failure: BaseException | None,
        *,
        diverged: HttpError | None = None,
    ) -> None:
        """The run's outcome into the journal (none when this frontend stopped it); a
        recovery that ``diverged`` fails with that error (its scope was cancelled)."""
        scope = live.scope
        if live.stopping:
            return  # (another frontend goes on with it)
        if diverged is not None:
            await self._finish(row.id, "failed", error=diverged.body(), live=live)
        elif scope.reason is Reason.CANCELLED:
            await self._finish(row.id, "cancelled", error=cancelled(row.entry), live=live)
        elif scope.reason is Reason.DEADLINE:
            why = "the run's deadline passed"
            error = HttpError(504, "deadline_exceeded", why, entry=row.entry)
            await self._finish(row.id, "failed", error=error.body(), live=live)
        elif failure is not None:
            error = error_for(failure, row.entry)
            if error.status == 500 and not isinstance(failure, (HttpError, Divergence)):
                log.error("run %s of %r failed", row.id, row.entry, exc_info=failure)
            await self._finish(row.id, "failed", error=error.body(), live=live)
        else:
            await self._finish(row.id, "succeeded", result=result, live=live)

    async def _items(
        self, run_id: str, entry: Script, req: Any, live: Live, resume: Resume | None
    ) -> bytes | None:
        """A streaming entry's run: each item an event as the script yields it; the
        result, every item in a JSON list (None past ``max_result_bytes``: the items are
        in its events alone). A recovered run's items that went out before are checked
        against those it gives again, not sent twice."""
        before = journaled(self.journal, run_id, "item") if resume is not None else nothing()
        items: list[bytes] | None = []
        size = 0
        n = 0

        async def sink(item: Any) -> None:
            nonlocal items, size, n
            data = _encode(item)
            n += 1
            if len(data) > self.config.max_value_bytes:
                why = (
                    f"item {n} is {len(data)} bytes, over the {self.config.max_value_bytes} "
                    "a run's journal keeps of one ([runs] max_value_bytes)"
                )
                raise HttpError(500, "item_too_large", why, entry=entry.name)
            if items is not None:
                size += len(data) + 1
                if size <= self.config.max_result_bytes:
                    items.append(data)
                else:
                    items = None  # (the result would be too large to keep: events only)
            sent = await anext(before, None)
            if sent is None:
                await live.write("item", data)
            elif data != sent and resume is not None:
                raise resume.diverge(
                    f"item {n} differs: the journal has {sent[:80]!r}, "
                    f"the script gave {data[:80]!r}"
                )

        await self.runtime.feed(entry, req, sink)
        return None if items is None else b"[" + b",".join(items) + b"]"

    async def _finish(
        self,
        run_id: str,
        status: str,
        *,
        result: bytes | None = None,
        error: bytes | None = None,
        live: Live | None = None,
    ) -> None:
        journal = self.journal
        end = b'{"status":"%s","result":%s,"error":%s}' % (
            status.encode(),
            result or b"null",
            error_object(error),
        )
        if live is None:  # (a run not running here: its outcome, then its last event)
            if not await journal.do(journal.finish, run_id, status, result=result, error=error):
                return
            last = await journal.do(journal.last_event, run_id)
            await journal.do(journal.event, run_id, last + 1, "end", end)
        elif not await live.finish(status, result, error, end):  # (in one transaction)
            return
        self.outcomes[status] = self.outcomes.get(status, 0) + 1

    async def cancel(self, row: RunRow) -> tuple[int, RunRow]:
        """Cancel ``row``: its scope here; in the store when it waits or its owner is
        gone; else its owner is asked to (202). 200 with the run as it ended. A run taken
        over with a cancel asked (:meth:`.run_leases.Leases._take_over`) ends cancelled."""
        if row.status in TERMINAL:
            return 200, row
        live = self.live.get(row.id)
        if live is not None:
            # (Asked in the store first: should its outcome not be written, a store that
            # failed, the run is cancelled when it is taken over, not run again.)
            await self.journal.do(self.journal.ask_cancel, row.id)
            live.scope.cancel(Reason.CANCELLED)
            with anyio.move_on_after(_CANCEL_WAIT_S):
                while row.id in self.live:
                    await live.changed.wait()
        elif row.lease < self.journal.now() or row.status == "queued":
            await self._finish(row.id, "cancelled", error=cancelled(row.entry))
        else:
            await self.journal.do(self.journal.ask_cancel, row.id)
            return 202, await self.journal.do(self.journal.get, row.id) or row
        current = await self.journal.do(self.journal.get, row.id) or row
        return (200 if current.status in TERMINAL else 202), current


def error_object(error: bytes | None) -> bytes:
    """The ``{"type", "message", ...}`` of an error body ``{"error": {...}}``."""
    if error is None:
        return b"null"
    return msgspec.json.encode(msgspec.json.decode(error)["error"])
