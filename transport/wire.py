"""The wire format: the only module that knows the bytes on the wire.

A message is a list of ZeroMQ frames::

    [header, payload, *buffers]          (a ROUTER adds the peer identity in front)

- ``header``: a msgspec-msgpack :class:`Header` (kind, call id, stage, absolute deadline,
  credit/ack counters, trace context), small and fixed in shape.
- ``payload``: the msgspec-msgpack encoding of the request, result, item or error
  (:class:`bls.codec.Codec`, which recordings use too).
- ``buffers``: raw memory of numpy arrays / torch tensors found in the payload, sent
  zero-copy; the payload holds ``(dtype, shape, frame index)`` in their place (the way
  vLLM's v1 engine-core protocol carries tensors). Small arrays are inlined. Nothing is
  ever pickled.

Decoding never raises to the caller of :func:`parse`: a malformed message is ``None``;
:func:`invalid` says why a decoded header cannot be acted on (a kind that does not exist,
a deadline that is not a finite time, a credit beyond :data:`MAX_CREDIT`). Payloads decode
arrays and tensors only when the receiving process has loaded numpy or torch itself
(its own types need them): a peer's bytes never make it import a module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgspec

from bls.codec import Codec
from bls.errors import DeadlineExceeded, ErrorKind, InvalidRequest, StageError
from bls.priorities import MAX_PRIORITY
from bls.scope import LATEST_DEADLINE
from bls.tracing import Span

__all__ = [
    "PROTOCOL",
    "Codec",
    "ErrorInfo",
    "Header",
    "Hello",
    "Kind",
    "WorkerInfo",
    "decode_spans",
    "encode_spans",
    "error_from",
    "error_info",
    "frame_sizes",
    "invalid",
    "parse",
]

PROTOCOL = 2  # 2: the header carries the request's priority
MAX_CREDIT = 1024  # stream items a caller may let a worker send ahead, at most
_MAX_ID = 2**63 - 1


class Kind:
    """Frame kinds (small ints on the wire)."""

    HELLO = 1  # both ways: version + schema exchange
    CALL = 2  # client → worker
    CANCEL = 3  # client → worker
    DATA = 4  # worker → client: one stream item
    END = 5  # worker → client: unary result, or end of stream
    ERROR = 6  # worker → client
    HEARTBEAT = 7  # both ways
    CREDIT = 8  # client → worker: more stream items may be sent
    ACK = 9  # worker → client: calls up to ``ack`` were received

    ALL = frozenset(range(1, 10))


class Header(msgspec.Struct, array_like=True, frozen=True):
    kind: int
    call: int = 0
    stage: str = ""
    deadline: float = 0.0  # absolute, seconds since the epoch; 0 = none
    count: int = 0  # CALL: initial stream credit; CREDIT: credit granted
    ack: int = 0  # worker → client: highest call id received from this client
    trace: str = ""  # CALL: the request id of the caller's trace (empty: not traced)
    to: str = ""  # CALL: the worker instance the caller believes it is talking to
    spans: bytes = b""  # END/ERROR of a traced call: the spans the worker recorded
    priority: int = 0  # CALL: the request's priority (higher first; bls.priority)


class Hello(msgspec.Struct, frozen=True):
    """The client's hello: its protocol version and the stage it expects."""

    protocol: int
    stage: str


class WorkerInfo(msgspec.Struct, frozen=True):
    """What a worker advertises in its hello (and heartbeats, for ``instance``)."""

    protocol: int
    stage: str
    streaming: bool
    request_schema: dict[str, Any]
    response_schema: dict[str, Any]
    request_type: str  # "module:QualName", or "" when not a named class
    response_type: str
    instance: str  # random per process: a changed value means the worker restarted
    max_inflight: int
    error: str = ""  # set when the worker refuses the hello (version or stage mismatch)
    models: list[str] = []  # the model names it serves (bls.Worker.served_models)


class ErrorInfo(msgspec.Struct, frozen=True):
    stage: str
    kind: str
    message: str
    traceback: str | None = None
    path: str | None = None
    mismatch: bool = False  # invalid_request: the request did not fit the declared type


