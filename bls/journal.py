"""The journal of background runs: each run's request, every stage call it made (its
request when it starts, its result or error when it ends) and its outcome, in a store
that outlives the frontend (``bls serve --runs URL``; :mod:`bls.serve.runs` writes it,
:mod:`bls.resume` reads it back to recover a run).

:class:`Journal` is the one interface of a store, and the SQL every store shares; the
stores themselves (SQLite, the default, and PostgreSQL), what each guarantees, and how
a URL names one are in :mod:`bls.stores`.

Each run has an owner (the frontend running it) and a lease that the owner renews
(:meth:`Journal.renew`); a run whose lease ran out belongs to whoever claims it next
(:meth:`Journal.claim`): that is how a frontend that died has its runs taken over.
Calls are stored as :class:`bls.recording.RecordedCall` (msgpack), numbered in the
order they started; a call without an end was in flight when its frontend stopped. The
files of the Files API (a batch's input and output) are kept beside the runs
(:mod:`bls.journal_files`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, ParamSpec, TypeVar

import msgspec

from .journal_files import FileStore
from .recording import RecordedCall

__all__ = [
    "EVERY",
    "MAX_VALUE_BYTES",
    "SCHEMA",
    "STATUSES",
    "TERMINAL",
    "Journal",
    "JournalError",
    "Listed",
    "RunLost",
    "RunRow",
]

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
EVERY = 2**62  # LIMIT with no limit, in SQL both stores read
# A value the journal keeps (a run's result, a call, an event), at most: half of what a
# store holds in one (SQLite 10**9 bytes, PostgreSQL 1 GiB), for what encloses it.
MAX_VALUE_BYTES = 512 * 1024 * 1024

_P = ParamSpec("_P")
_T = TypeVar("_T")
Event = tuple[int, str, bytes]  # a run's event: (its number, its kind, its data)
Listed = tuple[int, str, int, bytes | None]  # an event as Journal.news lists it

_call_encoder = msgspec.msgpack.Encoder()
_call_decoder = msgspec.msgpack.Decoder(RecordedCall)


class JournalError(ValueError):
    """A store that cannot be opened or used, saying which and why."""


class RunLost(JournalError):
    """A write for a run that is no longer the writer's: another frontend took it over
    (its lease ran out, as it does while a frontend cannot reach the store)."""


class RunRow(msgspec.Struct, kw_only=True):
    """One background run as the journal holds it. ``result`` and ``error`` are the JSON
    bytes a synchronous request would have been answered with (a streaming entry's
    result: its items, a JSON list); ``deadline`` is epoch seconds (None: none)."""

    id: str
    script: str  # the script's absolute path: a frontend takes over its own script's runs
    entry: str
    status: str
    request: bytes  # the request's body, as the client sent it
    priority: int = 0
    created: float
    started: float | None = None
    ended: float | None = None
    deadline: float | None = None
    result: bytes | None = None
    error: bytes | None = None
    owner: str | None = None
    lease: float = 0.0  # epoch seconds: the owner's claim ends then
    cancel: bool = False  # a cancel was asked (DELETE), for its owner to carry out


# The schema, in each store's words for bytes and floats ({blob}, {real}, {compact}).
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, script TEXT NOT NULL, entry TEXT NOT NULL, status TEXT NOT NULL,
    request {blob} NOT NULL, priority INTEGER NOT NULL, created {real} NOT NULL,
    started {real}, ended {real}, deadline {real}, result {blob}, error {blob},
    owner TEXT, lease {real} NOT NULL, cancel INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_by_status ON runs (script, status, lease);
CREATE INDEX IF NOT EXISTS runs_by_age ON runs (created);
CREATE INDEX IF NOT EXISTS runs_by_status_age ON runs (status, created);
CREATE INDEX IF NOT EXISTS runs_by_entry_age ON runs (entry, created);
CREATE TABLE IF NOT EXISTS calls (
    run TEXT NOT NULL, seq INTEGER NOT NULL, call {blob} NOT NULL, done INTEGER NOT NULL,
    PRIMARY KEY (run, seq)
){compact};
CREATE TABLE IF NOT EXISTS events (
    run TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, data {blob} NOT NULL,
    PRIMARY KEY (run, seq)
){compact};
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, purpose TEXT NOT NULL, filename TEXT NOT NULL,
    size INTEGER NOT NULL, created {real} NOT NULL, data {blob} NOT NULL
);
CREATE INDEX IF NOT EXISTS files_by_age ON files (created);
"""
_COLUMNS = tuple(RunRow.__struct_fields__)


