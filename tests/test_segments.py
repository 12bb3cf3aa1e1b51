"""Segment files (bls.segments): records appended whole, segments rotated, a record cut
short at the end skipped, a request's record found by its id; records that gathered
while the writer was held up sent to it in bounded batches (bls.record_writer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bls import record_writer
from bls.record_writer import RecordWriter
from bls.recording import Record, RecordError, dump
from bls.segments import FRAME, MAGIC, Segment, find, records_in


def frame(name: str, record: Record) -> bytes:
    data = dump(record)
    return FRAME.pack(len(name), len(data)) + name.encode() + data


def record(entry: str) -> Record:
    return Record(bls="0", script="s.py", entry=entry, started=0.0)


def names_in(folder: Path) -> list[str]:
    """The request ids of the records in ``folder``'s segments, in the order written."""
    return [name for f in sorted(folder.glob("*.blsseg")) for name, _ in records_in(f)]


def test_records_are_appended_to_segments_that_rotate_and_found_by_id(tmp_path: Path) -> None:
    segment = Segment(tmp_path, segment_bytes=200)
    for n in range(6):
        segment.append(frame(f"r{n}", record(f"e{n}")))
    segment.append(frame("r1", record("again")))  # an id given twice: the last one
    segment.close()
    files = sorted(tmp_path.glob("*.blsseg"))
    assert len(files) > 1 and all(f.read_bytes().startswith(MAGIC) for f in files)
    assert names_in(tmp_path) == ["r0", "r1", "r2", "r3", "r4", "r5", "r1"]
    assert find(tmp_path, "r3").entry == "e3"
    assert find(tmp_path, "r1").entry == "again"
    last = "the last: r2, r3, r4, r5, r1"  # (what ids to give --id)
    with pytest.raises(RecordError, match=f"holds no record of request 'x' \\(7 others, {last}\\)"):
        find(tmp_path, "x")
    with pytest.raises(
        RecordError, match=f"holds 7 records: name the request with --id .*; {last}$"
    ):
        find(tmp_path, None)


def test_a_record_cut_short_at_the_end_is_not_read(tmp_path: Path) -> None:
    segment = Segment(tmp_path)
    segment.append(frame("whole", record("e")))
    segment.close()
    path = next(tmp_path.glob("*.blsseg"))
    whole = path.read_bytes()
    path.write_bytes(whole + frame("cut", record("e"))[:-5])  # (its writer was killed)
    assert [name for name, _ in records_in(path)] == ["whole"]
    assert find(path, None).entry == "e"  # the segment's only record


def test_what_is_not_a_segment_says_so(tmp_path: Path) -> None:
    other = tmp_path / "x.blsseg"
    other.write_bytes(b"not a segment")
    with pytest.raises(RecordError, match="is not a bls record segment"):
        find(other, "r")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RecordError, match="holds no record segments"):
        find(empty, "r")


@pytest.mark.anyio
async def test_records_gathered_past_a_batch_go_in_bounded_batches_all_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[int, int]] = []  # (bytes, records) of each batch the writer got
    send = record_writer._Writer.send

    async def counted(
        self: record_writer._Writer, batch: bytearray, index: list[tuple[str, int]]
    ) -> None:
        sent.append((len(batch), len(index)))
        await send(self, batch, index)

    monkeypatch.setattr(record_writer._Writer, "send", counted)
    writer = RecordWriter(tmp_path, "s.py")
    for n in range(100):  # about 10 MB waiting before the writer starts: a stall's worth
        big = record(f"e{n}")
        big.request = bytes(100_000)
        writer.write(f"r{n}", big)
    async with writer:
        pass
    assert writer.written == 100 and writer.lost == writer.dropped == 0
    assert len(sent) >= 3 and sum(count for _, count in sent) == 100
    assert all(size <= record_writer._BATCH_BYTES for size, _ in sent)
    assert names_in(tmp_path) == [f"r{n}" for n in range(100)]


@pytest.mark.anyio
async def test_a_record_is_found_by_the_id_its_client_gave_as_given(tmp_path: Path) -> None:
    # Any printable X-Request-Id is kept as it is (a segment's names are not file names):
    # `bls replay DIR --id ID` finds it by what the client sent and the answer echoed.
    ids = ["order:42/a b", "r-1.x_2", "ünïcode", "x" * 128]
    async with RecordWriter(tmp_path, "s.py") as writer:
        for rid in ids:
            writer.write(rid, record(f"e-{rid}"))
    assert writer.written == len(ids) and writer.lost == writer.dropped == 0
    assert names_in(tmp_path) == ids
    assert [find(tmp_path, rid).entry for rid in ids] == [f"e-{rid}" for rid in ids]
    # A name that is not text (no id the frontend makes) is written, what cannot be
    # encoded replaced, with the batch it came in.
    async with RecordWriter(tmp_path / "odd", "s.py") as writer:
        writer.write("a\udc80b", record("odd"))
        writer.write("fine", record("fine"))
    assert writer.written == 2 and names_in(tmp_path / "odd") == ["a?b", "fine"]


@pytest.mark.anyio
async def test_a_record_that_cannot_be_encoded_is_counted_failed_and_the_rest_written(
    tmp_path: Path,
) -> None:
    async with RecordWriter(tmp_path, "s.py") as writer:
        writer.write("bad", record("a\udc80b"))  # (a lone surrogate: no UTF-8 encoder takes it)
        writer.write("fine", record("fine"))
    assert writer.written == 1 and writer.failed == 1 and writer.lost == writer.dropped == 0
    assert names_in(tmp_path) == ["fine"]
