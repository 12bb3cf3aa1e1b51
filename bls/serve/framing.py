"""Response framing, the one place that knows the bytes of an answer: JSON bodies, SSE and
NDJSON stream items, the error body and the status each exception is answered with.
(The chat route's own shapes and chunks: :mod:`.chat`.)"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import msgspec

from ..errors import (
    DeadlineExceeded,
    ErrorKind,
    InvalidRequest,
    StageError,
    StageNotBound,
    encodable,
)
from ..journal import JournalError
from ..scope import Reason
from .room import Room

__all__ = [
    "BODY",
    "LARGE_ANSWER",
    "LARGE_ANSWERS_BYTES",
    "SSE_END",
    "WHOLE",
    "HttpError",
    "Reply",
    "bad_header",
    "cut_short",
    "error_for",
    "holding",
    "holding_in_turn",
    "respond",
    "send_error",
    "send_pieces",
    "start",
    "store_unavailable",
    "whole_answers",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON = b"application/json"
SSE = b"text/event-stream"
NDJSON = b"application/x-ndjson"
_encode = msgspec.json.encode


class HttpError(Exception):
    """An error answered with ``status`` and the JSON error body::

        {"error": {"type", "message", "stage", "path", "code", ["entry"], ["kind"], ["param"]}}

    ``stage`` names the stage that failed (null when none did), ``entry`` the script entry
    the request was for, ``path`` the field at fault, ``code`` the status; ``param`` is
    OpenAI's name for the field, on the chat route.
    """

    def __init__(
        self,
        status: int,
        type: str,
        message: str,
        *,
        stage: str | None = None,
        path: str | None = None,
        kind: str | None = None,
        entry: str | None = None,
        param: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        message = encodable(message)  # (every answer is UTF-8)
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message
        self.stage = stage
        self.path = path
        self.kind = kind
        self.entry = entry
        self.param = param
        self.headers = headers or []

    def body(self) -> bytes:
        error: dict[str, Any] = {
            "type": self.type,
            "message": self.message,
            "stage": self.stage,
            "path": self.path,
            "code": self.status,
        }
        if self.entry is not None:
            error["entry"] = self.entry
        if self.kind is not None:
            error["kind"] = self.kind
        if self.param is not None:
            error["param"] = self.param
        return _encode({"error": error})


def bad_header(name: str, expected: str, given: bytes | None = None) -> HttpError:
    """400 naming the header, what it must be, and what it was (its first 64 bytes)."""
    got = ""
    if given is not None:
        shown = given[:64].decode(errors="replace")
        got = f", got {shown!r}" + (f" ({len(given)} bytes)" if len(given) > 64 else "")
    return HttpError(400, "invalid_header", f"{name} must be {expected}{got}", path=name)


def store_unavailable(exc: JournalError, entry: str | None = None) -> HttpError:
    """503 ``store_unavailable`` in the store's own words: the runs store failed, so the
    run was not made or read (a route of runs, files or batches, or a submission to
    ``entry``); not the script's failure, and nothing is cancelled."""
    return HttpError(503, "store_unavailable", str(exc), entry=entry)


def error_for(exc: BaseException, entry: str = "") -> HttpError:
    """The HTTP answer for an exception a request to ``entry`` ended with (the body
    names ``entry``).

    An :class:`InvalidRequest` the script raises about its own request (naming the entry
    as its stage) is the client's error: 422 with the field. So is one a stage's own
    code raised about the content it was given (an image that is not one): 422 naming
    the stage and its field. One about a request that does not fit the stage's declared
    type is the script's (it built that request): 502.
    """
    error = _error_for(exc, entry)
    if entry and error.entry is None:
        error.entry = entry
    return error


