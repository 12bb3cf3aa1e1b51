"""Recording a request: its entry's request and answer, and every stage call it made —
the request each stage got, each item or the result it gave, its error, and when.

``bls run --record FILE`` and ``bls serve --record DIR`` keep one :class:`Record` per
request (in DIR, appended to segment files under its id, :mod:`bls.segments`, by
:mod:`bls.record_writer`); ``bls replay`` and
:func:`bls.testing.replay` run the script again with every stage answered from it
(:mod:`bls.replay`). The file is msgspec-msgpack of :class:`Record` (its ``format`` says
which layout; values are :mod:`bls.codec` payloads, arrays and tensors inline), so any
msgpack reader can look inside. Recording is a binding in front of each stage
(:class:`bls.record_binding.RecordingBinding`) that writes into the request's
:class:`Recorder`, which the request's :class:`bls.scope.CallContext` carries; nothing is
recorded outside a request that keeps one.
"""

from __future__ import annotations

import math
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import anyio
import msgspec

from .codec import EXTENSIONS, Codec
from .errors import DeadlineExceeded, ErrorKind, InvalidRequest, StageError, encodable
from .typenames import TypeRef, malformed

__all__ = [
    "FORMAT",
    "Record",
    "RecordError",
    "RecordedCall",
    "RecordedError",
    "Recorder",
    "dump",
    "dump_into",
    "load",
]


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
    # The type the script got the result (each item) in, as the binding converted it
    # (None: the wire's builtins); a replay hands them over in it again. Required, None
    # included: a record that lost the field would hand a script dicts where it read
    # attributes.
    result_type: TypeRef | None


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
    # What the request passed or got that no encoder takes (an object an in-process stage
    # was given, say), left out of the record (nil in its place), and where the record
    # passed the bytes it keeps (RECORD_BYTES); the request ran as it would have
    # unrecorded. A record with any is not replayed. (The first few only.)
    unrecorded: list[str] = []


class RecordError(ValueError):
    """A record file that cannot be read, saying why (truncated, not a record, another
    format)."""


_codec = Codec(inline_max=float("inf"))  # a file holds its arrays inline
# Encodes as _codec does, without its side-buffer list: with every array inline there is
# none (a value is encoded on the request's path, several times a call).
_value_encoder = msgspec.msgpack.Encoder(enc_hook=_codec.encode_hook)
_record_encoder = msgspec.msgpack.Encoder()
_record_decoder = msgspec.msgpack.Decoder(Record)


_encode = _value_encoder.encode
_clock = time.monotonic
_LEFT_OUT = b"\xc0"  # (msgpack nil) in a record, in place of a value no encoder takes
_UNRECORDED_NOTES = 8  # a record names this many values left out, at most
# The values a record keeps, in bytes, at most (a request that streams for hours keeps
# its record's memory bounded); what comes after is left out (Record.unrecorded). As
# much as the writer of bls serve --record lets wait: a larger record could never be
# written (bls.record_writer.BACKLOG_BYTES).
RECORD_BYTES = 64 * 1024 * 1024
_PAST = f"past the {RECORD_BYTES >> 20} MiB a record keeps, it and what came after"


def encode_value(value: Any) -> bytes:
    return _encode(value)


def decode_value(data: bytes, codec: Codec = _codec) -> Any:
    return codec.decode(data)


def _error(stage: str, exc: BaseException) -> RecordedError:
    if isinstance(exc, DeadlineExceeded):
        return RecordedError(stage=stage, kind=ErrorKind.DEADLINE, message=encodable(str(exc)))
    if isinstance(exc, StageError):
        path = exc.path if isinstance(exc, InvalidRequest) else None
        return RecordedError(stage=exc.stage, kind=exc.kind, message=exc.message, path=path)
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        return RecordedError(stage=stage, kind=ErrorKind.CANCELLED, message="cancelled")
    return RecordedError(stage=stage, kind=type(exc).__name__, message=encodable(str(exc)))


