"""Where background runs are kept: the two stores behind :class:`bls.journal.Journal`,
and how ``bls serve --runs URL`` (``[runs] store``) names one.

- **SQLite** (``sqlite:///PATH``, or a plain path), the default, in :func:`default_path`.
  It is opened in WAL mode with ``synchronous=NORMAL``: each write is committed before
  the run goes on, and a commit is in the operating system's hands at once, so a
  frontend killed with SIGKILL loses nothing it wrote; a power loss may lose the last
  commits (up to the last checkpoint's ``fsync``). Several frontends on one machine may
  share the file: SQLite locks it, a writer waits for another at most :data:`BUSY_MS`.
- **PostgreSQL** (``postgresql://USER@HOST/DB``, libpq's URL; needs ``psycopg``: ``pip
  install 'bls-pipelines[postgres]'``), for frontends on several machines. Each write is
  a committed transaction (with the server's default ``synchronous_commit``, on the
  server's disk before the run goes on, so it survives the server's crash too); a lock
  is waited for at most :data:`BUSY_MS`, a statement at most :data:`STATEMENT_MS`, a dead
  server or network is noticed by TCP keepalives. A connection that broke is opened
  again at the next call. Leases, deadlines and a run's times are on the server's clock
  (:meth:`PostgresJournal.sync_clock`), not each frontend's: frontends on hosts whose
  clocks differ agree on when a lease ran out.

The event loop calls a store through :meth:`bls.journal.Journal.do`: SQLite's calls run
in place (a write is a few tens of microseconds on a local disk); PostgreSQL's wait on
the network and the server's commit, and run in worker threads, the loop serving on
meanwhile (``bench/background_runs.py`` measures what either costs a run).
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ParamSpec, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

import anyio
import anyio.to_thread
import msgspec

from .file_bytes import FileBytes
from .journal import EVERY, SCHEMA, Journal, JournalError
from .journal_files import FileRow

log = logging.getLogger("bls.runs")

__all__ = [
    "BUSY_MS",
    "CONNECTIONS",
    "STATEMENT_MS",
    "PostgresJournal",
    "SqliteJournal",
    "anchored",
    "default_path",
    "open_journal",
]

BUSY_MS = 5000  # how long a write waits for another frontend's, at most
STATEMENT_MS = 15000  # how long one PostgreSQL statement may take, at most
CONNECTIONS = 8  # PostgreSQL connections (and calls at once) of one frontend, at most

_P = ParamSpec("_P")
_T = TypeVar("_T")


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
    ``/var/runs.db``) or a plain path, ``postgresql://...`` (libpq's URL); None: the
    default (:func:`default_path`). :class:`JournalError` for another scheme or a store
    that cannot be opened."""
    if url is None:
        return SqliteJournal(default_path())
    parts = urlsplit(url)
    if parts.scheme == "":
        return SqliteJournal(Path(url))
    if parts.scheme == "sqlite":
        path = _sqlite_path(url)
        if path is None:
            raise JournalError(f"--runs {url}: no file (write sqlite:///PATH)")
        return SqliteJournal(path)
    if parts.scheme in ("postgresql", "postgres"):
        return PostgresJournal(url)
    raise JournalError(
        f"--runs {_shown(url)}: unknown store {parts.scheme!r} "
        "(use sqlite:///PATH or postgresql://USER@HOST/DB)"
    )


def anchored(url: str, base: Path) -> str:
    """A store named in a file (``[runs] store``), a relative path in it made relative
    to ``base``, the file's folder."""
    if url == "off" or urlsplit(url).scheme not in ("", "sqlite"):
        return url
    sqlite = url.startswith("sqlite:")
    named = _sqlite_path(url) if sqlite else Path(url)
    if named is None:
        return url  # (it names no file: open_journal says so)
    path = named.expanduser()
    if path.is_absolute():
        return url
    return f"sqlite://{base / path}" if sqlite else str(base / path)


def _sqlite_path(url: str) -> Path | None:
    """The file a ``sqlite://`` URL names: ``sqlite:///tmp/runs`` is ``/tmp/runs``, and so
    is ``sqlite:////tmp/runs`` (SQLAlchemy's way to write it), not ``//tmp/runs``; None
    when it names none (``sqlite://``, ``sqlite:///``)."""
    path = unquote(url[len("sqlite://") :])
    if not path.strip("/"):
        return None
    return Path("/" + path.lstrip("/") if path.startswith("/") else path)


