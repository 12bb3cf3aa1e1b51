"""The leases of a frontend's background runs: :class:`Leases`, the part of
:class:`.runs.Runs` that keeps them (:meth:`Leases.keep`).

Every ``lease_s / 5`` the keeper renews the leases of the runs it owns, carries out a
cancel another frontend was asked for, and takes over runs whose owner's lease ran out
(a frontend that died) or that wait in the store, while it has room; leases and deadlines
are on the store's clock (:meth:`bls.journal.Journal.now`, read again every
:data:`_CLOCK_EVERY_S`). Beside it, old runs are forgotten a slice at a time
(:meth:`Leases._prune`), and past ``max_bytes`` the oldest finished runs
(:meth:`Leases._bound`).

A store that fails is tried again at the next turn, and said once (:class:`_Outage`): its
first failure, then every :data:`_OUTAGE_NOTE_S` while it lasts, then that it answers
again; a store that is down for an hour does not log a line every turn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from ..config import RunsConfig
from ..journal import Journal, JournalError, RunRow
from ..lifecycle import Drain
from ..scope import Reason
from .framing import HttpError
from .run_events import Live

__all__ = ["Leases", "cancelled"]

log = logging.getLogger("bls.runs")

_PRUNE_SLICE = 1000  # runs forgotten at a time (about 10 ms of SQLite on a local disk)
_PRUNE_PAUSE_S = 0.1  # between slices while more are due
_PRUNE_EVERY_S = 60.0  # how often old runs are looked for
_CLOCK_EVERY_S = 60.0  # how often the store's clock is read again (Journal.sync_clock)
_OUTAGE_NOTE_S = 60.0  # while the store fails, how often that is said again
_BOUND_EVERY_S = 5.0  # how often the store's size is read ([runs] max_bytes)
_BOUND_SLICE = 100  # runs forgotten at a time to make room, at most
_BOUND_PASSES = 10  # slices forgotten a turn, at most


class Leases:
    """The keeper of a frontend's runs (see the module's docstring), over what
    :class:`.runs.Runs` holds: its journal and config, its runs running here (``live``,
    ``_running``), and how it starts and ends one (``_start``, ``_finish``)."""

    journal: Journal
    config: RunsConfig
    owner: str
    live: dict[str, Live]
    _running: int
    _drain: Drain
    _tg: anyio.abc.TaskGroup | None
    _room: anyio.Event
    _clock_read: float
    used_bytes: int | None  # what the store took when last read (_bound; None: not read)
    _start: Callable[[RunRow], None]
    _finish: Callable[..., Awaitable[None]]
    script: str

    async def keep(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run until cancelled: the runs' task group, and every ``lease_s / 5`` s the
        leases renewed, cancels carried out, runs taken over (see the module's
        docstring); old runs pruned beside (:meth:`_prune`)."""
        config = self.config
        outage = _Outage(config.lease_s / 5)
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._prune, outage)
            tg.start_soon(self._bound, outage)
            task_status.started()
            while True:
                try:
                    if time.monotonic() - self._clock_read >= _CLOCK_EVERY_S:
                        await self.journal.do(self.journal.sync_clock)
                        self._clock_read = time.monotonic()
                    if not self._drain.draining:
                        await self._renew()
                        await self._take_over(outage)
                    outage.answered()
                except JournalError as exc:
                    # (Tried again at the next turn; a lease not renewed meanwhile may be
                    # taken over by another frontend, which this one then hears of.)
                    outage.failed(exc)
                with anyio.move_on_after(config.lease_s / 5):
                    await self._room.wait()
                self._room = anyio.Event()

    async def _prune(self, outage: _Outage) -> None:
        """Forget runs past ``retain_s`` and ``retain``, :data:`_PRUNE_SLICE` at a time:
        every :data:`_PRUNE_EVERY_S`, and while a slice comes back full, again after
        :data:`_PRUNE_PAUSE_S` (a slice holds the store, and on SQLite the event loop,
        for milliseconds; forgetting a hundred thousand runs at once held it for seconds,
        leases unrenewed meanwhile)."""
        journal, config = self.journal, self.config
        while True:
            try:
                gone = await journal.do(
                    journal.prune,
                    older_than=config.retain_s,
                    keep=config.retain,
                    limit=_PRUNE_SLICE,
                )
            except JournalError as exc:
                outage.failed(exc)
                gone = 0
            if gone:
                log.debug("background runs: forgot %d old run(s)", gone)
            await anyio.sleep(_PRUNE_PAUSE_S if gone == _PRUNE_SLICE else _PRUNE_EVERY_S)

    async def _bound(self, outage: _Outage) -> None:
        """Keep the store within ``max_bytes``: every :data:`_BOUND_EVERY_S` (or lease,
        the shorter) its size read, and while it is past, the oldest finished runs
        forgotten, those that held what it is past (:data:`_BOUND_SLICE` at most at a
        time, :data:`_BOUND_PASSES` times a turn at most); while it is still past, it is
        :attr:`full` (new runs are refused). A store that cannot tell its size (PostgreSQL)
        is not bounded here."""
        journal, most = self.journal, self.config.max_bytes
        every = min(_BOUND_EVERY_S, self.config.lease_s)
        said = False
        while True:
            try:
                used = await journal.used_bytes()
                if used is None:
                    return
                forgot = 0
                for _ in range(_BOUND_PASSES):  # (runs that end meanwhile wait a turn)
                    if used <= most:
                        break
                    gone = await journal.do(journal.forget_oldest, used - most, _BOUND_SLICE)
                    if not gone:
                        break
                    forgot += gone
                    await anyio.sleep(_PRUNE_PAUSE_S)  # (the store, and the loop, for others)
                    again = await journal.used_bytes()
                    assert again is not None  # (a store that tells its size tells it again)
                    used = again
                if forgot:  # (said once; a store kept at its bound forgets every turn)
                    log.log(
                        logging.DEBUG if said else logging.INFO,
                        "background runs: forgot the %d oldest finished run(s): the store "
                        "took more than its %d bytes ([runs] max_bytes)",
                        forgot,
                        most,
                    )
                    said = True
                was_full, self.used_bytes = self.full, used
                self._said_full(was_full)
            except JournalError as exc:
                outage.failed(exc)
            await anyio.sleep(every)

    @property
    def full(self) -> bool:
        """The store was past ``max_bytes`` when last read, after forgetting what it could
        (:meth:`_bound`): new runs are refused."""
        return self.used_bytes is not None and self.used_bytes > self.config.max_bytes

    def _said_full(self, was_full: bool) -> None:
        """Say when the store becomes full, and when it is not any more."""
        if self.full and not was_full:
            log.error(
                "background runs: the store takes %d bytes, past its %d ([runs] max_bytes), "
                "after forgetting what it could: new runs are refused until there is room",
                self.used_bytes,
                self.config.max_bytes,
            )
        elif was_full and not self.full:
            log.warning("background runs: the store is within [runs] max_bytes again")

    def _lease(self) -> float:
        return self.journal.now() + self.config.lease_s

    async def _renew(self) -> None:
        journal = self.journal
        for run_id in await journal.do(journal.renew, self.owner, list(self.live), self._lease()):
            live = self.live.get(run_id)
            if live is not None:
                row = await journal.do(journal.get, run_id)
                if row is not None and row.owner != self.owner:
                    live.lost()
                else:
                    live.scope.cancel(Reason.CANCELLED)

    async def _take_over(self, outage: _Outage) -> None:
        """Claim as many runs as there is room for, and start them; one claimed with a
        cancel asked (of a frontend that stopped, or could not end it, first) ends
        cancelled. One whose end cannot be written does not hold up the others claimed
        with it (it is claimed again once its lease runs out)."""
        room = self.config.max_running - self._running
        if room <= 0:
            return
        journal = self.journal
        for row in await journal.do(journal.claim, self.script, self.owner, self._lease(), room):
            if row.cancel:
                log.info("run %s: cancelled, as asked before its frontend stopped", row.id)
                try:
                    await self._finish(row.id, "cancelled", error=cancelled(row.entry))
                except JournalError as exc:
                    outage.failed(exc)
                continue
            if row.started is not None:
                log.info("run %s: recovering (its frontend stopped)", row.id)
            self._start(row)