class Recorder:
    """The record of one request, filled in as it runs. (Its methods run on every
    recorded request's path, several times a call: each does the least it can.)"""

    __slots__ = ("_room", "_t0", "record", "resume")

    def __init__(self, script: str | Path) -> None:
        name, path = _places.get(script) or _where(script)
        self.record = Record(bls=__version__, script=name, path=path, entry="", started=time.time())
        self._t0 = _clock()
        # The bytes of values the record may keep still, besides the entry's request
        # (which the server's body limit bounds): RECORD_BYTES. (A durable recorder,
        # whose journal holds each call as it goes, keeps them all: math.inf.)
        self._room: float = RECORD_BYTES
        # A recovered background run's journal, which answers the calls it finished
        # before (a bls.resume.Resume; RecordingBinding asks it first); None: all live.
        self.resume: Any = None

    # the entry

    def entry(self, name: str, req: Any) -> None:
        """The request begins: times are counted from here."""
        self._t0 = _clock()
        record = self.record
        record.entry = name
        try:
            record.request = _encode(req)
        except Exception as exc:
            record.request = self._left_out(exc, what="the request")

    def answer(self, value: Any) -> None:
        """The entry's result, or one item of a streaming entry."""
        items = self.record.items
        try:
            data = _encode(value)
        except Exception as exc:
            data = self._left_out(exc, what=f"answer item {len(items) + 1}")
        self._room -= len(data)
        if self._room >= 0:
            items.append(data)
        else:
            self._full(what=f"answer item {len(items) + 1}")

    def entry_failed(self, exc: BaseException) -> None:
        self.record.error = _error(self.record.entry, exc)

    # its stage calls

    def call(
        self,
        stage: str,
        streaming: bool,
        req: Any,
        result_ref: TypeRef | None = None,
        seq: int | None = None,
    ) -> RecordedCall:
        """A stage call begins: the request the script passed, and ``result_ref``, the
        type the binding converts its result (items) to, by name (:func:`ref_of`; None:
        the wire's builtins). (``seq``: the number a journal gives it,
        :class:`bls.resume.JournalRecorder`'s; a record numbers calls as they come.)"""
        call = self.new_call(stage, streaming, req, result_ref)
        calls = self.record.calls
        if self._room >= 0:
            calls.append(call)
        else:
            self._full(what=f"call {len(calls) + 1} (stage {stage!r})")
        return call

    def new_call(
        self, stage: str, streaming: bool, req: Any, result_ref: TypeRef | None
    ) -> RecordedCall:
        try:
            data = _encode(req)
        except Exception as exc:
            what = f"call {len(self.record.calls) + 1} (stage {stage!r}): its request"
            data = self._left_out(exc, what=what)
        self._room -= len(data)
        return RecordedCall(
            stage=stage,
            streaming=streaming,
            request=data,
            start=_clock() - self._t0,
            result_type=result_ref,
        )

    def item(self, call: RecordedCall, value: Any) -> None:
        try:
            data = _encode(value)
        except Exception as exc:
            data = self._left_out(exc, call)
        self._room -= len(data)
        if self._room >= 0:
            call.items.append(data)
        else:
            self._full(call)

    def result(self, call: RecordedCall, value: Any) -> None:
        """A unary call's result: :meth:`item`, then :meth:`ended` (in one call: this
        runs on every recorded call's path). (Past the record's bound, nil in its place:
        a unary call is recorded with its one result.)"""
        try:
            data = _encode(value)
        except Exception as exc:
            data = self._left_out(exc, call)
        self._room -= len(data)
        call.items.append(data if self._room >= 0 else self._full(call))
        call.end = _clock() - self._t0

    def ended(self, call: RecordedCall, exc: BaseException | None = None) -> None:
        call.end = _clock() - self._t0
        if exc is not None:
            call.error = _error(call.stage, exc)

    def finish(self) -> Record:
        record = self.record
        record.duration = _clock() - self._t0
        return record

    # a value no encoder takes

    # The value left out is named by ``what``, or as ``call``'s next item (named only
    # when the record notes it: finding the call walks the record's calls). No closure
    # names it: a function that makes one pays for it on every call.

    def _left_out(self, exc: Exception, call: RecordedCall | None = None, what: str = "") -> bytes:
        """What stands in a record for a value no encoder takes, which the record names:
        the request goes on as it would unrecorded, and its record is not replayed. A
        durable recorder raises ``exc`` instead: a background run whose calls its
        journal cannot hold could not be recovered."""
        if self.durable:
            raise exc
        notes = self.record.unrecorded
        if len(notes) < _UNRECORDED_NOTES:
            named = self._named(call, what)
            notes.append(f"{named}: {type(exc).__name__}: {encodable(str(exc))}")
        return _LEFT_OUT

    def _full(self, call: RecordedCall | None = None, what: str = "") -> bytes:
        """What stands in a record past :data:`RECORD_BYTES` for a unary call's result
        (other values past it are not kept at all, nor their place), noting the first
        value left out so."""
        notes = self.record.unrecorded
        if not any(note.endswith(_PAST) for note in notes):
            if len(notes) == _UNRECORDED_NOTES:
                notes.pop()
            notes.append(f"{self._named(call, what)}: {_PAST}")
        return _LEFT_OUT

    def _named(self, call: RecordedCall | None, what: str) -> str:
        """``what``, or ``call``'s next item (a unary call's result), by its place."""
        if call is None:
            return what
        n = next((i for i, c in enumerate(self.record.calls) if c is call), -1) + 1
        item = "its result" if not call.streaming else f"its item {len(call.items) + 1}"
        return f"call {n} (stage {call.stage!r}): {item}"

    # A durable recorder (a background run's journal) saves each call as it starts and
    # as it ends before the script goes on: the binding awaits :meth:`saved` then.
    durable = False

    async def saved(self, call: RecordedCall, done: bool) -> None:
        """Until ``call`` (begun, or ``done``) is saved: at once here."""


