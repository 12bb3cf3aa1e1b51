"""The runs store (bls.journal, bls.stores): where it is, leases and take-overs between frontends,
an outcome written once, events read back in pages, retention, the Files API's bytes."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import msgspec
import pytest

from bls.file_bytes import FileBytes
from bls.journal import Journal, JournalError, RunLost, RunRow
from bls.journal_files import FileRow
from bls.recording import RecordedCall
from bls.stores import SqliteJournal, anchored, default_path, open_journal

# Every test below but the first takes ``open_store``: a function that opens the same
# store again (as another frontend would). Here it is SQLite; tests/e2e/test_postgres.py
# runs the same tests on a PostgreSQL server.
OpenStore = Callable[[], Journal]


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[OpenStore]:
    opened: list[Journal] = []

    def again() -> Journal:
        opened.append(SqliteJournal(tmp_path / "r.db"))
        return opened[-1]

    yield again
    for journal in opened:
        journal.close()


def row(run_id: str, *, created: float, status: str = "queued", lease: float = 0.0) -> RunRow:
    return RunRow(
        id=run_id,
        script="/s.py",
        entry="e",
        status=status,
        request=b"{}",
        created=created,
        owner="a" if lease else None,
        lease=lease,
    )


def test_stores_are_named_by_url_or_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def path(url: str | None) -> Path:
        journal = open_journal(url)
        assert isinstance(journal, SqliteJournal)
        journal.close()
        return journal.path

    assert path(f"sqlite://{tmp_path}/a.db") == tmp_path / "a.db"
    assert path(str(tmp_path / "b.db")) == tmp_path / "b.db"
    # Four slashes, as SQLAlchemy writes an absolute path: the same file, shown with one.
    assert path(f"sqlite:///{tmp_path}/c.db") == tmp_path / "c.db"
    for empty in ("sqlite://", "sqlite:///", "sqlite:////"):
        with pytest.raises(JournalError, match="no file"):
            open_journal(empty)
        assert anchored(empty, tmp_path) == empty
    shown = open_journal(f"sqlite:///{tmp_path}/c.db")
    shown.close()
    assert shown.url() == f"sqlite://{tmp_path}/c.db"
    monkeypatch.setenv("BLS_STATE_DIR", str(tmp_path / "state"))
    assert default_path() == tmp_path / "state" / "runs.sqlite3"
    assert path(None) == default_path()
    with pytest.raises(JournalError, match="unknown store 'redis'"):
        open_journal("redis://x")
    # A server that is not there: a clear error, within the connect timeout, the password
    # not in it.
    with pytest.raises(JournalError, match=r"cannot open the runs store postgresql://u:\*\*\*@127"):
        open_journal("postgresql://u:secret@127.0.0.1:1/runs")
    (tmp_path / "file").write_text("")
    with pytest.raises(JournalError, match="cannot open the runs store"):
        open_journal(str(tmp_path / "file" / "runs.db"))
    # In bls.toml a relative store is the file's folder's.
    assert anchored("sqlite://runs.db", tmp_path) == f"sqlite://{tmp_path}/runs.db"
    assert anchored("runs.db", tmp_path) == str(tmp_path / "runs.db")
    assert anchored("sqlite:///abs.db", tmp_path) == "sqlite:///abs.db"
    assert anchored("off", tmp_path) == "off"


def test_a_run_is_taken_over_only_once_its_owners_lease_ran_out(open_store: OpenStore) -> None:
    one, two = open_store(), open_store()  # two frontends
    now = time.time()
    one.create(row("held", created=now, status="running", lease=now + 60))
    one.create(row("waiting", created=now + 1))
    one.create(row("urgent", created=now + 2))
    two._execute("UPDATE runs SET priority = 5 WHERE id = 'urgent'")
    taken = two.claim("/s.py", "b", now + 10, limit=10)
    assert [r.id for r in taken] == ["urgent", "waiting"]  # priority, then age
    assert all(r.owner == "b" for r in taken)
    assert one.claim("/s.py", "a", now + 10, limit=10) == []  # b holds them now
    assert two.claim("/other.py", "b", now + 10, limit=10) == []  # another script's: none
    # The owner renews; a cancel asked elsewhere, and a run lost to another, come back.
    one.ask_cancel("waiting")
    assert two.renew("b", ["urgent", "waiting"], now + 20) == ["waiting"]
    assert one.renew("a", ["urgent"], now + 20) == ["urgent"]  # not a's
    one.release("a", ["held"])
    assert [r.id for r in two.claim("/s.py", "b", now + 10, limit=10)] == ["held"]


def test_a_run_taken_over_takes_no_write_from_its_old_owner(open_store: OpenStore) -> None:
    # Frontend a ran "r"; it stalled (a pause, a network cut) past its lease and b took
    # the run over. What a writes of it then, late, is refused, and b's writes stand.
    one, two = open_store(), open_store()
    now = time.time()
    one.create(row("r", created=now, status="running", lease=now - 1))  # (owner a)
    call = RecordedCall(stage="s", streaming=False, request=b"\x01", start=0.0, result_type=None)
    one.call("r", 0, call, done=False, owner="a")
    one.event("r", 1, "status", b"{}", owner="a")
    assert [r.id for r in two.claim("/s.py", "b", now + 10, limit=1)] == ["r"]
    ended = RecordedCall(**{**msgspec.structs.asdict(call), "items": [b"\x02"], "end": 1.0})
    with pytest.raises(RunLost, match="run r is another frontend's now"):
        one.call("r", 0, ended, done=True, owner="a")
    with pytest.raises(RunLost):
        one.call("r", 1, call, done=False, owner="a")
    with pytest.raises(RunLost):
        one.event("r", 2, "item", b"1", owner="a")
    assert [(seq, c.items, done) for seq, c, done in two.calls("r")] == [(0, [], False)]
    assert [seq for seq, _, _ in two.events("r")] == [1]
    two.call("r", 0, ended, done=True, owner="b")
    two.event("r", 2, "item", b"1", owner="b")
    assert [(seq, done) for seq, _, done in one.calls("r")] == [(0, True)]
    assert [seq for seq, _, _ in one.events("r")] == [1, 2]


def test_an_outcome_is_written_once(open_store: OpenStore) -> None:
    journal = open_store()
    journal.create(row("r", created=time.time()))
    assert journal.status("r") == "queued" and journal.status("none") is None
    assert journal.finish("r", "cancelled", error=b'{"error":{}}')
    assert journal.status("r") == "cancelled"
    assert not journal.finish("r", "succeeded", result=b"1")  # the cancel came first
    done = journal.get("r")
    assert done is not None and (done.status, done.result) == ("cancelled", None)
    assert done.ended is not None and done.lease == 0


def test_a_list_or_a_size_reads_no_runs_payloads(open_store: OpenStore) -> None:
    """A page of runs, and the size of a run's result (what GET /v1/runs/ID holds against
    the bound of large answers before it reads the result), come without the requests
    and results the runs hold."""
    journal = open_store()
    now = time.time()
    journal.create(row("a", created=now))
    journal.create(row("b", created=now + 1))
    assert journal.finish("a", "succeeded", result=b"x" * 5000)
    assert (journal.result_size("a"), journal.result_size("b")) == (5000, 0)
    assert journal.result_size("none") is None
    listed = journal.runs()
    assert [(r.id, r.status, r.request, r.result) for r in listed] == [
        ("b", "queued", b"", None),
        ("a", "succeeded", b"", None),
    ]
    assert [r.request for r in journal.runs(request=True)] == [b"{}", b"{}"]  # (batches')
    one = journal.get("a", request=False)
    assert one is not None and (one.request, one.result) == (b"", b"x" * 5000)
    whole = journal.get("a")
    assert whole is not None and whole.request == b"{}"


def test_calls_and_events_come_back_in_order(open_store: OpenStore) -> None:
    journal = open_store()
    call = RecordedCall(stage="s", streaming=False, request=b"\x80", start=0.0, result_type=None)
    journal.call("r", 1, call, done=False)
    journal.call("r", 0, call, done=True)
    journal.call("r", 1, call, done=True)  # the same call, ended
    assert [(seq, done) for seq, _, done in journal.calls("r")] == [(0, True), (1, True)]
    for seq in range(1, 301):
        journal.event("r", seq, "item", b"%d" % seq)
    page = journal.events("r")
    assert len(page) == 256 and page[0] == (1, "item", b"1")
    assert [s for s, _, _ in journal.events("r", after=page[-1][0])] == list(range(257, 301))
    assert journal.last_event("r") == 300 and journal.last_event("none") == 0


def test_a_runs_status_and_its_news_come_in_one_read(open_store: OpenStore) -> None:
    """What an events stream reads each time it looks: the run's status and its new
    events, the small ones with their data, the others by their size alone."""
    journal = open_store()
    journal.create(row("r", created=time.time(), status="running"))
    assert journal.news("r", 0) == ("running", [])
    journal.event("r", 1, "status", b"{}")
    journal.event("r", 2, "item", b"[1,2]")
    journal.event("r", 3, "item", b"x" * 2000)
    assert journal.news("r", 0) == (
        "running",
        [(1, "status", 2, b"{}"), (2, "item", 5, b"[1,2]"), (3, "item", 2000, None)],
    )
    assert journal.news("r", 1, limit=1) == ("running", [(2, "item", 5, b"[1,2]")])
    assert journal.news("r", 2, inline=2000)[1] == [(3, "item", 2000, b"x" * 2000)]
    journal.finish("r", "succeeded", result=b"1")
    assert journal.news("r", 3) == ("succeeded", [])
    assert journal.news("gone", 0) == (None, [])


def test_finished_runs_are_forgotten_by_age_and_count(open_store: OpenStore) -> None:
    journal = open_store()
    now = time.time()
    for n in range(5):
        journal.create(row(f"r{n}", created=now + n))
        if n < 4:
            journal.finish(f"r{n}", "succeeded", result=b"1")
    journal._execute(
        "UPDATE runs SET created = ?, ended = ? WHERE id = 'r0'", (now - 200, now - 100)
    )
    assert journal.prune(older_than=50) == 1
    assert journal.prune(keep=3) == 1  # r1 (r4, not finished, counts among the 3 kept)
    assert [r.id for r in journal.runs()] == ["r4", "r3", "r2"]
    assert [r.id for r in journal.runs(status="succeeded", limit=1)] == ["r3"]
    assert [r.id for r in journal.runs(before="r3")] == ["r2"]
    assert journal.prune(keep=0) == 2  # a run not finished is never forgotten
    assert [r.id for r in journal.runs()] == ["r4"]


def test_the_oldest_finished_runs_holding_what_is_asked_are_forgotten(
    open_store: OpenStore,
) -> None:
    """``[runs] max_bytes``: the oldest finished runs go until those gone held ``room``
    bytes (request, result, calls, events), ``limit`` at most; a live run never goes."""
    journal = open_store()
    now = time.time()
    call = RecordedCall(stage="s", streaming=False, request=b"\x80", start=0.0, result_type=None)
    for n in range(6):
        journal.create(msgspec.structs.replace(row(f"r{n}", created=now + n), request=b"x" * 1000))
        journal.call(f"r{n}", 0, call, done=True)
        journal.event(f"r{n}", 1, "item", b"y" * 1000)
        if n != 0:  # (r0: the oldest, running)
            journal.finish(f"r{n}", "succeeded", result=b"1")
    assert journal.forget_oldest(2500, limit=100) == 2  # r1, r2: some 2,000 bytes each
    assert [r.id for r in journal.runs()] == ["r5", "r4", "r3", "r0"]
    assert journal.forget_oldest(10**9, limit=1) == 1  # r3
    assert journal.forget_oldest(10**9, limit=100) == 2
    assert [r.id for r in journal.runs()] == ["r0"] and journal.forget_oldest(1, 100) == 0
    assert journal.calls("r4") == [] and journal.events("r4") == []


def test_runs_are_forgotten_a_slice_at_a_time(open_store: OpenStore) -> None:
    journal = open_store()
    now = time.time()
    call = RecordedCall(stage="s", streaming=False, request=b"\x80", start=0.0, result_type=None)
    for n in range(10):
        journal.create(row(f"r{n}", created=now + n))
        journal.call(f"r{n}", 0, call, done=True)
        journal.event(f"r{n}", 1, "item", b"1")
        journal.finish(f"r{n}", "succeeded", result=b"1")
    # (A caller calls again while a slice comes back full: each holds the store briefly.)
    assert [journal.prune(keep=1, limit=4) for _ in range(4)] == [4, 4, 1, 0]
    assert [r.id for r in journal.runs()] == ["r9"]
    assert journal.calls("r0") == [] and journal.events("r0") == []  # all of a run goes
    assert len(journal.calls("r9")) == 1 and len(journal.events("r9")) == 1


def test_two_frontends_claiming_at_once_never_both_get_a_run(open_store: OpenStore) -> None:
    now = time.time()
    first = open_store()
    for n in range(120):
        first.create(row(f"r{n:03}", created=now + n))
    got: dict[str, list[str]] = {"a": [], "b": []}
    failed: list[BaseException] = []

    def claimer(owner: str) -> None:
        try:
            journal = open_store()  # (its own connection, in its own thread)
            while taken := journal.claim("/s.py", owner, now + 600, limit=3):
                got[owner].extend(r.id for r in taken)
        except BaseException as exc:  # (reported below, in the test's thread)
            failed.append(exc)

    threads = [threading.Thread(target=claimer, args=(o,)) for o in got]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failed, failed
    assert not set(got["a"]) & set(got["b"])
    assert sorted(got["a"] + got["b"]) == [f"r{n:03}" for n in range(120)]
    assert {r.owner for r in first.runs(limit=200)} == {o for o in got if got[o]}


def test_what_a_client_lists_and_what_is_forgotten_is_found_by_index(tmp_path: Path) -> None:
    """On SQLite every query runs on the event loop's thread: listing a status or a kind
    that few runs have, and finding what to forget, must not walk the whole table (at
    200,000 runs that took 40-170 ms a query)."""
    journal = SqliteJournal(tmp_path / "r.db")
    now = time.time()
    for n in range(20):
        journal.create(row(f"r{n}", created=now + n))
        journal.finish(f"r{n}", "succeeded", result=b"1")
    journal._db.execute("ANALYZE")  # (as a store with many runs would plan)
    statements: list[str] = []
    journal._db.set_trace_callback(statements.append)
    journal.runs(status="failed")
    journal.runs(entry="batch:chat")
    journal.runs(status="failed", before="r3")
    journal.prune(older_than=60, keep=10, limit=5)
    journal._db.set_trace_callback(None)
    selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(selects) >= 5
    for sql in selects:
        plan = [r[3] for r in journal._db.execute("EXPLAIN QUERY PLAN " + sql).fetchall()]
        walks = [p for p in plan if p.startswith("SCAN runs") and "COVERING INDEX" not in p]
        assert not walks, (sql, plan)
    journal.close()


def _file(file_id: str, data: bytes, created: float | None = None) -> FileRow:
    made = time.time() if created is None else created
    return FileRow(
        id=file_id, purpose="batch", filename="in.jsonl", size=len(data), created=made, data=data
    )


def test_a_files_bytes_are_kept_beside_a_sqlite_store_not_in_it(tmp_path: Path) -> None:
    """A 64 MiB upload written into SQLite held the event loop (and the write lock every
    run's journal waits on) for 0.4 s: the bytes go to a file of their own, in a thread."""
    journal = SqliteJournal(tmp_path / "r.db")
    folder = tmp_path / "r.db.files"
    data = os.urandom(100_000)
    anyio.run(journal.save_file, _file("file-a", data))
    row = journal.file("file-a", data=True)
    assert row is not None and row.data == b"" and row.size == len(data)  # (the row alone)
    assert (folder / "file-a").read_bytes() == data
    loaded = anyio.run(journal.load_file, "file-a")
    assert loaded is not None and loaded.data == data
    assert anyio.run(journal.load_file, "file-none") is None
    journal.put_file(_file("file-old", b"kept in the row"))  # (a store written before)
    loaded = anyio.run(journal.load_file, "file-old")
    assert loaded is not None and loaded.data == b"kept in the row"
    anyio.run(journal.save_file, _file("file-empty", b""))
    loaded = anyio.run(journal.load_file, "file-empty")
    assert loaded is not None and loaded.data == b""

    (folder / "file-a").unlink()  # (bytes lost: said, not answered as empty)
    with pytest.raises(JournalError, match="lost the bytes of file-a"):
        anyio.run(journal.load_file, "file-a")
    anyio.run(journal.save_file, _file("file-b", b"b"))
    assert anyio.run(journal.drop_file, "file-b") is True
    assert not (folder / "file-b").exists() and journal.file("file-b") is None
    with pytest.raises(ValueError, match="is not a file id"):
        FileBytes(folder).path("../r.db")  # (an id from a URL never names another path)
    journal.close()


def test_files_past_retention_go_with_their_bytes_and_so_do_bytes_without_a_row(
    tmp_path: Path,
) -> None:
    journal = SqliteJournal(tmp_path / "r.db")
    folder = tmp_path / "r.db.files"
    long_ago = time.time() - 1000
    anyio.run(journal.save_file, _file("file-old", b"old", created=long_ago))
    anyio.run(journal.save_file, _file("file-new", b"new"))
    for name in ("file-old", "file-orphan", ".partial-0123"):  # (a crash left the last two)
        (folder / name).write_bytes(b"x")
        os.utime(folder / name, (long_ago, long_ago))
    (folder / "file-young-orphan").write_bytes(b"y")  # (being written now, maybe: kept)
    journal.prune(older_than=60)
    assert journal.file("file-old") is None and journal.file("file-new") is not None
    assert sorted(p.name for p in folder.iterdir()) == ["file-new", "file-young-orphan"]
    journal.close()