def cancelled(entry: str) -> bytes:
    """The error body of a run that was cancelled (DELETE)."""
    return HttpError(499, "cancelled", "the run was cancelled", entry=entry).body()


class _Outage:
    """The runs store failing, said once: the first failure, then every
    :data:`_OUTAGE_NOTE_S` while it lasts (how long, how many tries), then that it
    answers again."""

    __slots__ = ("_every", "_said", "since", "tries")

    def __init__(self, every: float) -> None:
        self._every = every  # how often the keeper tries (for the message)
        self.since: float | None = None  # when the store began to fail
        self.tries = 0  # tries that failed since
        self._said = 0.0

    def failed(self, exc: JournalError) -> None:
        now = time.monotonic()
        self.tries += 1
        if self.since is None:
            self.since = self._said = now
            log.error(
                "background runs: %s; tried again every %gs, runs left to recovery meanwhile",
                exc,
                self._every,
            )
            log.debug("background runs: the runs store's failure", exc_info=exc)
        elif now - self._said >= _OUTAGE_NOTE_S:
            self._said = now
            log.error(
                "background runs: the runs store has failed for %.0fs (%d tries): %s",
                now - self.since,
                self.tries,
                exc,
            )

    def answered(self) -> None:
        if self.since is not None:
            log.warning(
                "background runs: the runs store answers again, after %.0fs (%d failed tries)",
                time.monotonic() - self.since,
                self.tries,
            )
            self.since = None
            self.tries = 0
