"""The writer of ``bls serve --record DIR``: each request's :class:`bls.recording.Record`
appended to a segment file (:mod:`bls.segments`: ``DIR/records-*.blsseg``, named by
request id), written by a process of its own.

Writing costs CPU, and as little of it as can be is spent in the serving process or
holds its interpreter lock: the request's path only encodes the record into the waiting
batch and notes its name and where it ends; a task pipes what is queued to the writer
process (:func:`write_segments`) in batches, which frames each record as a segment frames
it and appends the batch. Recording never holds up or stops serving:

- at most ``backlog_bytes`` of records wait for the writer (a stalled or slow disk, a
  stopped writer); past that a record is dropped, logged and counted;
- a record that cannot be encoded (a value no encoder takes) is logged and counted as
  failed, the request's answer untouched;
- a writer process that dies (killed, out of memory) is logged and replaced; the records
  it was sent and had not written are counted as lost;
- leaving (after the server's drain) sends what is queued and waits for the writer to
  write it, for ``finish_s`` at most; then the writer is stopped and what it had not
  written is counted as lost;
- the writer appends each record whole or not at all (a short write is continued, a
  failed one cut back off its segment and logged: the first of a run of them, then every
  1,000th, then when records are written again), and reports how many it wrote, so the
  closing line counts records written, not sent.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import operator
import os
import struct
import sys
import tempfile
from pathlib import Path

import anyio
import anyio.abc
import msgspec

from .recording import Record, Recorder, dump_into
from .segments import FRAME, Segment

__all__ = ["BACKLOG_BYTES", "BATCH", "RecordWriter", "write_segments"]

log = logging.getLogger("bls")

BACKLOG_BYTES = 64 * 1024 * 1024  # records waiting for the writer, at most
_READ_BYTES = 1 << 20  # what the writer reads of its pipe at once, at most
# What the server sends its writer: batches, each this header (the index's bytes, the
# records' bytes), then the index (msgpack: a [name, end] for each record, its request's
# id and where it ends in the records), then the records (msgpack Records, one after
# another). The writer frames them (bls.segments.FRAME): none of that on a request's path.
BATCH = struct.Struct("<QQ")
_BATCH_BYTES = 4 * 1024 * 1024  # sent to the writer in one write, at most (one record more)
_GATHER_BYTES = _BATCH_BYTES // 4  # this much waiting goes without gathering more
_RESTART_S = 1.0  # between a writer's death and its replacement
# Records wait this long to go to the writer with those that follow: a pipe write and a
# wake-up a batch, not a record (and the writer writes a batch in one write too).
_GATHER_S = 0.005
_END = operator.itemgetter(1)  # of an index entry (name, end)
# Records dropped, or that could not be written, are logged at the first, then at every
# this many (a full disk under load fails thousands a second).
_NOTE_EVERY = 1000


class RecordWriter:
    """Writes records into ``folder`` (see the module's docstring).

    ``async with RecordWriter(folder, script) as records:`` then ``records.write(id,
    record)`` from the requests' task; leaving sends what is queued and waits (at most
    ``finish_s``) for it to be written. Making one checks that ``folder`` can be written
    (OSError saying why, before anything starts). Counts: :attr:`written` (files the
    writer reports written), :attr:`dropped` (never sent: the backlog was full),
    :attr:`lost` (sent to a writer that died or was stopped before writing them),
    :attr:`failed` (the writer could not write them: the disk is full, say; or they
    could not be encoded); of those sent, :attr:`incomplete` left out a value (one no
    encoder takes, or past the bytes a record keeps: :attr:`bls.recording.Record.unrecorded`;
    not replayed)."""

    def __init__(
        self,
        folder: str | Path,
        script: str | Path,
        *,
        backlog_bytes: int = BACKLOG_BYTES,
        finish_s: float = 60.0,
    ) -> None:
        self.script = Path(script)  # the script whose requests are recorded
        self._script = str(self.script)  # (as a str: a Path is hashed anew each request)
        self.folder = Path(folder)
        _check_writable(self.folder)
        self.backlog_bytes = backlog_bytes
        self.finish_s = finish_s
        self.dropped = 0
        self.lost = 0
        self.incomplete = 0  # records written that left out a value (Record.unrecorded)
        # Records waiting to be sent, one after another, and their index: each one's
        # name and where it ends in _pending; the bytes of the batch being sent (they
        # count towards the backlog until sent). (The backlog counts records' bytes;
        # a name is a request's id, at most 128 characters: bls.serve.intake.request_id.)
        self._pending = bytearray()
        self._index: list[tuple[str, int]] = []
        self._unencodable = 0  # records that could not be encoded (counted as failed)
        self._sending = 0
        self._wake = anyio.Event()
        self._idle = False  # the feeding task waits on _wake for a record
        self._closing = False
        self._done = anyio.Event()
        self._writers: list[_Writer] = []  # every writer process started, for the counts
        self._tg: anyio.abc.TaskGroup | None = None
        self._stack = contextlib.AsyncExitStack()

    def recorder(self) -> Recorder:
        """A new request's recorder, for this writer's script."""
        return Recorder(self._script)

    @property
    def written(self) -> int:
        return sum(w.written for w in self._writers)

    @property
    def failed(self) -> int:
        return sum(w.failed for w in self._writers) + self._unencodable

    def write(self, name: str, record: Record) -> None:
        """Queue ``record`` to be written under ``name``, its request's id (never waits;
        drops it when the backlog is full). (On every recorded request's path: kept to
        the least work. The record is encoded straight into the waiting batch; the
        writer process frames it.)"""
        pending = self._pending
        at = len(pending)
        try:
            dump_into(record, pending)
        except Exception as exc:  # (a value no encoder takes: never one bls notes itself)
            del pending[at:]
            self._unencodable += 1
            log.error("recording: the record of request %r cannot be encoded: %s", name, exc)
            return
        if self._closing or len(pending) + self._sending > self.backlog_bytes:
            del pending[at:]
            self._drop()
            return
        self._index.append((name, len(pending)))
        if record.unrecorded:
            self._incomplete(name, record)
        if self._idle:  # (the feeding task waits for a record: wake it, once)
            self._idle = False
            self._wake.set()

    def _incomplete(self, name: str, record: Record) -> None:
        """A record that left out a value (:attr:`bls.recording.Record.unrecorded`): said
        the first time (and every 1000th); the record is written, and not replayed."""
        self.incomplete += 1
        if self.incomplete == 1 or self.incomplete % 1000 == 0:
            log.warning(
                "recording: the record of request %s left out %s; a record that leaves out "
                "a value cannot be replayed (%d so far)",
                name,
                record.unrecorded[0],
                self.incomplete,
            )

    def _drop(self) -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % _NOTE_EVERY == 0:
            log.warning(
                "recording: the writer does not keep up (%d bytes waiting, at most %d); "
                "%d record(s) dropped",
                len(self._pending) + self._sending,
                self.backlog_bytes,
                self.dropped,
            )

    async def __aenter__(self) -> RecordWriter:
        self._tg = await self._stack.enter_async_context(anyio.create_task_group())
        self._tg.start_soon(self._run)
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Send what is queued, wait (shielded, at most ``finish_s``) for it to be
        written, then stop the writer."""
        assert self._tg is not None
        self._closing = True
        self._wake.set()
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.finish_s) as waited:
            await self._done.wait()
        if waited.cancelled_caught:
            log.warning("recording: the writer did not finish in %gs; stopping it", self.finish_s)
        self._tg.cancel_scope.cancel()
        await self._stack.aclose()
        self.lost += len(self._index)
        self._pending, self._index = bytearray(), []

    # -- the task that feeds the writer processes ------------------------------------------

    async def _run(self) -> None:
        """Start a writer, feed it until leaving; start another when one dies. Never
        raises: recording fails, serving goes on."""
        try:
            while True:
                try:
                    writer = await _Writer.start(self.folder)
                except OSError as exc:
                    log.error("recording: cannot start the writer process: %s", exc)
                else:
                    self._writers.append(writer)
                    if await self._feed(writer):
                        return
                await anyio.sleep(_RESTART_S)
        finally:
            self._done.set()

    async def _feed(self, writer: _Writer) -> bool:
        """Pipe what is queued to ``writer`` until leaving (True) or its death (False);
        what it was handed and did not write is counted as lost either way."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(writer.read_counts)
                finished = await self._pipe(writer)
                tg.cancel_scope.cancel()
        except anyio.get_cancelled_exc_class():  # leaving ran out of time
            await writer.stop(counts=False)
            self.lost += writer.unwritten
            raise
        finally:
            self._sending = 0  # (sent, or lost with the writer)
            with anyio.CancelScope(shield=True):
                await writer.process.aclose()
        if not finished:
            self.lost += writer.unwritten
        return finished

    async def _pipe(self, writer: _Writer) -> bool:
        """Send ``writer`` what is queued, as it is queued, until leaving: True once it
        has written all of it and exited; False if it died first (logged)."""
        try:
            while True:
                if not self._pending:
                    if self._closing:
                        break
                    self._wake = anyio.Event()
                    self._idle = True
                    await self._wake.wait()
                    continue
                if not self._closing and len(self._pending) < _GATHER_BYTES:
                    await anyio.sleep(_GATHER_S)
                batch, index = self._batch()
                self._sending = len(batch)
                writer.handed += len(index)
                await writer.send(batch, index)
                self._sending = 0
            await writer.finish()
            return True
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            code = await writer.stop()
            log.error(
                "recording: the writer process died (%s) with %d record(s) not written; "
                "starting another",
                _exit_text(code),
                writer.unwritten,
            )
            return False

    def _batch(self) -> tuple[bytearray, list[tuple[str, int]]]:
        """What is waiting, for one write, and its index: all of it, or (after a stall
        let more gather) the first whole records up to the batch's size (one at least),
        so that a write, and what the writer holds, stays within it."""
        pending, index = self._pending, self._index
        if len(pending) <= _BATCH_BYTES:
            self._pending, self._index = bytearray(), []
            return pending, index
        taken = max(1, bisect.bisect_right(index, _BATCH_BYTES, key=_END))
        cut = index[taken - 1][1]
        batch = pending[:cut]
        del pending[:cut]
        self._index = [(name, end - cut) for name, end in index[taken:]]
        return batch, index[:taken]


class _Writer:
    """One writer process: its input (records), and the counts it reports on its output
    (``WRITTEN FAILED`` after each batch)."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self.handed = 0  # records sent to it (the batch being sent included)
        self.written = 0
        self.failed = 0
        self.eof = anyio.Event()  # its output ended: the counts are final

    @property
    def unwritten(self) -> int:
        """Records it was handed and has not reported written or failed."""
        return max(0, self.handed - self.written - self.failed)

    @classmethod
    async def start(cls, folder: Path) -> _Writer:
        code = "import sys; from bls.record_writer import write_segments as w; w(sys.argv[1])"
        argv = [sys.executable, "-c", code, str(folder)]
        # Its own session: a Ctrl-C at the terminal stops the server, which then closes
        # the writer's input; the writer finishes what it was sent.
        process = await anyio.open_process(argv, stderr=None, start_new_session=True)
        return cls(process)

    async def send(self, batch: bytearray, index: list[tuple[str, int]]) -> None:
        """The records in ``batch`` (``index``: each one's name and end), as one
        :data:`BATCH`."""
        assert self.process.stdin is not None
        head = _index_bytes(index)
        await self.process.stdin.send(b"".join((BATCH.pack(len(head), len(batch)), head, batch)))

    async def finish(self) -> None:
        """Close its input; wait for it to write what it was sent, exit and report."""
        assert self.process.stdin is not None
        await self.process.stdin.aclose()
        await self.process.wait()
        await self.eof.wait()

    async def stop(self, *, counts: bool = True) -> int | None:
        """Kill it (it died, or did not finish in time); its exit status. ``counts``:
        wait (briefly) for the last counts it reported."""
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        with anyio.CancelScope(shield=True):
            code = await self.process.wait()
            if counts:
                with anyio.move_on_after(1):
                    await self.eof.wait()
        return code

    async def read_counts(self) -> None:
        """Keep the latest counts it reports (each line replaces the last) until its
        output ends."""
        assert self.process.stdout is not None
        tail = b""
        try:
            async for chunk in self.process.stdout:
                tail = self._take(tail + chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            self.eof.set()

    def _take(self, data: bytes) -> bytes:
        lines = data.split(b"\n")
        for line in reversed(lines[:-1]):
            fields = line.split()
            if len(fields) == 2 and all(f.isdigit() for f in fields):
                self.written, self.failed = int(fields[0]), int(fields[1])
                break
        return lines[-1][-64:]  # an unfinished line; a runaway one cannot grow


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"signal {-code}"
    return f"exit status {code}"


def _check_writable(folder: Path) -> None:
    """``folder`` exists (made if need be) and a file can be created in it; OSError
    naming it and why not."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".bls-probe-"):
            pass
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise OSError(f"--record {folder}: cannot write records there: {why}") from None


def _index_bytes(index: list[tuple[str, int]]) -> bytes:
    """A batch's index, in msgpack; a name that is not text (a lone surrogate: not an id
    the frontend makes) with what cannot be encoded replaced."""
    try:
        return msgspec.msgpack.encode(index)
    except UnicodeEncodeError:
        return msgspec.msgpack.encode(
            [(name.encode(errors="replace").decode(), end) for name, end in index]
        )


def _frames(index: bytes, records: bytes) -> list[tuple[str, bytes]]:
    """A batch's records, each framed as a segment frames it, with its name."""
    frames = []
    start = 0
    for name, end in msgspec.msgpack.decode(index, type=list[tuple[str, int]]):
        key = name.encode()
        frames.append(
            (name, b"".join((FRAME.pack(len(key), end - start), key, records[start:end])))
        )
        start = end
    return frames