# -- errors: the one map between exceptions and error frames, both ways ---------------


def error_info(err: StageError) -> ErrorInfo:
    """The error frame a worker sends for ``err``."""
    return ErrorInfo(
        stage=err.stage,
        kind=err.kind,
        message=err.message,
        traceback=err.remote_traceback,
        path=err.path if isinstance(err, InvalidRequest) else None,
        mismatch=isinstance(err, InvalidRequest) and err.mismatch,
    )


def error_from(info: ErrorInfo, stage: str, served: str) -> Exception:
    """The exception a caller raises for an error frame: the same one it would raise had
    the stage run in its own process.

    Errors about the worker's own stage (``served``) carry the caller's name for it
    (``stage``); errors from stages the worker called itself keep theirs.
    """
    name = stage if info.stage == served else info.stage
    if info.kind == ErrorKind.INVALID_REQUEST:
        path = info.path or "$"
        return InvalidRequest(name, info.message, path, info.traceback, mismatch=info.mismatch)
    if info.kind == ErrorKind.DEADLINE:
        return DeadlineExceeded(f"stage {stage!r}: the deadline passed in the worker")
    return StageError(name, info.kind, info.message, info.traceback)


_header_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(Header)


def encode_header(header: Header) -> bytes:
    return _header_encoder.encode(header)


def parse(frames: Sequence[Any]) -> tuple[Header, Sequence[Any]] | None:
    """Split a received message into its header and the rest; None if malformed.
    The header's fields are checked by :func:`invalid` before anything acts on them."""
    if len(frames) < 2:
        return None
    try:
        header = _header_decoder.decode(frames[0])
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError, ValueError):
        return None
    return header, frames[1:]


def invalid(header: Header) -> str:
    """Why a decoded header cannot be acted on ("" when it can)."""
    if header.kind not in Kind.ALL:
        return f"unknown frame kind {header.kind}"
    if not 0 <= header.call <= _MAX_ID or not 0 <= header.ack <= _MAX_ID:
        return "call id out of range"
    deadline = header.deadline
    if not (math.isfinite(deadline) and 0.0 <= deadline < LATEST_DEADLINE):
        return f"deadline {deadline!r} is not a time"
    if not 0 <= header.count <= MAX_CREDIT:
        return f"credit {header.count} is outside 0..{MAX_CREDIT}"
    if not -MAX_PRIORITY <= header.priority <= MAX_PRIORITY:
        return f"priority {header.priority} is outside -{MAX_PRIORITY}..{MAX_PRIORITY}"
    return ""


def frame_sizes(frames: Sequence[Any]) -> int:
    return sum(len(f) for f in frames)


_error_codec = Codec(ErrorInfo)
_info_codec = Codec(WorkerInfo)
_hello_codec = Codec(Hello)


def encode_error(info: ErrorInfo) -> bytes:
    return bytes(_error_codec.encode(info)[0])


def decode_error(payload: Any) -> ErrorInfo:
    return _error_codec.decode(payload)


def encode_info(info: WorkerInfo) -> bytes:
    return bytes(_info_codec.encode(info)[0])


def decode_info(payload: Any) -> WorkerInfo:
    return _info_codec.decode(payload)


def encode_heartbeat(instance: str) -> bytes:
    """A worker's heartbeat payload: its instance id (a change means it restarted)."""
    return instance.encode()


def decode_heartbeat(payload: Any) -> str:
    return bytes(payload).decode(errors="replace")


def encode_hello(hello: Hello) -> bytes:
    return bytes(_hello_codec.encode(hello)[0])


def decode_hello(payload: Any) -> Hello:
    return _hello_codec.decode(payload)


# -- spans a traced call's worker reports with its final frame -----------------------

_spans_encoder = msgspec.msgpack.Encoder()
_spans_decoder = msgspec.msgpack.Decoder(list[Span])


def encode_spans(spans: list[Span]) -> bytes:
    return _spans_encoder.encode(spans)


def decode_spans(data: bytes) -> list[Span]:
    """Spans a worker reported; [] for anything malformed (a trace never fails a call)."""
    try:
        return _spans_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return []
