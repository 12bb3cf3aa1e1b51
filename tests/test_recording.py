"""Recording a request's stage calls and replaying them: the record format, the
divergences a changed script replays to, and the files that cannot be read."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest

import bls
from bls import recording
from bls.recording import FORMAT, Record, Recorder, RecordError, dump, load
from bls.replay import Divergence, replay
from bls.scope import RequestScope
from bls.scriptfile import ScriptFile

pytestmark = pytest.mark.anyio

PIPELINES = Path(__file__).parent / "e2e" / "pipelines"
DOC = {"words": ["tree", "sky", "river"], "rounds": 3, "patience": 0.2}


async def record(script: Path, entry: str, req: Any) -> tuple[Record, list[Any]]:
    """Run ``entry`` of ``script`` with its bls.toml's stages, recording it."""
    app = ScriptFile(script, record=True)
    script_entry = app.entry(entry)
    recorder = Recorder(app.path)
    answers: list[Any] = []
    async with app.runtime() as rt, RequestScope("test", record=recorder):
        if script_entry.streaming:
            async with rt.run_stream(script_entry, req) as items:
                answers = [item async for item in items]
        else:
            answers = [await rt.run(script_entry, req)]
    return load(dump(recorder.finish())), answers


def script_copy(tmp_path: Path, edit: tuple[str, str] | None = None) -> ScriptFile:
    """review.py (and its stages) in ``tmp_path``, with one text replaced."""
    tmp_path.mkdir(exist_ok=True)
    for name in ("review.py", "review_stages.py", "bls.toml"):
        shutil.copy(PIPELINES / name, tmp_path / name)
    if edit is not None:
        path = tmp_path / "review.py"
        text = path.read_text()
        assert edit[0] in text
        path.write_text(text.replace(*edit))
    return ScriptFile(tmp_path / "review.py", configured=False)


async def test_a_record_holds_every_call_and_replays_to_the_same_answer() -> None:
    rec, answers = await record(PIPELINES / "review.py", "review", DOC)

    assert (rec.format, rec.script, rec.entry) == (FORMAT, "review.py", "review")
    assert rec.path == str((PIPELINES / "review.py").resolve())
    stages = [c.stage for c in rec.calls]
    assert stages.count("score") == 3 + 2 * 2  # the map, then two rounds of two
    assert {"fast_echo", "slow_echo"} <= set(stages)
    # The race's loser, then the call the patience ran out on: both ended by a cancel.
    slow = [c for c in rec.calls if c.stage == "slow_echo"]
    assert [c.error.kind if c.error else None for c in slow] == ["cancelled", "cancelled"]
    assert all(c.end >= c.start >= 0 for c in rec.calls)

    app = ScriptFile(PIPELINES / "review.py", configured=False)
    again = await replay(rec, app.entry("review"), app.declared)
    assert msgspec.to_builtins(again) == msgspec.to_builtins(answers)
    assert again[0].timed_out is True  # the patience ran out again, as recorded


async def test_a_streaming_entry_replays_its_items() -> None:
    rec, answers = await record(PIPELINES / "review.py", "spell", {"words": ["ab", "c"]})
    assert answers == ["a", "b", "c"] and [c.streaming for c in rec.calls] == [True, True]
    app = ScriptFile(PIPELINES / "review.py", configured=False)
    assert await replay(rec, app.entry("spell"), app.declared) == ["a", "b", "c"]


async def test_a_changed_request_is_named_by_call_stage_and_field(tmp_path: Path) -> None:
    rec, _ = await record(PIPELINES / "review.py", "review", DOC)
    app = script_copy(tmp_path, ('stage("fast_echo", best)', 'stage("fast_echo", best + "!")'))

    with pytest.raises(Divergence) as caught:
        await replay(rec, app.entry("review"), app.declared)
    n = 1 + next(i for i, c in enumerate(rec.calls) if c.stage == "fast_echo")
    assert str(caught.value) == (
        f"call {n} (stage 'fast_echo'): the request differs at $: the record has 'river', "
        "the script gave 'river!'"
    )


