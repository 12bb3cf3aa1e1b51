"""Segment files: the records of ``bls serve --record DIR``, appended one after another
to a few large files rather than one file per request.

A segment is ``DIR/records-TIME-PID-N.blsseg`` (PID: the writing process's): the bytes
:data:`MAGIC`, then records, each ``<u32 name length><u32 record length><name><record>``
(little-endian; the name is the request's id, the record a
:class:`bls.recording.Record` in msgpack, as a ``.blsrec`` file holds it). A writer
(:class:`Segment`) appends each record whole or not at all: a write that fails (a full
disk, a file size limit) is cut back off the file. A segment grows to
:data:`SEGMENT_BYTES`, then the next one starts. A writer killed in the middle of a
record leaves it cut short at the end of its segment; a reader (:func:`records_in`)
stops there, having read every whole record before it.

``bls replay DIR --id ID`` (or a segment's path) finds a request's record by its id
(:func:`find`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from .recording import Record, RecordError, load

__all__ = ["MAGIC", "SEGMENT_BYTES", "SUFFIX", "Segment", "find", "records_in"]

MAGIC = b"BLSSEG1\n"
SUFFIX = ".blsseg"
SEGMENT_BYTES = 64 * 1024 * 1024  # a segment is closed once it holds this much
FRAME = struct.Struct("<II")  # name length, record length
_NAMED = 5  # a search that finds no record names the last ids it saw, this many


class Segment:
    """Appends records to segments in ``folder`` (see the module's docstring); opens
    the first when the first record comes. OSError from :meth:`append` when a record
    could not be written (the segment is as it was before it)."""

    def __init__(self, folder: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.folder = folder
        self.segment_bytes = segment_bytes
        self._fd: int | None = None
        self._size = 0
        self._count = 0

    def append(self, frame: bytes) -> None:
        """One record, framed (:data:`FRAME`, name, record), whole or not at all."""
        if self._fd is None:
            self._open()
        assert self._fd is not None
        try:
            _write_all(self._fd, frame)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(frame)
        if self._size >= self.segment_bytes:
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> None:
        self._count += 1
        stamp = time.strftime("%Y%m%dT%H%M%S")
        path = self.folder / f"records-{stamp}-{os.getpid()}-{self._count}{SUFFIX}"
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_APPEND, 0o644)
        try:
            _write_all(fd, MAGIC)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        self._fd, self._size = fd, len(MAGIC)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        done = os.write(fd, view)
        if not done:  # (a regular file takes something, or fails)
            raise OSError(errno.EIO, "the file took none of a write")
        view = view[done:]


def records_in(path: str | Path) -> Iterator[tuple[str, bytes]]:
    """The (request id, record bytes) of a segment, in the order they were written; a
    record cut short at its end (its writer was killed) is not one. RecordError for a
    file that is not a segment."""
    path = Path(path)
    with path.open("rb") as segment:
        if segment.read(len(MAGIC)) != MAGIC:
            raise RecordError(f"{path} is not a bls record segment")
        while True:
            head = segment.read(FRAME.size)
            if len(head) < FRAME.size:
                return
            name_len, data_len = FRAME.unpack(head)
            name = segment.read(name_len)
            data = segment.read(data_len)
            if len(name) < name_len or len(data) < data_len:
                return
            yield name.decode(errors="replace"), data


def find(path: str | Path, request_id: str | None) -> Record:
    """The record of ``request_id`` in a segment, or in any segment in a folder (the
    last one written, should an id come twice); the segment's only record when no id
    is given. RecordError saying what is there when it is not."""
    path = Path(path)
    segments = sorted(path.glob(f"*{SUFFIX}")) if path.is_dir() else [path]
    if not segments:
        raise RecordError(f"{path} holds no record segments (*{SUFFIX})")
    found: tuple[str, bytes] | None = None
    count = 0
    last: deque[str] = deque(maxlen=_NAMED)  # (named in the error when none is found)
    for segment in segments:
        for name, data in records_in(segment):
            count += 1
            last.append(name)
            if request_id is None or name == request_id:
                found = (name, data)
    if request_id is None and count != 1:
        raise RecordError(
            f"{path} holds {count} records: name the request with --id (its X-Request-Id)"
            + (f"; the last: {', '.join(last)}" if last else "")
        )
    if found is None:
        named = f", the last: {', '.join(last)}" if last else ""
        raise RecordError(
            f"{path} holds no record of request {request_id!r} ({count} others{named})"
        )
    name, data = found
    return load(data, f"the record of request {name!r} in {path}")