def _error_for(exc: BaseException, entry: str) -> HttpError:
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _error_for(exc.exceptions[0], entry)
    if isinstance(exc, InvalidRequest) and entry and exc.stage == entry:
        return HttpError(422, "invalid_request", exc.message, path=exc.path)
    if isinstance(exc, InvalidRequest) and not exc.mismatch:
        return HttpError(422, "invalid_request", exc.message, stage=exc.stage, path=exc.path)
    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, DeadlineExceeded):
        return HttpError(504, "deadline_exceeded", str(exc))
    if isinstance(exc, StageError) and exc.kind == ErrorKind.DEADLINE:
        return HttpError(504, "deadline_exceeded", str(exc), stage=exc.stage)
    if isinstance(exc, StageError):
        path = exc.path if isinstance(exc, InvalidRequest) else None
        if exc.kind in (ErrorKind.UNAVAILABLE, ErrorKind.OVERLOADED, ErrorKind.SHUTDOWN):
            return HttpError(
                503, "stage_unavailable", exc.message, stage=exc.stage, path=path, kind=exc.kind
            )
        return HttpError(502, "stage_error", exc.message, stage=exc.stage, path=path, kind=exc.kind)
    if isinstance(exc, StageNotBound):
        return HttpError(500, "not_bound", str(exc), stage=exc.stage)
    return HttpError(500, "internal", f"the script failed: {type(exc).__name__}: {exc}")


def sse_item(item: Any) -> bytes:
    return b"data: " + _encode(item) + b"\n\n"


SSE_END = b"event: end\ndata: {}\n\n"  # after a script's last item


def ndjson_item(item: Any) -> bytes:
    return _encode(item) + b"\n"


def cut_short(
    reason: Reason | None,
    reading: bool,
    entry: str,
    timeout: float | None,
    body_bound: float | None,
) -> Exception | None:
    """What a request is answered when its scope ended it (:class:`bls.scope.Reason`),
    the one table from a reason to an answer (:func:`error_for` gives the status of a
    :class:`bls.DeadlineExceeded`: 504); None when nobody is left to answer (its client
    went away). ``reading``: its body was still arriving (a deadline that passed
    meanwhile is the body's too slow, bounded by ``body_bound``)."""
    if reason is Reason.CLIENT_GONE:
        return None
    if reason is Reason.DRAIN:
        return HttpError(503, "draining", "the server shut down before the request ended")
    if reason is Reason.BODY_TOO_SLOW or (reason is Reason.DEADLINE and reading):
        return HttpError(
            408,
            "body_timeout",
            f"the request body did not arrive within {body_bound:g}s",
            headers=[(b"connection", b"close")],
        )
    within = f" {timeout:g}s" if timeout is not None else ""
    return DeadlineExceeded(f"request to {entry!r} exceeded its{within} deadline")


class Reply:
    """A request's answer so far: its status (0: none yet), whether a stream's head has
    gone out (an error is then framed as the stream frames it: ``error_frame``), and
    whether its last message is on its way (a disconnect the server reports after it is
    not the client leaving early)."""

    __slots__ = ("error_frame", "finishing", "status", "streamed")

    def __init__(self) -> None:
        self.status = 0
        self.streamed = False
        self.finishing = False
        self.error_frame: Callable[[HttpError], bytes] = sse_error  # (SSE by default)


def sse_error(error: HttpError) -> bytes:
    return b"event: error\ndata: " + error.body() + b"\n\n"


def ndjson_error(error: HttpError) -> bytes:
    return error.body() + b"\n"


def data_error(error: HttpError) -> bytes:
    # OpenAI-style streams carry errors as a data event (clients read error.message).
    return b"data: " + error.body() + b"\n\n"


async def start(
    send: Send,
    status: int,
    request_id: bytes,
    content_type: bytes,
    *,
    length: int | None = None,
    stream: bool = False,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [(b"content-type", content_type), (b"x-request-id", request_id)]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    if stream:
        headers.append((b"cache-control", b"no-cache"))
        headers.append((b"x-accel-buffering", b"no"))
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})


# The ASGI extensions of bls's own HTTP/1.1 connection (:mod:`.exchange`). WHOLE: a
# whole answer in one message, ``{"type": WHOLE, "status", "head", "body"}``, its
# ``head`` the header lines this module formats (lower-case names, values it vouches
# for), which the connection writes with its status line, its default headers and the
# body's length, in one write.
WHOLE = "bls.response.whole"
# BODY: ``{"take": take}``, ``take()`` the whole request body when all of it has arrived and
# none was received yet (``receive()`` then gives only the disconnect), else None.
BODY = "bls.request.body"