async def test_an_extra_call_and_a_missing_call_are_named(tmp_path: Path) -> None:
    rec, _ = await record(PIPELINES / "review.py", "review", DOC)

    two_rounds = "if a == b and rounds >= 2:"
    more = script_copy(tmp_path / "more", (two_rounds, "if a == b and rounds >= 3:"))
    with pytest.raises(Divergence, match=r"calls stage 'score' a 8th time; the record has 7"):
        await replay(rec, more.entry("review"), more.declared)

    fewer = script_copy(tmp_path / "fewer", (two_rounds, "if a == b:"))
    with pytest.raises(Divergence, match=r"has 2 call\(s\) the script did not make; the first"):
        await replay(rec, fewer.entry("review"), fewer.declared)


async def test_a_changed_answer_is_named_by_field(tmp_path: Path) -> None:
    rec, _ = await record(PIPELINES / "review.py", "review", DOC)
    app = script_copy(tmp_path, ("best=best,", "best=best.upper(),"))
    with pytest.raises(Divergence) as caught:
        await replay(rec, app.entry("review"), app.declared)
    assert "the result differs at $.best: the record has 'river', the script gave 'RIVER'" in str(
        caught.value
    )


GUARDED = """
import bls
from bls import stage


@bls.script
async def guarded(req: str) -> str:
    try:
        return await stage("primary", req)
    except bls.StageError as exc:
        return await stage("backup", f"{req} after {exc.kind}")


async def primary(req: str) -> str:
    if req.startswith("fail"):
        raise RuntimeError("primary is down")
    return req


async def backup(req: str) -> str:
    if req.startswith("fail twice"):
        raise KeyError(req)
    return req.upper()
"""


def guarded(tmp_path: Path) -> Path:
    (tmp_path / "guarded.py").write_text(GUARDED)
    (tmp_path / "bls.toml").write_text(
        '[stages.primary]\ninline = "guarded.py:primary"\n'
        '[stages.backup]\ninline = "guarded.py:backup"\n'
    )
    return tmp_path / "guarded.py"


async def test_a_recorded_stage_error_takes_the_same_path_again(tmp_path: Path) -> None:
    script = guarded(tmp_path)
    rec, answers = await record(script, "guarded", "fail")
    assert answers == ["FAIL AFTER RUNTIMEERROR"]
    failed = rec.calls[0].error
    assert failed is not None and (failed.stage, failed.kind) == ("primary", "RuntimeError")

    app = ScriptFile(script, configured=False)
    assert await replay(rec, app.entry("guarded"), app.declared) == answers


async def failed_twice(script: Path) -> tuple[Record, ScriptFile]:
    """The record of a guarded request whose primary and backup both failed."""
    app = ScriptFile(script, record=True)
    recorder = Recorder(script)
    with pytest.raises(bls.StageError):
        async with app.runtime() as rt, RequestScope("test", record=recorder):
            await rt.run(app.entry("guarded"), "fail twice")
    return load(dump(recorder.finish())), app


async def test_a_request_that_failed_replays_to_the_same_error(tmp_path: Path) -> None:
    rec, app = await failed_twice(guarded(tmp_path))
    assert rec.error is not None and (rec.error.stage, rec.error.kind) == ("backup", "KeyError")

    # It fails the same way again: a faithful replay, no divergence.
    assert await replay(rec, app.entry("guarded"), app.declared) == []


async def test_errors_naming_a_file_that_is_not_utf8_are_recorded_escaped() -> None:
    # Python holds such a name with a lone surrogate, which no UTF-8 encoder takes: the
    # record keeps the message with it escaped, from a stage and from the script.
    name = os.fsdecode(b"photo-\xe9.jpg")
    recorder = Recorder("s.py")
    recorder.entry("tag", {"text": "x"})
    call = recorder.call("reader", False, {"path": "p"})
    recorder.ended(call, bls.StageError("reader", "OSError", f"cannot read {name}"))
    recorder.entry_failed(RuntimeError(f"cannot read {name}"))
    rec = load(dump(recorder.finish()))
    assert rec.calls[0].error is not None and rec.error is not None
    assert rec.calls[0].error.message == rec.error.message == "cannot read photo-\\udce9.jpg"
    assert (rec.calls[0].error.kind, rec.error.kind) == ("OSError", "RuntimeError")


async def test_a_replay_that_answers_where_the_record_failed_diverges(tmp_path: Path) -> None:
    rec, app = await failed_twice(guarded(tmp_path))
    rec.calls[1].error = None  # as if the backup had answered
    rec.calls[1].items = [rec.calls[0].request]
    with pytest.raises(Divergence, match=r"the record ends with KeyError from stage 'backup'"):
        await replay(rec, app.entry("guarded"), app.declared)


