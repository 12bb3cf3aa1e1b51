"""The journal of background runs: each run's request, every stage call it made (its
request when it starts, its result or error when it ends) and its outcome, in a store
that outlives the frontend (``bls serve --runs URL``; :mod:`bls.serve.runs` writes it,
:mod:`bls.resume` reads it back to recover a run).

One store is written here: SQLite (``sqlite:///PATH``, or a plain path), the default, in
:func:`default_path`. It is opened in WAL mode with ``synchronous=NORMAL``: each write is
committed before the run goes on, and a commit is in the operating system's hands at
once, so a frontend killed with SIGKILL loses nothing it wrote; a power loss may lose
the last commits (up to the last checkpoint's ``fsync``). Several frontends on one
machine may share the file: SQLite locks it, a writer waits for another at most
:data:`BUSY_MS`.

Each run has an owner (the frontend running it) and a lease that the owner renews
(:meth:`Journal.renew`); a run whose lease ran out belongs to whoever claims it next
(:meth:`Journal.claim`): that is how a frontend that died has its runs taken over.
Calls are stored as :class:`bls.recording.RecordedCall` (msgpack), numbered in the
order they started; a call without an end was in flight when its frontend stopped.

Calls are made on the event loop's thread: a write is a few tens of microseconds on a
local disk (``bench/background_runs.py`` measures what it costs a run).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import msgspec

from .recording import RecordedCall

__all__ = [
    "BUSY_MS",
    "STATUSES",
    "TERMINAL",
    "Journal",
    "JournalError",
    "RunRow",
    "anchored",
    "default_path",
    "open_journal",
]

BUSY_MS = 5000  # how long a write waits for another frontend's, at most
STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})

_call_encoder = msgspec.msgpack.Encoder()
_call_decoder = msgspec.msgpack.Decoder(RecordedCall)


class JournalError(ValueError):
    """A store that cannot be opened or used, saying which and why."""


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


_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, script TEXT NOT NULL, entry TEXT NOT NULL, status TEXT NOT NULL,
    request BLOB NOT NULL, priority INTEGER NOT NULL, created REAL NOT NULL,
    started REAL, ended REAL, deadline REAL, result BLOB, error BLOB,
    owner TEXT, lease REAL NOT NULL, cancel INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_by_status ON runs (script, status, lease);
CREATE INDEX IF NOT EXISTS runs_by_age ON runs (created);
CREATE TABLE IF NOT EXISTS calls (
    run TEXT NOT NULL, seq INTEGER NOT NULL, call BLOB NOT NULL, done INTEGER NOT NULL,
    PRIMARY KEY (run, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    run TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (run, seq)
) WITHOUT ROWID;
"""
_COLUMNS = tuple(RunRow.__struct_fields__)


def default_path() -> Path:
    """Where runs are kept when no store is named: ``$BLS_STATE_DIR/runs.sqlite3``, else
    ``$XDG_STATE_HOME/bls/runs.sqlite3``, else ``~/.local/state/bls/runs.sqlite3``."""
    folder = os.environ.get("BLS_STATE_DIR")
    if not folder:
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        folder = str(Path(state) / "bls")
    return Path(folder) / "runs.sqlite3"


def open_journal(url: str | None) -> Journal:
    """The store ``url`` names: ``sqlite://PATH`` (``sqlite:///var/runs.db`` is
    ``/var/runs.db``), or a plain path; None: the default (:func:`default_path`).
    :class:`JournalError` for another scheme or a file that cannot be opened."""
    if url is None:
        return Journal(default_path())
    parts = urlsplit(url)
    if parts.scheme == "":
        return Journal(Path(url))
    if parts.scheme == "sqlite":
        path = unquote(url[len("sqlite://") :])  # sqlite:///tmp/runs: /tmp/runs
        if not path.strip("/"):
            raise JournalError(f"--runs {url}: no file (write sqlite:///PATH)")
        return Journal(Path(path))
    if parts.scheme in ("postgresql", "postgres"):
        raise JournalError(
            f"--runs {parts.scheme}://...: PostgreSQL is not supported yet; "
            "use sqlite:///PATH (several frontends on one machine may share the file)"
        )
    raise JournalError(f"--runs {url}: unknown store {parts.scheme!r} (use sqlite:///PATH)")