_places: dict[str | Path, tuple[str, str]] = {}  # _where's, for 64 scripts at most


def _where(script: str | Path) -> tuple[str, str]:
    """A script's file name and absolute path (resolved once, not on every request:
    :class:`Recorder` looks in ``_places`` first)."""
    if len(_places) >= 64:
        _places.clear()
    path = Path(script)
    place = _places[script] = path.name, str(path.resolve())
    return place


def dump(record: Record) -> bytes:
    return _record_encoder.encode(record)


def dump_into(record: Record, buffer: bytearray) -> None:
    """:func:`dump`, appended to ``buffer``."""
    _record_encoder.encode_into(record, buffer, -1)


def load(data: bytes, source: str = "the record") -> Record:
    """A :class:`Record` from its bytes; :class:`RecordError` saying what is wrong (the
    field, for a record that decodes but cannot be what bls wrote: a time that is not
    one, a unary call without its result, a value that is not a payload)."""
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
    except RecursionError:
        raise RecordError(f"{source} is not a bls record: it is nested too deep") from None
    if record.format != FORMAT:
        raise RecordError(
            f"{source} is in record format {record.format}; this bls ({__version__}) reads {FORMAT}"
        )
    problem = _problem(record)
    if problem is not None:
        raise RecordError(f"{source} is not a bls record: {problem}")
    return record


MAX_SECONDS = 7 * 24 * 3600.0  # the longest request a record may hold
# Values nested deeper than this are not replayed (a request may nest 100 levels; a
# stage's result a little more; deeper ones are a hostile file's, which would exhaust the
# stack of whatever walks them).
MAX_NESTING = 256


def _problem(record: Record) -> str | None:
    """What makes a decoded record one bls cannot have written, naming the field; None
    when it is sound. The payloads' bytes are checked as msgpack here; what they hold (an
    array's bytes, say) is checked as the replay decodes them."""
    if not (math.isfinite(record.started) and 0 <= record.duration <= MAX_SECONDS):
        return f"duration {record.duration!r} (started {record.started!r}) is not a time"
    payloads = [("request", record.request)] if record.request else []
    payloads += [(f"items[{i}]", item) for i, item in enumerate(record.items)]
    for n, call in enumerate(record.calls):
        at = f"calls[{n}]"
        if not (
            0 <= call.start <= MAX_SECONDS
            and (call.end == 0 or call.start <= call.end <= MAX_SECONDS)
        ):
            return f"{at}: start {call.start!r}, end {call.end!r}: not the times of a call"
        if not call.streaming and call.error is None and len(call.items) != 1:
            return f"{at}: a unary call of stage {call.stage!r} with {len(call.items)} results"
        if call.result_type is not None and (problem := malformed(call.result_type)):
            return f"{at}.result_type: {problem}"
        payloads.append((f"{at}.request", call.request))
        payloads += [(f"{at}.items[{i}]", item) for i, item in enumerate(call.items)]
    for at, payload in payloads:
        problem = payload_problem(payload)
        if problem is not None:
            return f"{at}: {problem}"
    return None


def payload_problem(payload: bytes) -> str | None:
    """Why ``payload`` cannot be a value bls encoded (see :mod:`bls.codec`), or None."""
    try:
        value = msgspec.msgpack.decode(payload)
    except RecursionError:
        return "nested too deep"
    except msgspec.DecodeError as exc:
        return str(exc)
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_NESTING:
            return f"nested deeper than {MAX_NESTING} levels"
        if isinstance(v, msgspec.msgpack.Ext):
            if v.code not in EXTENSIONS:
                return f"unknown extension type {v.code}"
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)
        elif isinstance(v, dict):
            stack.extend((x, depth + 1) for x in v.values())
    return None


def _format_of(data: bytes) -> int | None:
    try:
        value = msgspec.msgpack.decode(data)
    except msgspec.DecodeError:
        return None
    fmt = value.get("format") if isinstance(value, dict) else None
    return fmt if isinstance(fmt, int) else None
