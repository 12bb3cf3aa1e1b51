"""Recording a request: its entry's request and answer, and every stage call it made —
the request each stage got, each item or the result it gave, its error, and when.

``bls run --record FILE`` and ``bls serve --record DIR`` keep one :class:`Record` per
request (in DIR, one file per request, named by its id); ``bls replay`` and
:func:`bls.testing.replay` run the script again with every stage answered from it
(:mod:`bls.replay`). The file is msgspec-msgpack of :class:`Record` (its ``format`` says
which layout; values are :mod:`bls.codec` payloads, arrays and tensors inline), so any
msgpack reader can look inside. Recording is a binding in front of each stage
(:class:`RecordingBinding`) that writes into the request's :class:`Recorder`, which the
request's :class:`bls.scope.CallContext` carries; nothing is recorded outside a request
that keeps one.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import struct
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec

from .bindings import Binding, Wrapper
from .codec import Codec
from .errors import DeadlineExceeded, InvalidRequest, StageError
from .scope import NO_CONTEXT, CallContext

__all__ = [
    "FORMAT",
    "Record",
    "RecordError",
    "RecordWriter",
    "RecordedCall",
    "RecordedError",
    "Recorder",
    "RecordingBinding",
    "dump",
    "load",
    "write_files",
]

log = logging.getLogger("bls")


def _version() -> str:
    try:
        return version("bls-pipelines")
    except PackageNotFoundError:  # running from a source tree
        return "0.0.0"


__version__ = _version()

FORMAT = 1  # the layout of Record; a reader refuses another, naming both


class RecordedError(msgspec.Struct, kw_only=True):
    """How a call (or the entry) failed: a :class:`bls.StageError`'s fields, or
    ``kind="cancelled"``/``"deadline"`` for a call its request's scope ended."""

    stage: str
    kind: str
    message: str
    path: str | None = None  # an InvalidRequest's field


class RecordedCall(msgspec.Struct, kw_only=True):
    """One stage call, as the script made it and as the stage answered."""

    stage: str
    streaming: bool
    request: bytes  # the request the script passed (a bls.codec payload)
    items: list[bytes] = []  # a unary call's result (one), or a stream's items
    error: RecordedError | None = None
    start: float  # seconds after the request began
    end: float = 0.0


class Record(msgspec.Struct, kw_only=True):
    """One request: what came in, what went out, and the stage calls in between (in the
    order they started)."""

    format: int = FORMAT
    bls: str  # the version that wrote it
    script: str  # the script's file name
    path: str = ""  # the script's absolute path where it was recorded
    entry: str
    request: bytes = b""
    items: list[bytes] = []  # a unary entry's result (one), or a streaming entry's items
    error: RecordedError | None = None
    calls: list[RecordedCall] = []
    started: float  # epoch seconds
    duration: float = 0.0


class RecordError(ValueError):
    """A record file that cannot be read, saying why (truncated, not a record, another
    format)."""


_codec = Codec(inline_max=float("inf"))  # a file holds its arrays inline
_record_encoder = msgspec.msgpack.Encoder()
_record_decoder = msgspec.msgpack.Decoder(Record)


def encode_value(value: Any) -> bytes:
    return bytes(_codec.encode(value)[0])


def decode_value(data: bytes, codec: Codec = _codec) -> Any:
    return codec.decode(data)


def _error(stage: str, exc: BaseException) -> RecordedError:
    if isinstance(exc, DeadlineExceeded):
        return RecordedError(stage=stage, kind="deadline", message=str(exc))
    if isinstance(exc, StageError):
        path = exc.path if isinstance(exc, InvalidRequest) else None
        return RecordedError(stage=exc.stage, kind=exc.kind, message=exc.message, path=path)
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        return RecordedError(stage=stage, kind="cancelled", message="cancelled")
    return RecordedError(stage=stage, kind=type(exc).__name__, message=str(exc))