def anchored(url: str, base: Path) -> str:
    """A store named in a file (``[runs] store``), a relative path in it made relative
    to ``base``, the file's folder."""
    if url == "off" or urlsplit(url).scheme not in ("", "sqlite"):
        return url
    sqlite = url.startswith("sqlite:")
    path = Path(unquote(url[len("sqlite://") :]) if sqlite else url).expanduser()
    if path.is_absolute():
        return url
    return f"sqlite://{base / path}" if sqlite else str(base / path)


class Journal:
    """The SQLite store (see the module's docstring). Every method commits before it
    returns; :class:`JournalError` when the file cannot be written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, isolation_level=None, timeout=BUSY_MS / 1000)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise JournalError(f"cannot open the runs store {path}: {exc}") from None

    def close(self) -> None:
        self._db.close()

    def url(self) -> str:
        return f"sqlite://{self.path.resolve()}"

    # -- runs -----------------------------------------------------------------------------

    def create(self, run: RunRow) -> None:
        values = [getattr(run, c) for c in _COLUMNS]
        marks = ", ".join("?" * len(_COLUMNS))
        self._db.execute(f"INSERT INTO runs ({', '.join(_COLUMNS)}) VALUES ({marks})", values)

    def get(self, run_id: str) -> RunRow | None:
        row = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM runs WHERE id = ?", (run_id,))
        found = row.fetchone()
        return None if found is None else _row(found)

    def runs(
        self, *, status: str | None = None, before: str | None = None, limit: int = 50
    ) -> list[RunRow]:
        """Runs newest first (``before``: those created before that run), ``limit`` at
        most, of ``status`` only when given."""
        where, args = [], []
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if before is not None:
            where.append("(created, id) < (SELECT created, id FROM runs WHERE id = ?)")
            args.append(before)
        sql = f"SELECT {', '.join(_COLUMNS)} FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created DESC, id DESC LIMIT ?"
        return [_row(r) for r in self._db.execute(sql, (*args, limit))]

    def started(self, run_id: str, owner: str, lease: float) -> None:
        self._db.execute(
            "UPDATE runs SET status = 'running', started = coalesce(started, ?), owner = ?, "
            "lease = ? WHERE id = ? AND status IN ('queued', 'running')",
            (time.time(), owner, lease, run_id),
        )

    def finish(
        self, run_id: str, status: str, *, result: bytes | None = None, error: bytes | None = None
    ) -> bool:
        """The run's outcome, once: False when it had one already (a cancel that came
        first)."""
        assert status in TERMINAL
        done = self._db.execute(
            "UPDATE runs SET status = ?, result = ?, error = ?, ended = ?, lease = 0 "
            "WHERE id = ? AND status NOT IN ('succeeded', 'failed', 'cancelled')",
            (status, result, error, time.time(), run_id),
        )
        return done.rowcount == 1

    def queued(self, script: str) -> int:
        """How many runs of ``script`` wait to start."""
        row = self._db.execute(
            "SELECT count(*) FROM runs WHERE script = ? AND status = 'queued'", (script,)
        ).fetchone()
        return int(row[0])

    def ask_cancel(self, run_id: str) -> None:
        self._db.execute("UPDATE runs SET cancel = 1 WHERE id = ?", (run_id,))

    def claim(self, script: str, owner: str, lease: float, limit: int) -> list[RunRow]:
        """Up to ``limit`` unfinished runs of ``script`` whose owner's lease ran out (or
        that were never started), now ``owner``'s until ``lease``; queued ones by priority,
        then oldest first."""
        now = time.time()
        with self._transaction():
            rows = self._db.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM runs WHERE script = ? "
                "AND status IN ('queued', 'running') AND lease < ? "
                "ORDER BY priority DESC, created, id LIMIT ?",
                (script, now, limit),
            ).fetchall()
            runs = [_row(r) for r in rows]
            self._db.executemany(
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
            self._db.executemany(
                "UPDATE runs SET lease = ? WHERE id = ? AND owner = ?",
                [(lease, run_id, owner) for run_id in ids],
            )
            marks = ", ".join("?" * len(ids))
            rows = self._db.execute(
                f"SELECT id FROM runs WHERE id IN ({marks}) AND (cancel = 1 OR owner != ? "
                "OR status NOT IN ('queued', 'running'))",
                (*ids, owner),
            ).fetchall()
        return [r[0] for r in rows]

    def release(self, owner: str, run_ids: Iterable[str]) -> None:
        """``owner`` gives its unfinished runs ``run_ids`` up (it is stopping): the next
        frontend takes them over at once."""
        self._db.executemany(
            "UPDATE runs SET lease = 0 WHERE id = ? AND owner = ?",
            [(run_id, owner) for run_id in run_ids],
        )

    def prune(self, *, older_than: float | None = None, keep: int | None = None) -> int:
        """Forget finished runs that ended more than ``older_than`` s ago, and all but the
        newest ``keep`` finished ones; how many went."""
        gone: set[str] = set()
        if older_than is not None:
            rows = self._db.execute(
                "SELECT id FROM runs WHERE status IN ('succeeded', 'failed', 'cancelled') "
                "AND ended < ?",
                (time.time() - older_than,),
            )
            gone.update(r[0] for r in rows)
        if keep is not None:
            rows = self._db.execute(
                "SELECT id FROM runs WHERE status IN ('succeeded', 'failed', 'cancelled') "
                "ORDER BY created DESC, id DESC LIMIT -1 OFFSET ?",
                (keep,),
            )
            gone.update(r[0] for r in rows)
        if gone:
            with self._transaction():
                for table, column in (("runs", "id"), ("calls", "run"), ("events", "run")):
                    self._db.executemany(
                        f"DELETE FROM {table} WHERE {column} = ?", [(g,) for g in gone]
                    )
        return len(gone)

    # -- calls ----------------------------------------------------------------------------

    def call(self, run_id: str, seq: int, call: RecordedCall, done: bool) -> None:
        """Call ``seq`` of the run: as it starts (``done`` False), then as it ended."""
        self._db.execute(
            "INSERT OR REPLACE INTO calls (run, seq, call, done) VALUES (?, ?, ?, ?)",
            (run_id, seq, _call_encoder.encode(call), int(done)),
        )

    def calls(self, run_id: str) -> list[tuple[int, RecordedCall, bool]]:
        """The run's calls in the order they started: (seq, call, whether it ended)."""
        rows = self._db.execute(
            "SELECT seq, call, done FROM calls WHERE run = ? ORDER BY seq", (run_id,)
        )
        return [(seq, _call_decoder.decode(data), bool(done)) for seq, data, done in rows]

    # -- events (a run's items and status changes, for GET /v1/runs/ID/events) -------------

    def event(self, run_id: str, seq: int, kind: str, data: bytes) -> None:
        self._db.execute(
            "INSERT INTO events (run, seq, kind, data) VALUES (?, ?, ?, ?)",
            (run_id, seq, kind, data),
        )

    def events(self, run_id: str, after: int = 0, limit: int = 256) -> list[tuple[int, str, bytes]]:
        """The run's events after ``after``, oldest first, ``limit`` at most."""
        rows = self._db.execute(
            "SELECT seq, kind, data FROM events WHERE run = ? AND seq > ? ORDER BY seq LIMIT ?",
            (run_id, after, limit),
        )
        return [(seq, kind, bytes(data)) for seq, kind, data in rows]

    def last_event(self, run_id: str) -> int:
        row = self._db.execute("SELECT max(seq) FROM events WHERE run = ?", (run_id,)).fetchone()
        return int(row[0] or 0)

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on an exception): a read and the writes it
    decides, with no other frontend's write between them."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        self._db.execute("COMMIT" if exc is None else "ROLLBACK")


def _row(values: tuple[object, ...]) -> RunRow:
    fields: dict[str, Any] = dict(zip(_COLUMNS, values, strict=True))
    fields["cancel"] = bool(fields["cancel"])
    for key in ("request", "result", "error"):
        if fields[key] is not None:
            fields[key] = bytes(fields[key])
    return RunRow(**fields)