class SqliteJournal(Journal):
    """The SQLite store: a file, the default (see the module's docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # The Files API's bytes, beside the database (bls.file_bytes); a row keeps none.
        self._bytes = FileBytes(path.with_name(path.name + ".files"))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # (Used by one thread at a time, not always the one that opened it: a test's.)
            self._db = sqlite3.connect(
                path, isolation_level=None, timeout=BUSY_MS / 1000, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            schema = SCHEMA.format(blob="BLOB", real="REAL", compact=" WITHOUT ROWID")
            self._db.executescript(schema)
        except (OSError, sqlite3.Error) as exc:
            raise JournalError(f"cannot open the runs store {path}: {exc}") from None

    def close(self) -> None:
        self._db.close()

    def url(self) -> str:
        return f"sqlite://{self.path.resolve()}"

    def _execute(self, sql: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, args)
        except sqlite3.Error as exc:
            raise JournalError(f"the runs store {self.path} failed: {exc}") from exc

    def _execute_many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        try:
            self._db.executemany(sql, rows)
        except sqlite3.Error as exc:
            raise JournalError(f"the runs store {self.path} failed: {exc}") from exc

    # -- the files' bytes, beside the database ------------------------------------------

    async def save_file(self, file: FileRow) -> None:
        """Its bytes on disk beside the database (in a worker thread), then its row."""
        assert file.data is not None
        await self._on_disk(self._bytes.write, file.id, file.data)
        try:
            self.put_file(msgspec.structs.replace(file, data=b""))
        except JournalError:
            await self._on_disk(self._bytes.remove, [file.id])
            raise

    async def load_file(self, file_id: str) -> FileRow | None:
        found = self.file(file_id, data=True)
        if found is None or found.data or found.size == 0:
            return found  # (the bytes in the row: a store written before they moved out)
        data = await self._on_disk(self._bytes.read, file_id)
        if data is None:
            where = self._bytes.path(file_id)
            raise JournalError(f"the runs store {self.path} lost the bytes of {file_id} ({where})")
        found.data = data
        return found

    async def drop_file(self, file_id: str) -> bool:
        gone = self.delete_file(file_id)
        await self._on_disk(self._bytes.remove, [file_id])
        return gone

    def prune(
        self, *, older_than: float | None = None, keep: int | None = None, limit: int = EVERY
    ) -> int:
        gone = super().prune(older_than=older_than, keep=keep, limit=limit)
        if older_than is not None:  # (the bytes of the files it forgot, and any left behind)
            known = {row[0] for row in self._execute("SELECT id FROM files").fetchall()}
            try:
                self._bytes.forget(older_than, known)
            except OSError as exc:
                raise self._files_failed(exc) from exc
        return gone

    async def used_bytes(self) -> int:
        """The database's pages in use (not those its deletes freed for reuse: the file
        does not shrink) and the files' bytes beside it."""
        pages = self._execute("PRAGMA page_count").fetchone()[0]
        free = self._execute("PRAGMA freelist_count").fetchone()[0]
        page = self._execute("PRAGMA page_size").fetchone()[0]
        return int((pages - free) * page) + await self._on_disk(self._bytes.total)

    async def _on_disk(self, work: Callable[..., _T], *args: Any) -> _T:
        try:
            return await anyio.to_thread.run_sync(work, *args)
        except OSError as exc:
            raise self._files_failed(exc) from exc

    def _files_failed(self, exc: OSError) -> JournalError:
        return JournalError(f"the runs store's files in {self._bytes.folder}: {exc}")

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        # BEGIN IMMEDIATE takes the file's write lock first: no other frontend's write
        # comes between this one's read and its writes.
        self._execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._execute("COMMIT")


