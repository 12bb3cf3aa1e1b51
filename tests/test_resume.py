"""Recovering a background run from its journal (bls.resume over bls.journal): finished
calls answered from the journal and not run again, a call in flight sent again only to
an idempotent stage, a changed script failing its recovery naming the divergence; for
an untyped script and a typed one alike."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bls.errors import ErrorKind, StageError
from bls.journal import RunLost, RunRow
from bls.policy import Policy
from bls.replay import Divergence, importable_from
from bls.resume import JournalRecorder, Resume
from bls.scope import Reason, RequestScope
from bls.scriptfile import ScriptFile
from bls.serve.run_events import Live
from bls.stores import SqliteJournal as Journal

pytestmark = pytest.mark.anyio

FOLDER = Path(__file__).parent / "resumable"
ENTRIES = [("plain", {"n": 4, "tag": "t"}), ("typed", {"n": 4, "tag": "t"})]


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ScriptFile:
    for name in ("steps.py", "counting.py", "bls.toml"):
        shutil.copy(FOLDER / name, tmp_path / name)
    monkeypatch.setenv("BLS_TEST_CALLS", str(tmp_path / "calls"))
    return ScriptFile(tmp_path / "steps.py", record=True)


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "runs.sqlite3")


def made(app: ScriptFile) -> list[int]:
    path = app.path.parent / "calls"
    calls = [int(line) for line in path.read_text().split()] if path.exists() else []
    path.unlink(missing_ok=True)
    return calls


async def run(app: ScriptFile, entry: str, req: Any, journal: Journal, resume: bool) -> Any:
    """``entry`` as background run "r" journals it, recovered from the journal when
    ``resume``; its result as JSON."""
    script = app.entry(entry)
    calls = journal.calls("r") if resume else []
    recovery = Resume(calls, importable_from(script)) if resume else None
    recorder = JournalRecorder(journal, "r", app.path, recovery)
    async with app.runtime() as rt, RequestScope("r", record=recorder):
        result = await rt.run(script, req)
    if recovery is not None:
        recovery.check_all_made()
    return msgspec.json.decode(msgspec.json.encode(result))


def crash_after(journal: Journal, finished: int, in_flight: bool = False) -> None:
    """The journal as a frontend killed after ``finished`` calls leaves it (and with the
    next one started, when ``in_flight``)."""
    calls = journal.calls("r")
    db = journal._db
    db.execute("DELETE FROM calls WHERE run = 'r' AND seq >= ?", (finished,))
    if in_flight:
        seq, call, _ = calls[finished]
        call.items, call.end = [], 0.0
        journal.call("r", seq, call, done=False)


@pytest.mark.parametrize(("entry", "req"), ENTRIES)
async def test_finished_calls_are_answered_from_the_journal_and_the_rest_run_live(
    app: ScriptFile, journal: Journal, entry: str, req: Any
) -> None:
    whole = await run(app, entry, req, journal, resume=False)
    assert made(app) == [0, 1, 2, 3]
    crash_after(journal, 2)
    assert await run(app, entry, req, journal, resume=True) == whole
    assert made(app) == [2, 3]  # the first two were not run again
    assert [seq for seq, _, done in journal.calls("r") if done] == [0, 1, 2, 3]
    # Recovered again (its frontend died once more, at the end): nothing runs.
    assert await run(app, entry, req, journal, resume=True) == whole
    assert made(app) == []


@pytest.mark.parametrize(("entry", "req"), ENTRIES)
async def test_a_call_in_flight_is_sent_again_only_to_an_idempotent_stage(
    app: ScriptFile, journal: Journal, entry: str, req: Any
) -> None:
    whole = await run(app, entry, req, journal, resume=False)
    made(app)
    crash_after(journal, 2, in_flight=True)
    with pytest.raises(StageError) as caught:
        await run(app, entry, req, journal, resume=True)
    assert (caught.value.stage, caught.value.kind) == ("work", ErrorKind.INTERRUPTED)
    assert "call 3 to stage 'work' was in flight" in caught.value.message
    assert "idempotent" in caught.value.message
    assert made(app) == []  # not sent again

    app.bindings["work"].set_policy(Policy(idempotent=True))
    assert await run(app, entry, req, journal, resume=True) == whole
    assert made(app) == [2, 3]
    assert [seq for seq, _, _ in journal.calls("r")] == [0, 1, 2, 3]  # (under its number)


@pytest.mark.parametrize(("entry", "req"), ENTRIES)
async def test_a_changed_script_fails_its_recovery_naming_the_divergence(
    app: ScriptFile, journal: Journal, entry: str, req: Any
) -> None:
    await run(app, entry, req, journal, resume=False)
    made(app)
    crash_after(journal, 3)
    with pytest.raises(Divergence, match=r"call 1 \(stage 'work'\): the request differs at \$.tag"):
        await run(app, entry, {**req, "tag": "u"}, journal, resume=True)
    assert made(app) == []  # nothing old and new mixed: no call ran
    with pytest.raises(
        Divergence, match=r"did not make 1 call\(s\) the journal has; the first: call 3"
    ):
        await run(app, entry, {**req, "n": 2}, journal, resume=True)


async def test_a_run_whose_call_gets_a_value_no_encoder_takes_fails_that_call(
    journal: Journal,
) -> None:
    # A recorded request leaves such a value out of its record (tests/test_recording.py);
    # a run cannot: its journal must hold every call to recover it, so the call fails.
    handles = ScriptFile(Path(__file__).parent / "e2e" / "handles" / "handles.py", record=True)
    recorder = JournalRecorder(journal, "r", handles.path)
    with pytest.raises(TypeError, match="cannot send a value of type Handle over the wire"):
        async with handles.runtime() as rt, RequestScope("r", record=recorder):
            await rt.run(handles.entry("untyped"), {})
    assert journal.calls("r") == []  # (refused before it was journaled or made)


async def test_a_run_another_frontend_took_over_is_stopped_here_at_its_next_write(
    app: ScriptFile, journal: Journal
) -> None:
    # Frontend "a" runs "r" and "q" and stalls past their leases; "b" takes them over.
    now = time.time()
    for run_id in ("r", "q"):
        journal.create(
            RunRow(id=run_id, script="/s.py", entry="plain", status="running", request=b"{}",
                   created=now, owner="a", lease=now + 60)
        )  # fmt: skip
    lives = {}
    for run_id in ("r", "q"):
        recorder = JournalRecorder(journal, run_id, app.path)
        lives[run_id] = Live(journal, run_id, RequestScope(run_id), recorder, 1, "a")
    call = lives["r"].recorder.call("slow", False, {"n": 1})  # type: ignore[union-attr]
    await lives["r"].recorder.saved(call, done=False)  # type: ignore[union-attr]
    await lives["q"].write("item", b"1")
    journal._execute("UPDATE runs SET lease = 0")
    assert len(journal.claim("/s.py", "b", now + 60, limit=2)) == 2
    # The call a had in flight ends: its end is not journaled, and the run stops here
    # (its scope cancelled, no outcome to come), as a's next event does for "q".
    recorder = lives["r"].recorder
    assert recorder is not None
    recorder.result(call, "done")
    with pytest.raises(RunLost):
        await recorder.saved(call, done=True)
    with pytest.raises(RunLost):
        await lives["q"].write("item", b"2")
    for live in lives.values():
        assert live.stopping and live.scope.cancelling is Reason.DRAIN
    assert [(seq, done) for seq, _, done in journal.calls("r")] == [(0, False)]
    assert [seq for seq, _, _ in journal.events("q")] == [1]