def whole_answers(scope: Scope) -> bool:
    """Whether the server takes a whole answer in one message (the :data:`WHOLE` extension)."""
    extensions = scope.get("extensions")
    return extensions is not None and WHOLE in extensions


# Answers of more bytes than LARGE_ANSWER (a streamed run's result, a file's content, a
# large script result) count against LARGE_ANSWERS_BYTES while they are sent, in this
# process: past it the next is refused, 503 with Retry-After, rather than held in
# memory beside the others (an answer is held until its client took it, bls serve
# --send-timeout at most: .asyncio_http, .trio_http). One larger than the whole bound
# goes when no other is being sent.
LARGE_ANSWER = 1 << 20
LARGE_ANSWERS_BYTES = 256 << 20
_PIECE = 256 << 10  # what a large answer is sent in


_large = Room(LARGE_ANSWERS_BYTES)  # the large answers being sent (or read, to be sent)


@contextlib.contextmanager
def holding(size: int) -> Iterator[None]:
    """``size`` bytes of a large answer held against :data:`LARGE_ANSWERS_BYTES` until the
    block ends, for an answer whose size is known before it is read (a run's result, a
    file's content): :class:`HttpError` 503 past the bound, before anything is read. (A
    size of :data:`LARGE_ANSWER` or less holds nothing. The answer then goes out with
    :func:`respond`'s ``held``.)"""
    if size <= LARGE_ANSWER:
        yield
        return
    if not _large.take(size):
        why = (
            f"{_large.held >> 20} MiB of large answers are being sent, at most "
            f"{LARGE_ANSWERS_BYTES >> 20} MiB at once; try again"
        )
        raise HttpError(503, "too_many_large_answers", why, headers=[(b"retry-after", b"1")])
    try:
        yield
    finally:
        _large.give(size)


@contextlib.asynccontextmanager
async def holding_in_turn(size: int) -> AsyncIterator[None]:
    """:func:`holding`, waiting for room rather than refusing: for an answer already
    under way (a large event of an events stream)."""
    if size <= LARGE_ANSWER:
        yield
        return
    async with _large.hold(size):
        yield


async def send_pieces(send: Send, body: bytes, *, last: bool) -> None:
    """``body`` as body messages of :data:`_PIECE` bytes at most (a connection's buffer
    holds one at a time, never a copy of all of it); ``last``: the answer ends with it."""
    size = len(body)
    for at in range(0, size, _PIECE):
        end = at + _PIECE
        more = end < size or not last
        await send({"type": "http.response.body", "body": body[at:end], "more_body": more})


async def respond(
    scope: Scope,
    send: Send,
    status: int,
    body: bytes,
    request_id: bytes,
    content_type: bytes = JSON,
    extra: list[tuple[bytes, bytes]] | None = None,
    *,
    held: bool = False,
) -> None:
    """A whole answer: in one message when the server offers :data:`WHOLE` (and there is
    no ``extra`` header to check), else the usual two; a large one in pieces
    (:func:`_respond_large`; ``held``: its bytes are held already, :func:`holding`)."""
    if len(body) > LARGE_ANSWER:
        with contextlib.nullcontext() if held else holding(len(body)):
            await _respond_large(send, status, body, request_id, content_type, extra)
    elif not extra and whole_answers(scope):
        head = b"content-type: %s\r\nx-request-id: %s\r\n" % (content_type, request_id)
        await send({"type": WHOLE, "status": status, "head": head, "body": body})
    else:
        await start(send, status, request_id, content_type, length=len(body), extra=extra)
        await send({"type": "http.response.body", "body": body})


async def _respond_large(
    send: Send,
    status: int,
    body: bytes,
    request_id: bytes,
    content_type: bytes,
    extra: list[tuple[bytes, bytes]] | None,
) -> None:
    """An answer over :data:`LARGE_ANSWER` bytes (held: :func:`holding`), in pieces."""
    await start(send, status, request_id, content_type, length=len(body), extra=extra)
    await send_pieces(send, body, last=True)


async def send_error(scope: Scope, send: Send, error: HttpError, request_id: bytes) -> None:
    await respond(scope, send, error.status, error.body(), request_id, extra=error.headers)