class PostgresJournal(Journal):
    """The PostgreSQL store, shared by frontends on any machine (see the module's
    docstring). Connections in autocommit: each statement outside :meth:`_transaction`
    commits on its own. The event loop's calls (:meth:`do`) run in worker threads, at
    most :data:`CONNECTIONS` at once, each on a connection no other call holds meanwhile;
    a direct call uses its thread's own."""

    _lock_rows = " FOR UPDATE SKIP LOCKED"  # a row another frontend is claiming: skipped

    def __init__(self, url: str) -> None:
        try:
            import psycopg
        except ImportError:
            raise JournalError(
                f"--runs {_shown(url)}: the PostgreSQL store needs psycopg "
                "(pip install 'bls-pipelines[postgres]')"
            ) from None
        self._psycopg = psycopg
        self._url = url
        self._sql: dict[str, str] = {}
        self._local = threading.local()  # .db: the connection this thread's call holds
        self._idle: list[Any] = []  # connections no call holds
        self._opened: list[Any] = []  # every connection, to close
        self._lock = threading.Lock()  # (the two lists are the worker threads' too)
        self._limiter: anyio.CapacityLimiter | None = None  # (made on the loop, at first use)
        schema = SCHEMA.format(blob="BYTEA", real="DOUBLE PRECISION", compact="")
        with self._transaction():
            # (Frontends that start together would race to make the tables: one at a time.)
            self._execute("SELECT pg_advisory_xact_lock(?)", (0x626C7372756E73,))
            for statement in filter(str.strip, schema.split(";")):
                self._execute(statement)
        self.sync_clock()

    def sync_clock(self) -> None:
        """The server's clock against this host's (:attr:`offset`), read halfway through
        a round trip; a warning when they are a second or more apart."""
        before = time.time()
        server = self._execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0]
        after = time.time()
        offset = float(server) - (before + after) / 2
        if abs(offset) >= 1 and abs(offset - self.offset) >= 1:
            log.warning(
                "background runs: this host's clock is %.1f s %s the runs store's (%s); "
                "runs' leases, deadlines and times are on the store's",
                abs(offset),
                "behind" if offset > 0 else "ahead of",
                _shown(self._url),
            )
        self.offset = offset

    async def do(self, method: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(CONNECTIONS)
        # (Not cancellable once started: a write in flight finishes, within the statement
        # timeout, and is known to have.)
        work = functools.partial(self._held, method, *args, **kwargs)
        return await anyio.to_thread.run_sync(work, limiter=self._limiter)

    def _held(self, method: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``method``, in a worker thread, on an idle connection (a new one if none is)."""
        with self._lock:
            self._local.db = self._idle.pop() if self._idle else None
        try:
            return method(*args, **kwargs)
        finally:
            db, self._local.db = self._local.db, None
            if db is not None and not db.closed:
                with self._lock:
                    self._idle.append(db)

    def _connect(self) -> Any:
        try:
            # (The URL's own ?options=, if any, after these: they win.)
            given = self._psycopg.conninfo.conninfo_to_dict(self._url).get("options") or ""
            ours = f"-c lock_timeout={BUSY_MS} -c statement_timeout={STATEMENT_MS}"
            db = self._psycopg.connect(
                self._url,
                autocommit=True,
                connect_timeout=max(1, BUSY_MS // 1000),
                options=f"{ours} {given}".strip(),
                keepalives=1,
                keepalives_idle=5,
                keepalives_interval=2,
                keepalives_count=3,
            )
        except self._psycopg.Error as exc:
            raise JournalError(f"cannot open the runs store {_shown(self._url)}: {exc}") from None
        with self._lock:
            self._opened = [d for d in self._opened if not d.closed]
            self._opened.append(db)
        return db

    def close(self) -> None:
        with self._lock:
            opened, self._opened, self._idle = self._opened, [], []
        for db in opened:
            db.close()

    def url(self) -> str:
        return _shown(self._url)

    def _connection(self) -> Any:
        db = getattr(self._local, "db", None)
        if db is None or db.closed:  # none yet in this thread, or it broke: a new one
            db = self._local.db = self._connect()
        return db

    def _fail(self, exc: Exception) -> JournalError:
        return JournalError(f"the runs store {_shown(self._url)} failed: {exc}")

    def _execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        cursor = self._connection().cursor()
        try:
            return cursor.execute(self._translated(sql), args)
        except self._psycopg.Error as exc:
            raise self._fail(exc) from exc

    def _execute_many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            try:
                self._connection().cursor().executemany(self._translated(sql), rows)
            except self._psycopg.Error as exc:
                raise self._fail(exc) from exc

    def _translated(self, sql: str) -> str:
        """``sql`` with psycopg's ``%s`` for each ``?`` (no statement has another ``?``
        or ``%``)."""
        found = self._sql.get(sql)
        if found is None:
            found = self._sql[sql] = sql.replace("?", "%s")
        return found

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        try:
            with self._connection().transaction():
                yield
        except self._psycopg.Error as exc:
            raise self._fail(exc) from exc


def _shown(url: str) -> str:
    """``url`` without its password, for a message or the log."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
