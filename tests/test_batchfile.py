"""bls.batchfile's progress file: what a stopped batch left is read back, a torn last line
dropped, and the output written in input order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bls.batchfile import BatchError, Progress, read_lines, survey


def test_a_torn_last_line_is_dropped_and_the_rest_is_kept(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"a": 1}\n\n{"a": 2}\n{"a": 3}')  # a blank line; no last newline
    ident, requests = survey(source)
    assert requests == 3
    assert [n for n, _ in read_lines(source)] == [1, 3, 4]
    out = tmp_path / "out.jsonl"
    progress = Progress(out, ident)
    progress.add(3, {"result": 2})
    progress.add(1, {"error": {"type": "x"}})
    progress.close()
    with progress.path.open("ab") as f:
        f.write(b'{"line": 4, "resu')  # cut by kill -9 mid-write

    again = Progress(out, ident)
    assert sorted(again.done) == [1, 3] and again.errors == 1
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
    ident, _ = survey(source)
    Progress(tmp_path / "out.jsonl", ident).close()
    source.write_text('{"a": 2}\n')  # the same file, changed
    changed, _ = survey(source)
    with pytest.raises(BatchError, match="is the progress of another input"):
        Progress(tmp_path / "out.jsonl", changed)


def test_an_empty_progress_file_is_a_batch_that_had_not_begun(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"a": 1}\n')
    ident, _ = survey(source)
    (tmp_path / "out.jsonl.progress").touch()  # stopped before its first line was written
    progress = Progress(tmp_path / "out.jsonl", ident)
    assert progress.done == {}
    progress.add(1, {"result": 1})
    progress.finish()
    assert json.loads((tmp_path / "out.jsonl").read_text()) == {"line": 1, "result": 1}