class Recorder:
    """The record of one request, filled in as it runs."""

    __slots__ = ("_t0", "record")

    def __init__(self, script: str | Path) -> None:
        name, path = _where(script)
        self.record = Record(bls=__version__, script=name, path=path, entry="", started=time.time())
        self._t0 = time.monotonic()

    def _now(self) -> float:
        return time.monotonic() - self._t0

    # the entry

    def entry(self, name: str, req: Any) -> None:
        """The request begins: times are counted from here."""
        self._t0 = time.monotonic()
        self.record.entry = name
        self.record.request = encode_value(req)

    def answer(self, value: Any) -> None:
        """The entry's result, or one item of a streaming entry."""
        self.record.items.append(encode_value(value))

    def entry_failed(self, exc: BaseException) -> None:
        self.record.error = _error(self.record.entry, exc)

    # its stage calls

    def call(self, stage: str, streaming: bool, req: Any) -> RecordedCall:
        call = RecordedCall(
            stage=stage, streaming=streaming, request=encode_value(req), start=self._now()
        )
        self.record.calls.append(call)
        return call

    def item(self, call: RecordedCall, value: Any) -> None:
        call.items.append(encode_value(value))

    def ended(self, call: RecordedCall, exc: BaseException | None = None) -> None:
        call.end = self._now()
        if exc is not None:
            call.error = _error(call.stage, exc)

    def finish(self) -> Record:
        self.record.duration = self._now()
        return self.record


@functools.lru_cache(maxsize=64)
def _where(script: str | Path) -> tuple[str, str]:
    """A script's file name and absolute path (resolved once, not on every request)."""
    path = Path(script)
    return path.name, str(path.resolve())