def _but(*left_out: str) -> str:
    """The columns of a RunRow to select, NULL in place of ``left_out``."""
    return ", ".join("NULL" if c in left_out else c for c in _COLUMNS)


_ALL, _BUT_REQUEST, _BUT_RESULT = _but(), _but("request"), _but("result")
_BUT_PAYLOADS = _but("request", "result")


class Journal(FileStore):
    """The runs store (see the module's docstring): the SQL both stores read, written with
    ``?`` for each parameter. Every method commits before it returns;
    :class:`JournalError` when the store cannot be written or read.

    The methods are synchronous; the event loop calls them through :meth:`do`, which
    runs one where the store needs it to run (see there)."""

    _lock_rows = ""  # what makes claim()'s read lock the rows it will write, in this store
    # The store's clock less this process's (epoch seconds, :meth:`sync_clock`).
    offset = 0.0

    def now(self) -> float:
        """The store's clock: leases, deadlines and a run's times are on it, so frontends
        on hosts whose clocks differ agree on them (one whose clock is ahead would take
        over runs that are alive)."""
        return time.time() + self.offset

    def sync_clock(self) -> None:
        """Read the store's clock again (:attr:`offset`); one file: this host's."""

    async def do(self, method: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``method(*args, **kwargs)``, one of this store's methods, from the event loop:
        in place here (a local file's write is a few tens of microseconds); a store whose
        calls wait on a network runs it in a worker thread instead, the loop serving on."""
        return method(*args, **kwargs)

    def close(self) -> None:
        raise NotImplementedError

    def url(self) -> str:
        """The store, for the log (a password left out)."""
        raise NotImplementedError

    def _execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        """Run one statement; its cursor."""
        raise NotImplementedError

    def _execute_many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        raise NotImplementedError

    def _transaction(self) -> AbstractContextManager[None]:
        """A read and the writes it decides, with no other frontend's write between."""
        raise NotImplementedError

    # -- runs -----------------------------------------------------------------------------

    def create(self, run: RunRow) -> None:
        values = [getattr(run, c) for c in _COLUMNS]
        values[_COLUMNS.index("cancel")] = int(run.cancel)  # (an INTEGER, 0 or 1)
        marks = ", ".join("?" * len(_COLUMNS))
        self._execute(f"INSERT INTO runs ({', '.join(_COLUMNS)}) VALUES ({marks})", values)

    def get(self, run_id: str, *, request: bool = True) -> RunRow | None:
        """The run ``run_id`` (``request``: with the request its client sent, else
        ``b""`` in its place); None: no such run."""
        columns = _ALL if request else _BUT_REQUEST
        found = self._execute(f"SELECT {columns} FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if found is None else _row(found)

    def result_size(self, run_id: str) -> int | None:
        """The bytes of the run's result (0: none yet), read without it; None: no such
        run. (What an answer that holds it will hold, before it is read.)"""
        found = self._execute(
            "SELECT coalesce(length(result), 0) FROM runs WHERE id = ?", (run_id,)
        ).fetchone()
        return None if found is None else int(found[0])

    def status(self, run_id: str) -> str | None:
        """The run's status alone (None: no such run), without its result."""
        found = self._execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if found is None else str(found[0])

    def runs(
        self,
        *,
        status: str | None = None,
        entry: str | None = None,
        before: str | None = None,
        limit: int = 50,
        request: bool = False,
    ) -> list[RunRow]:
        """Runs newest first (``before``: those created before that run), ``limit`` at
        most, of ``status`` and of ``entry`` (a batch's run: its kind) only when given;
        each without its result (None) and, unless ``request``, without its request
        (``b""``): a page of a thousand runs never reads what they hold."""
        where, args = [], []
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if entry is not None:
            where.append("entry = ?")
            args.append(entry)
        if before is not None:
            where.append("(created, id) < (SELECT created, id FROM runs WHERE id = ?)")
            args.append(before)
        sql = f"SELECT {_BUT_RESULT if request else _BUT_PAYLOADS} FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created DESC, id DESC LIMIT ?"
        return [_row(r) for r in self._execute(sql, (*args, limit)).fetchall()]

    def started(self, run_id: str, owner: str, lease: float, *, event: Event | None = None) -> None:
        """The run runs, ``owner``'s until ``lease``; with ``event`` (its first) written
        in the same transaction."""
        with self._transaction():
            self._execute(
                "UPDATE runs SET status = 'running', started = coalesce(started, ?), "
                "owner = ?, lease = ? WHERE id = ? AND status IN ('queued', 'running')",
                (self.now(), owner, lease, run_id),
            )
            if event is not None:
                self.event(run_id, *event)

    def finish(
        self,
        run_id: str,
        status: str,
        *,
        result: bytes | None = None,
        error: bytes | None = None,
        event: Event | None = None,
    ) -> bool:
        """The run's outcome, once: False when it had one already (a cancel that came
        first); with ``event`` (its last) written in the same transaction when not."""
        assert status in TERMINAL
        with self._transaction():
            done = self._execute(
                "UPDATE runs SET status = ?, result = ?, error = ?, ended = ?, lease = 0 "
                "WHERE id = ? AND status NOT IN ('succeeded', 'failed', 'cancelled')",
                (status, result, error, self.now(), run_id),
            )
            ended = bool(done.rowcount == 1)
            if ended and event is not None:
                self.event(run_id, *event)
        return ended

    def queued(self, script: str) -> int:
        """How many runs of ``script`` wait to start."""
        row = self._execute(
            "SELECT count(*) FROM runs WHERE script = ? AND status = 'queued'", (script,)
        ).fetchone()
        return int(row[0])

    def ask_cancel(self, run_id: str) -> None:
        self._execute("UPDATE runs SET cancel = 1 WHERE id = ?", (run_id,))

    def claim(self, script: str, owner: str, lease: float, limit: int) -> list[RunRow]:
        """Up to ``limit`` unfinished runs of ``script`` whose owner's lease ran out (or
        that were never started), now ``owner``'s until ``lease``; queued ones by priority,
        then oldest first. Two frontends claiming at once never both get a run."""
        now = self.now()
        with self._transaction():
            rows = self._execute(
                f"SELECT {_ALL} FROM runs WHERE script = ? "
                "AND status IN ('queued', 'running') AND lease < ? "
                f"ORDER BY priority DESC, created, id LIMIT ?{self._lock_rows}",
                (script, now, limit),
            ).fetchall()
            runs = [_row(r) for r in rows]
            self._execute_many(
                "UPDATE runs SET owner = ?, lease = ? WHERE id = ?",
                [(owner, lease, run.id) for run in runs],
            )
        for run in runs:
            run.owner, run.lease = owner, lease
        return runs

    def renew(self, owner: str, run_ids: Iterable[str], lease: float) -> list[str]:
        """``owner``'s runs ``run_ids`` are its own until ``lease``; the ids of those a
        cancel was asked for (:meth:`ask_cancel`), and of those no longer its own."""
        ids = list(run_ids)
        if not ids:
            return []
        with self._transaction():
            self._execute_many(
                "UPDATE runs SET lease = ? WHERE id = ? AND owner = ?",
                [(lease, run_id, owner) for run_id in ids],
            )
            marks = ", ".join("?" * len(ids))
            rows = self._execute(
                f"SELECT id FROM runs WHERE id IN ({marks}) AND (cancel = 1 OR owner != ? "
                "OR status NOT IN ('queued', 'running'))",
                (*ids, owner),
            ).fetchall()
        return [r[0] for r in rows]

    def release(self, owner: str, run_ids: Iterable[str]) -> None:
        """``owner`` gives its unfinished runs ``run_ids`` up (it is stopping): the next
        frontend takes them over at once."""
        self._execute_many(
            "UPDATE runs SET lease = 0 WHERE id = ? AND owner = ?",
            [(run_id, owner) for run_id in run_ids],
        )

    def prune(
        self, *, older_than: float | None = None, keep: int | None = None, limit: int = EVERY
    ) -> int:
        """Forget finished runs that ended more than ``older_than`` s ago (and files made
        that long ago), and finished runs past the newest ``keep`` runs (a queued or
        running one is never forgotten, and counts among them): at most ``limit`` runs a
        call (a call holds the store, and on SQLite the event loop, while it works: call
        again while it returns ``limit``); how many runs went."""
        gone: set[str] = set()
        cutoff = None if older_than is None else self.now() - older_than
        if cutoff is not None:
            rows = self._execute(
                "SELECT id FROM runs WHERE status IN ('succeeded', 'failed', 'cancelled') "
                "AND created < ? AND ended < ? LIMIT ?",  # (created: the index narrows)
                (cutoff, cutoff, limit),
            )
            gone.update(r[0] for r in rows.fetchall())
        if keep is not None and len(gone) < limit:
            # The time of the newest run past the keep newest (of any status: the index
            # by age alone answers, not a row read), then the finished ones made then
            # or before.
            rows = self._execute(
                "SELECT created FROM runs ORDER BY created DESC LIMIT 1 OFFSET ?", (keep,)
            )
            newest_gone = rows.fetchone()
            if newest_gone is not None:
                rows = self._execute(
                    "SELECT id FROM runs WHERE status IN ('succeeded', 'failed', 'cancelled') "
                    "AND created <= ? LIMIT ?",
                    (newest_gone[0], limit - len(gone)),
                )
                gone.update(r[0] for r in rows.fetchall())
        if cutoff is not None:
            self._execute("DELETE FROM files WHERE created < ?", (cutoff,))
        self._forget(gone)
        return len(gone)

    def forget_oldest(self, room: int, limit: int) -> int:
        """Forget the oldest finished runs (a queued or running one is never forgotten)
        until those forgotten held ``room`` bytes (their requests, results, calls and
        events), ``limit`` runs at most: to make room (``[runs] max_bytes``); how many
        went."""
        rows = self._execute(
            "SELECT id, length(request) + coalesce(length(result), 0) + coalesce(length(error), 0)"
            " + coalesce((SELECT sum(length(call)) FROM calls WHERE run = runs.id), 0)"
            " + coalesce((SELECT sum(length(data)) FROM events WHERE run = runs.id), 0) "
            "FROM runs WHERE status IN ('succeeded', 'failed', 'cancelled') "
            "ORDER BY created LIMIT ?",
            (limit,),
        )
        gone: set[str] = set()
        for run_id, size in rows.fetchall():
            if room <= 0:
                break
            gone.add(run_id)
            room -= size
        self._forget(gone)
        return len(gone)

    def _forget(self, gone: set[str]) -> None:
        if gone:
            ids = [(g,) for g in sorted(gone)]  # (in one order: frontends pruning at once)
            with self._transaction():
                for table, column in (("runs", "id"), ("calls", "run"), ("events", "run")):
                    self._execute_many(f"DELETE FROM {table} WHERE {column} = ?", ids)

    async def used_bytes(self) -> int | None:
        """The bytes the store's runs and files take, what forgetting runs frees (``[runs]
        max_bytes``); None where the store cannot tell that cheaply (PostgreSQL, whose
        space is the database's to bound)."""
        return None

    # -- calls ----------------------------------------------------------------------------

    def call(
        self, run_id: str, seq: int, call: RecordedCall, done: bool, owner: str | None = None
    ) -> None:
        """Call ``seq`` of the run: as it starts (``done`` False), then as it ended; with
        ``owner``, only while the run is its (else :class:`RunLost`)."""
        self._fenced(
            "INSERT INTO calls (run, seq, call, done) SELECT ?, ?, ?, ?{} ON CONFLICT "
            "(run, seq) DO UPDATE SET call = excluded.call, done = excluded.done",
            (run_id, seq, _call_encoder.encode(call), int(done)),
            owner,
        )

    def calls(self, run_id: str) -> list[tuple[int, RecordedCall, bool]]:
        """The run's calls in the order they started: (seq, call, whether it ended)."""
        rows = self._execute(
            "SELECT seq, call, done FROM calls WHERE run = ? ORDER BY seq", (run_id,)
        ).fetchall()
        return [(seq, _call_decoder.decode(data), bool(done)) for seq, data, done in rows]

    # -- events (a run's items and status changes, for GET /v1/runs/ID/events) -------------

    def event(
        self, run_id: str, seq: int, kind: str, data: bytes, owner: str | None = None
    ) -> None:
        """Event ``seq`` of the run; with ``owner``, only while the run is its."""
        self._fenced(
            "INSERT INTO events (run, seq, kind, data) SELECT ?, ?, ?, ?{}",
            (run_id, seq, kind, data),
            owner,
        )

    def _fenced(self, sql: str, args: tuple[Any, ...], owner: str | None) -> None:
        """``sql`` writing run ``args[0]``'s row, its ``{}`` the condition that the run is
        ``owner``'s (none without one): a frontend that lost a run to another (whatever
        it had in flight, or late on the network) writes nothing of it."""
        if owner is None:
            self._execute(sql.format(" WHERE true"), args)
        else:
            fence = " WHERE EXISTS (SELECT 1 FROM runs WHERE id = ? AND owner = ?)"
            if self._execute(sql.format(fence), (*args, args[0], owner)).rowcount != 1:
                raise RunLost(f"run {args[0]} is another frontend's now")

    def events(self, run_id: str, after: int = 0, limit: int = 256) -> list[tuple[int, str, bytes]]:
        """The run's events after ``after``, oldest first, ``limit`` at most."""
        rows = self._execute(
            "SELECT seq, kind, data FROM events WHERE run = ? AND seq > ? ORDER BY seq LIMIT ?",
            (run_id, after, limit),
        ).fetchall()
        return [(seq, kind, bytes(data)) for seq, kind, data in rows]

    def news(
        self, run_id: str, after: int, limit: int = 256, inline: int = 1024
    ) -> tuple[str | None, list[Listed]]:
        """The run's status (None: no such run) and its events after ``after`` (``limit``
        at most), in one read: each one's id, kind and bytes, and its data when it is
        ``inline`` bytes or fewer (None: read it with :meth:`events`). A run over has
        its ``end`` among them, or at ``after`` or before."""
        rows = self._execute(
            "SELECT r.status, e.seq, e.kind, length(e.data), CASE WHEN length(e.data) <= ? "
            "THEN e.data END FROM runs r LEFT JOIN events e ON e.run = r.id AND e.seq > ? "
            "WHERE r.id = ? ORDER BY e.seq LIMIT ?",
            (inline, after, run_id, limit),
        ).fetchall()
        listed = [
            (int(seq), str(kind), int(size), None if data is None else bytes(data))
            for _, seq, kind, size, data in rows
            if seq is not None
        ]
        return (str(rows[0][0]) if rows else None), listed

    def last_event(self, run_id: str) -> int:
        row = self._execute("SELECT max(seq) FROM events WHERE run = ?", (run_id,)).fetchone()
        return int(row[0] or 0)


def _row(values: Sequence[object]) -> RunRow:
    fields: dict[str, Any] = dict(zip(_COLUMNS, values, strict=True))
    fields["cancel"] = bool(fields["cancel"])
    if fields["request"] is None:  # (NOT NULL: left out by the read)
        fields["request"] = b""
    for key in ("request", "result", "error"):
        if fields[key] is not None:
            fields[key] = bytes(fields[key])
    return RunRow(**fields)