def write_segments(folder: str | Path) -> int:
    """The writer process: each batch of records on stdin (:data:`BATCH`) framed and
    appended to a segment in ``folder``, until stdin ends; after each batch, ``WRITTEN
    FAILED`` on stdout. Returns how many it wrote. A batch is appended in one write; when
    that fails, its records are appended one by one, so that one the disk cannot hold
    fails alone."""
    segment = Segment(Path(folder))
    source = sys.stdin.fileno()
    counts = sys.stdout.buffer
    written = failed = 0
    failing = 0  # records not written since the last one that was
    try:
        while True:
            head = _read_exactly(source, BATCH.size)
            if head is None:
                return written
            index_size, size = BATCH.unpack(head)
            index, data = _read_exactly(source, index_size), _read_exactly(source, size)
            if index is None or data is None:
                return written  # (a batch cut short by the server stopping is dropped)
            frames = _frames(index, data)
            try:
                segment.append(b"".join(frame for _, frame in frames))
                written += len(frames)
                failing = _written_again(failing)
            except OSError:
                for name, frame in frames:
                    try:
                        segment.append(frame)
                        written += 1
                        failing = _written_again(failing)
                    except OSError as exc:
                        failed += 1
                        failing += 1
                        _not_written(name, exc, failing)
            try:
                counts.write(b"%d %d\n" % (written, failed))
                counts.flush()
            except OSError:
                pass  # the server stopped reading: it counts what it can
    finally:
        segment.close()


def _not_written(name: str, exc: OSError, failing: int) -> None:
    """Says that a record could not be written: the first of a run of such records, then
    every :data:`_NOTE_EVERY` (a full disk under load fails thousands a second)."""
    if failing == 1:
        print(f"bls: recording: cannot write {name}'s record: {exc}", file=sys.stderr)
    elif failing % _NOTE_EVERY == 0:
        print(f"bls: recording: {failing} record(s) not written so far: {exc}", file=sys.stderr)


def _written_again(failing: int) -> int:
    """After a record is written: says so if some before were not. The new count: 0."""
    if failing:
        print(
            f"bls: recording: records are written again; {failing} record(s) were not",
            file=sys.stderr,
        )
    return 0


def _read_exactly(fd: int, size: int) -> bytes | None:
    """``size`` bytes of ``fd``; None when it ends first."""
    parts = []
    while size:
        data = os.read(fd, min(size, _READ_BYTES))
        if not data:
            return None
        parts.append(data)
        size -= len(data)
    return b"".join(parts)