def test_a_truncated_file_says_so() -> None:
    rec = Record(bls="1", script="x.py", entry="x", started=0.0, request=b"\xa1x")
    data = dump(rec)
    with pytest.raises(RecordError, match=r"the record is truncated \(\d+ bytes\)"):
        load(data[:-3])
    with pytest.raises(RecordError, match="is not a bls record"):
        load(msgspec.msgpack.encode({"hello": 1}))
    with pytest.raises(RecordError, match="is not a bls record"):
        load(b"{}\n")


def test_a_record_of_another_format_names_both() -> None:
    rec = msgspec.to_builtins(
        Record(bls="9.0", script="x.py", entry="x", started=0.0), builtin_types=(bytes,)
    )
    rec["format"] = FORMAT + 1
    rec["calls"] = [{"new": "layout"}]
    with pytest.raises(RecordError) as caught:
        load(msgspec.msgpack.encode(rec), "r.blsrec")
    assert str(caught.value) == (
        f"r.blsrec is in record format {FORMAT + 1}; this bls ({bls.__version__}) reads {FORMAT}"
    )


HANDLES = Path(__file__).parent / "e2e" / "handles" / "handles.py"


@pytest.mark.parametrize(
    ("entry", "answer", "left_out"),
    [
        ("untyped", {"kind": "Handle", "back": "Handle"}, ["its request", "its result"]),
        ("typed", {"kind": "Handle"}, ["its request"]),
    ],
)
async def test_a_value_no_encoder_takes_is_left_out_of_the_record_not_the_request(
    entry: str, answer: dict[str, str], left_out: list[str]
) -> None:
    # Recording never changes what a request does: the request answers as it does
    # unrecorded, and its record names what it left out, and is not replayed.
    app = ScriptFile(HANDLES)
    async with app.runtime() as rt:
        assert await rt.run(app.entry(entry), {}) == answer
    rec, answers = await record(HANDLES, entry, {})
    assert answers == [answer]
    stage = "take" if entry == "untyped" else "take_typed"
    wire = "TypeError: cannot send a value of type Handle over the wire"
    assert rec.unrecorded == [f"call 1 (stage {stage!r}): {what}: {wire}" for what in left_out]
    assert rec.calls[0].request == b"\xc0"  # (nil in its place)
    with pytest.raises(RecordError, match=r"cannot be replayed: it left out call 1 \(stage "):
        await replay(rec, ScriptFile(HANDLES, configured=False).entry(entry))


@pytest.mark.parametrize(("entry", "stage"), [("flood", "chunks"), ("flood_typed", "chunks_typed")])
async def test_a_request_streaming_more_than_a_record_keeps_is_recorded_up_to_its_bound(
    entry: str, stage: str
) -> None:
    # 80 MiB through a stage and out again: the request streams all of it as it does
    # unrecorded; its record keeps values up to RECORD_BYTES, names where it stopped
    # (once), and is not replayed.
    app = ScriptFile(HANDLES)
    async with app.runtime() as rt, rt.run_stream(app.entry(entry), {"n": 80}) as items:
        unrecorded = [len(item) async for item in items]
    rec, answers = await record(HANDLES, entry, {"n": 80})
    assert [len(item) for item in answers] == unrecorded == [1 << 20] * 80
    assert len(dump(rec)) <= recording.RECORD_BYTES + 64 * 1024
    kept = len(rec.items) + len(rec.calls[0].items)
    assert 60 <= kept < 64 and rec.calls[0].stage == stage
    assert len(rec.unrecorded) == 1
    assert rec.unrecorded[0].endswith("past the 64 MiB a record keeps, it and what came after")
    with pytest.raises(RecordError, match="cannot be replayed: it left out "):
        await replay(rec, ScriptFile(HANDLES, configured=False).entry(entry))


async def test_a_record_names_at_most_8_values_it_left_out() -> None:
    # A stream of values no encoder takes: each left out, the first 8 named, no more.
    recorder = Recorder("s.py")
    recorder.entry("e", {})
    call = recorder.call("objects", True, {})
    for _ in range(1000):
        recorder.item(call, object())
    rec = load(dump(recorder.finish()))
    assert rec.calls[0].items == [b"\xc0"] * 1000
    assert rec.unrecorded == [
        f"call 1 (stage 'objects'): its item {n}: TypeError: cannot send a value of type "
        "object over the wire"
        for n in range(1, 9)
    ]