class RecordingBinding(Wrapper):
    """``inner``, with every call noted in the request's :class:`Recorder` (when the
    request keeps one: ``ctx.record``)."""

    async def invoke(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        recorder: Recorder | None = ctx.record
        if recorder is None:
            return await self.inner.invoke(req, ctx)
        call = recorder.call(self.name, False, req)
        try:
            result = await self.inner.invoke(req, ctx)
        except BaseException as exc:
            recorder.ended(call, exc)
            raise
        recorder.item(call, result)
        recorder.ended(call)
        return result

    async def call(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        return await self.invoke(req, ctx)

    def stream(self, req: Any, ctx: CallContext = NO_CONTEXT) -> AsyncIterator[Any]:
        recorder: Recorder | None = ctx.record
        if recorder is None:
            return self.inner.stream(req, ctx)
        return _recorded(self.inner, req, ctx, recorder)


async def _recorded(
    inner: Binding, req: Any, ctx: CallContext, recorder: Recorder
) -> AsyncIterator[Any]:
    call = recorder.call(inner.name, True, req)
    items = inner.stream(req, ctx)
    try:
        async for item in items:
            recorder.item(call, item)
            yield item
    except BaseException as exc:
        recorder.ended(call, exc)
        raise
    finally:
        close = getattr(items, "aclose", None)
        if close is not None:
            await close()
    recorder.ended(call)


async def noted_result(recorder: Recorder, entry: str, req: Any, result: Awaitable[Any]) -> Any:
    """``await result`` (a unary entry's run), with its request and answer noted."""
    recorder.entry(entry, req)
    try:
        value = await result
    except BaseException as exc:
        recorder.entry_failed(exc)
        raise
    recorder.answer(value)
    return value


async def noted_items(
    recorder: Recorder, entry: str, req: Any, items: AsyncGenerator[Any, None]
) -> AsyncGenerator[Any, None]:
    """A streaming entry's items, with its request and each item noted."""
    recorder.entry(entry, req)
    try:
        async for item in items:
            recorder.answer(item)
            yield item
    except BaseException as exc:
        recorder.entry_failed(exc)
        raise
    finally:
        await items.aclose()


def dump(record: Record) -> bytes:
    return _record_encoder.encode(record)


def load(data: bytes, source: str = "the record") -> Record:
    """A :class:`Record` from its bytes; :class:`RecordError` saying what is wrong."""
    try:
        record = _record_decoder.decode(data)
    except msgspec.ValidationError as exc:  # (a DecodeError too: first)
        fmt = _format_of(data)
        if fmt is not None and fmt != FORMAT:
            raise RecordError(
                f"{source} is in record format {fmt}; this bls ({__version__}) reads {FORMAT}"
            ) from None
        raise RecordError(f"{source} is not a bls record: {exc}") from None
    except msgspec.DecodeError as exc:
        if "truncated" in str(exc):
            raise RecordError(f"{source} is truncated ({len(data)} bytes)") from None
        raise RecordError(f"{source} is not a bls record: {exc}") from None
    if record.format != FORMAT:
        raise RecordError(
            f"{source} is in record format {record.format}; this bls ({__version__}) reads {FORMAT}"
        )
    return record


def _format_of(data: bytes) -> int | None:
    try:
        value = msgspec.msgpack.decode(data)
    except msgspec.DecodeError:
        return None
    fmt = value.get("format") if isinstance(value, dict) else None
    return fmt if isinstance(fmt, int) else None


class RecordWriter:
    """Writes records into a directory, one file per request (``ID.blsrec``), from a
    process of its own (running :func:`write_files`): creating a file costs more CPU
    than serving a request on some file systems, and none of it is spent in the serving
    process or holds its interpreter lock. The request's path only encodes the record
    and queues it; a task pipes what is queued to the writer in batches. At most
    ``backlog`` records wait; past that one is dropped, logged and counted
    (:attr:`dropped`), rather than a request held up by a slow disk.

    ``async with RecordWriter(folder, script) as records:`` — leaving sends what is
    queued and waits for the writer to finish writing it."""

    def __init__(self, folder: str | Path, script: str | Path, backlog: int = 10_000) -> None:
        self.script = Path(script)  # the script whose requests are recorded
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.sent = 0  # records handed to the writer process
        self.dropped = 0
        self._send, self._queued = anyio.create_memory_object_stream[bytes](backlog)
        self._stack = contextlib.AsyncExitStack()

    def write(self, name: str, record: Record) -> None:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:128].encode()
        data = dump(record)
        try:
            self._send.send_nowait(_FRAME.pack(len(safe), len(data)) + safe + data)
        except anyio.WouldBlock:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning(
                    "recording: the disk does not keep up; %d record(s) dropped", self.dropped
                )

    async def __aenter__(self) -> RecordWriter:
        code = "import sys; from bls.recording import write_files; write_files(sys.argv[1])"
        argv = [sys.executable, "-c", code, str(self.folder)]
        # Its own session: a Ctrl-C at the terminal stops the server, which then closes
        # the writer's input; the writer finishes what it was sent.
        process = await anyio.open_process(argv, stdout=None, stderr=None, start_new_session=True)
        self._stack.push_async_callback(_finished, process)
        tg = await self._stack.enter_async_context(anyio.create_task_group())
        tg.start_soon(self._pipe, process)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._send.close()  # the pipe sends what is queued, then ends
        await self._stack.aclose()

    async def _pipe(self, process: anyio.abc.Process) -> None:
        assert process.stdin is not None
        async with self._queued, process.stdin:
            async for frame in self._queued:
                batch = [frame]
                with contextlib.suppress(anyio.WouldBlock):
                    while len(batch) < 256:
                        batch.append(self._queued.receive_nowait())
                await process.stdin.send(b"".join(batch))
                self.sent += len(batch)


async def _finished(process: anyio.abc.Process) -> None:
    """Wait (shielded, bounded) for the writer to write what it was sent."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(60) as waited:
        await process.wait()
    if waited.cancelled_caught:
        log.warning("recording: the writer did not finish in 60 s; stopping it")
        process.kill()
        with anyio.CancelScope(shield=True):
            await process.wait()


_FRAME = struct.Struct("<II")  # a record to the writer: name length, record length


def write_files(folder: str | Path) -> int:
    """The writer process: each record on stdin into ``folder/NAME.blsrec``, until
    stdin ends; how many it wrote."""
    folder = Path(folder)
    source = sys.stdin.buffer
    written = 0
    while True:
        head = source.read(_FRAME.size)
        if len(head) < _FRAME.size:
            return written
        name_len, data_len = _FRAME.unpack(head)
        name = source.read(name_len).decode()
        data = source.read(data_len)
        try:
            fd = os.open(folder / f"{name}.blsrec", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            written += 1
        except OSError as exc:
            print(f"bls: recording: cannot write {name}.blsrec: {exc}", file=sys.stderr)
