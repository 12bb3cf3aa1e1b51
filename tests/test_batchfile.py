"""bls.batchfile's progress file: what a stopped batch left is read back, a torn last line
dropped, and the output written in input order."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from bls.batchfile import Answered, BatchError, Progress, read_lines, survey


def test_a_torn_last_line_is_dropped_and_the_rest_is_kept(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"a": 1}\n\n{"a": 2}\n{"a": 3}')  # a blank line; no last newline
    ident, requests, lines = survey(source)
    assert (requests, lines) == (3, 4)
    assert [n for n, _ in read_lines(source)] == [1, 3, 4]
    out = tmp_path / "out.jsonl"
    progress = Progress(out, ident, lines)
    progress.add(3, {"result": 2})
    progress.add(1, {"error": {"type": "x"}})
    progress.close()
    with progress.path.open("ab") as f:
        f.write(b'{"line": 4, "resu')  # cut by kill -9 mid-write

    again = Progress(out, ident, lines)
    assert list(again.done) == [1, 3] and len(again.done) == 2 and again.errors == 1
    again.add(4, {"result": 3})
    again.finish()
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"line": 1, "error": {"type": "x"}},
        {"line": 3, "result": 2},
        {"line": 4, "result": 3},
    ]
    assert not again.path.exists()


def test_another_inputs_progress_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"a": 1}\n')
    ident, _, lines = survey(source)
    Progress(tmp_path / "out.jsonl", ident, lines).close()
    source.write_text('{"a": 2}\n')  # the same file, changed
    changed, _, lines = survey(source)
    with pytest.raises(BatchError, match="is the progress of another input"):
        Progress(tmp_path / "out.jsonl", changed, lines)


def test_an_empty_progress_file_is_a_batch_that_had_not_begun(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"a": 1}\n')
    ident, _, lines = survey(source)
    (tmp_path / "out.jsonl.progress").touch()  # stopped before its first line was written
    progress = Progress(tmp_path / "out.jsonl", ident, lines)
    assert len(progress.done) == 0 and 1 not in progress.done
    progress.add(1, {"result": 1})
    progress.finish()
    assert json.loads((tmp_path / "out.jsonl").read_text()) == {"line": 1, "result": 1}


def test_a_line_number_the_input_has_not_is_read_as_the_end_of_what_was_done(
    tmp_path: Path,
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"a": 1}\n{"a": 2}\n{"a": 3}\n')
    ident, _, lines = survey(source)
    progress = Progress(tmp_path / "out.jsonl", ident, lines)
    progress.add(2, {"result": 2})
    progress.close()
    with progress.path.open("ab") as f:  # an edited (or another) file: never allocated for
        f.write(b'{"line": 1000000000000, "result": 0}\n{"line": 3, "result": 3}\n')
    again = Progress(tmp_path / "out.jsonl", ident, lines)
    assert list(again.done) == [2]  # line 3 after it is run again
    with pytest.raises(IndexError, match="no line 4"):
        again.done.add(4, 0, 1)
    again.close()


def test_what_a_batch_keeps_of_its_answers_is_about_16_bytes_a_line() -> None:
    lines = 200_000
    tracemalloc.start()
    try:
        answered = Answered(lines)
        for n in range(lines, 0, -1):  # (in any order: lines finish out of turn)
            answered.add(n, n * 40, 40)
        used = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(answered) == lines and answered.place(7) == (280, 40)
    # (an array grows by a sixteenth more than asked; a dict of tuples took 160 a line)
    assert used < 18 * (lines + 1)
