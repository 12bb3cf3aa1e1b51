"""Request intake: the limits; what a request's handling shares (:class:`Request`: its
id, its deadline header, its scope, which its deadline, a body too slow, its client
leaving and the end of a drain end, each with its reason); the timings of its handling
(:class:`Clocks`); and its body, taken whole where the server offers it
(:data:`.framing.BODY`) or read message by message, bounded in bytes."""

from __future__ import annotations

import enum
import itertools
import logging
import math
import os
from collections.abc import Callable
from functools import partial
from typing import Any
from urllib.parse import parse_qsl

import anyio
import msgspec

from ..errors import InvalidRequest
from ..loop import Backend, Delays
from ..scope import Reason, RequestScope
from ..tracing import Span, Trace
from .framing import BODY, HttpError, Message, Receive, Reply, Scope, bad_header

__all__ = [
    "EARLY_BODY_BYTES",
    "Clocks",
    "EarlyBody",
    "Headers",
    "Limits",
    "Phase",
    "Request",
    "query_of",
    "read_body",
    "request_id",
    "request_id_of",
    "request_timeout",
    "route_body",
    "wait_for_slot",
]

log = logging.getLogger("bls.http")

# How long a request runs before the clocks beyond its first moments see it (its
# disconnect watcher, its body's bound): most requests end sooner.
_START_S = 0.002

# Request ids: random per process, then a counter (os.urandom per request costs more).
_ID_PREFIX = os.urandom(4).hex().encode()
_ids = itertools.count(1)


class Limits(msgspec.Struct, kw_only=True):
    """The frontend's bounds, from ``bls serve``'s flags."""

    max_inflight: int = 64  # accepted requests at once; more get 429
    request_timeout: float | None = 300.0  # upper bound of any request's deadline; None: none
    max_body_bytes: int = 16 * 1024 * 1024  # larger bodies get 413, unread
    max_header_bytes: int = 16 * 1024  # a request's headers; more get 431 (serve/http11.py)
    body_timeout: float | None = 10.0  # a body that takes longer gets 408; None: no bound
    send_timeout: float = 60.0  # a client that takes no answer bytes this long is dropped
    grace: float = 30.0  # seconds in-flight requests get on SIGTERM
    trace_keep: int = 100  # finished request traces kept for /debug/requests


def invalid(exc: InvalidRequest) -> HttpError:
    """422 for a body that does not decode as the entry's request (no stage failed)."""
    return HttpError(422, "invalid_request", exc.message, path=exc.path)


class Phase(enum.Enum):
    """Where a request's handling is: waiting for a slot, reading its body, running."""

    QUEUED = "queued"
    READING = "reading"
    RUNNING = "running"


class Request:
    """One accepted request, from admission to its line in the log: what it is (its id,
    entry, head, deadline, trace), its :class:`bls.scope.RequestScope` (whose
    :attr:`~bls.scope.RequestScope.reason` says why it was cut short, if it was), where
    its handling is (:class:`Phase`), its clocks' state (:class:`Clocks`), and its
    answer so far (:class:`.framing.Reply`)."""

    __slots__ = (
        "body_bounded",
        "entry",
        "headers",
        "id",
        "outlived_start",
        "phase",
        "receive",
        "reply",
        "root",
        "scope",
        "started",
        "stop_watching",
        "timeout",
        "trace",
    )

    def __init__(
        self,
        *,
        request_id: str,
        entry: str,
        trace: Trace,
        root: Span,
        backend: Backend,
        headers: Headers,
        started: float,
        receive: Receive,
        record: Any = None,
        timeout: float | None = None,
        priority: int = 0,
    ) -> None:
        self.id = request_id
        self.entry = entry
        self.headers = headers
        self.receive = receive  # the server's: the body, then a disconnect
        self.started = started  # time.perf_counter() when it arrived
        self.timeout = timeout  # seconds from its start to its deadline (None: none)
        self.trace = trace
        self.root = root  # the request's own span
        # Its deadline, and its client leaving and the server's drain cancelling it.
        self.scope = RequestScope(
            request_id,
            trace=trace,
            span=root,
            backend=backend,
            record=record,
            timeout=timeout,
            priority=priority,
            headers=headers.raw,
        )
        self.phase = Phase.READING
        # Its clocks (:class:`Clocks`): whether it has run past its first moments, and
        # whether its body's bound is its own (not its deadline, which comes first).
        self.outlived_start = False
        self.body_bounded = False
        self.stop_watching: Callable[[], object] | None = None  # its disconnect watcher's
        self.reply = Reply()

    @property
    def gone(self) -> bool:
        """Its client went away before its answer was complete."""
        return self.scope.reason is Reason.CLIENT_GONE


class Disconnected(Exception):
    """The client went away before its request body arrived."""


async def _watch(request: Request) -> None:
    """Cancel the request when its client goes away (the body has been read already).

    Servers also report a disconnect once the response is complete; that one is not the
    client leaving early, so it is ignored once the last body message is on its way.
    """
    try:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                if not request.reply.finishing:
                    request.scope.cancel(Reason.CLIENT_GONE)
                return
    except Exception:  # the server gave up on the connection: nothing left to watch
        log.debug("request %s: disconnect watch ended", request.id, exc_info=True)


class Clocks:
    """The timings every request's handling needs beyond its deadline (the scope's own,
    on the loop's :class:`bls.loop.Deadline`, the server's default one shared), on the
    loop its requests run on, each one fixed delay for all requests
    (:meth:`bls.loop.Backend.delays`): no timer and no task per request.

    A request spends its first ``_START_S`` s in ``starting`` only; most end by then. One
    still running has outlived its start (:meth:`_outlived_start`) and meets the rest:

    - ``bodies``: the body must arrive within ``body_timeout`` s of the request's start
      (of its slot, when it queued); past it the scope is cancelled
      (:attr:`bls.scope.Reason.BODY_TOO_SLOW`).
    - once its body is in, a task watching for its client's disconnect (:func:`_watch`).

    The body's bound counts from the request's start (a slot's): its delay is short by
    ``_START_S``, so it is met within a few milliseconds, never early.
    """

    __slots__ = ("backend", "bodies", "body_timeout", "starting")

    def __init__(self, backend: Backend, limits: Limits) -> None:
        self.backend = backend
        self.body_timeout = limits.body_timeout  # None: no bound of its own
        if limits.request_timeout is not None:
            backend.share(limits.request_timeout)  # (most requests have the server's deadline)
        self.starting: Delays[Request] = backend.delays(_START_S, self._outlived_start)
        bound = _after_start(self.body_timeout)
        self.bodies: Delays[Request] = backend.delays(bound, _too_slow)

    def start(self, request: Request) -> None:
        """The request has started (been admitted). Its body is bounded by its deadline
        alone when that comes first."""
        bound, timeout = self.body_timeout, request.timeout
        request.body_bounded = bound is not None and (timeout is None or timeout >= bound)
        self.starting.add(request)

    def queue(self, request: Request) -> None:
        """It waits for a slot (a deadline passing meanwhile is a 504, not a 408)."""
        request.phase = Phase.QUEUED

    def granted(self, request: Request) -> None:
        """It has its slot: its body is read from now."""
        request.phase = Phase.READING
        if request.outlived_start:
            self.starting.add(request)  # (the body's bound counts from now)

    def read(self, request: Request) -> None:
        """Its body is in: no bound any more; its disconnect is watched from now on (or
        once it grows)."""
        request.phase = Phase.RUNNING
        if request.outlived_start:
            self.bodies.discard(request)
            if request.stop_watching is None:
                _start_watching(request)

    def done(self, request: Request) -> None:
        """Its handling is over: stop its watcher, forget it."""
        self.starting.discard(request)
        if request.outlived_start:
            self.bodies.discard(request)
            if request.stop_watching is not None:
                request.stop_watching()

    def _outlived_start(self, request: Request) -> None:
        request.outlived_start = True
        phase = request.phase
        if phase is Phase.QUEUED:
            return  # (its body's bound starts with its slot)
        if phase is Phase.READING:
            if request.body_bounded:
                self.bodies.add(request)
        elif request.stop_watching is None:
            _start_watching(request)


def _after_start(seconds: float | None) -> float:
    return max((seconds or 0.0) - _START_S, 0.0)


def _too_slow(request: Request) -> None:
    request.scope.cancel(Reason.BODY_TOO_SLOW)


def _start_watching(request: Request) -> None:
    request.stop_watching = request.scope.backend.spawn(partial(_watch, request))


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def query_of(scope: Scope) -> dict[str, str]:
    """The request's query parameters (the last of each name)."""
    return dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))


class EarlyBody:
    """What of a request's body was read while it waited for a slot (:func:`wait_for_slot`):
    its first pieces, and whether that was all of it."""

    __slots__ = ("chunks", "complete", "size")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.complete = False


# Of a body, what a request waiting for a slot has read for it, at most: enough for most
# bodies (so that its client leaving is heard, and the request gives up its place), and
# what the connection would buffer for it anyway (so waiting costs no more memory).
EARLY_BODY_BYTES = 64 * 1024


async def wait_for_slot(scope: Scope, request: Request, wait: Callable[[], Any]) -> EarlyBody:
    """``await wait()`` (the request's admission ticket), hearing meanwhile if its client
    leaves: then the request is cancelled (and gives up its place). To hear that, its
    body is read first, up to :data:`EARLY_BODY_BYTES`; a longer one is not watched."""
    early = EarlyBody()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_watch_waiting, scope, request, early)
        await wait()
        tg.cancel_scope.cancel()
    return early


async def _watch_waiting(scope: Scope, request: Request, early: EarlyBody) -> None:
    body = take_body(scope)
    if body is not None:
        early.chunks.append(body)
        early.size, early.complete = len(body), True
    while not early.complete:
        if early.size > EARLY_BODY_BYTES:
            return  # (the rest is read once it runs)
        message = await request.receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        early.chunks.append(chunk)
        early.size += len(chunk)
        early.complete = not message.get("more_body", False)
    else:
        message = await request.receive()  # all read: what comes next is its leaving
    if message["type"] == "http.disconnect":
        request.scope.cancel(Reason.CLIENT_GONE)


async def read_body(
    scope: Scope, request: Request, limit: int, early: EarlyBody | None = None
) -> bytes:
    """The whole body (after what ``early`` read of it): 413 past ``limit`` bytes (before
    reading when Content-Length says so), :class:`Disconnected` when the client leaves
    first. How long it may take is bounded by the request's scope (its deadline, and
    :class:`Clocks`' body bound, which cancel it)."""
    length = request.headers.content_length
    if length is not None and length.isdigit() and int(length) > limit:
        raise HttpError(
            413, "too_large", f"the body is {int(length)} bytes, over the {limit}-byte limit"
        )
    if early is not None:
        if early.size > limit:
            raise _too_large(limit)
        if not early.complete:
            message = await request.receive()
            rest = await _rest_of_body(message, request.receive, limit, early.size)
            return b"".join([*early.chunks, rest])
        return b"".join(early.chunks)
    body = take_body(scope)  # all of it, when it came with the head (as it mostly does)
    if body is None:
        message = await request.receive()
        if message.get("more_body", False) or message["type"] != "http.request":
            return await _rest_of_body(message, request.receive, limit)
        body = message.get("body", b"")  # all in one message, as it mostly comes
    if len(body) > limit:
        raise _too_large(limit)
    return body


def take_body(scope: Scope) -> bytes | None:
    """The whole body at once, where the server offers it (:data:`.framing.BODY`)."""
    offered = scope.get("extensions")
    if offered is None:
        return None
    body = offered.get(BODY)
    return None if body is None else body["take"]()


async def route_body(scope: Scope, receive: Receive, limit: int, timeout: float) -> bytes:
    """The body of a request a route answers itself (not a script's, which
    :func:`read_body` reads under its request's scope): 413 past ``limit`` bytes, 408
    past ``timeout`` s, :class:`Disconnected` when the client leaves first."""
    length = header(scope, b"content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise _too_large(limit)
    body = take_body(scope)
    if body is not None:
        return body
    with anyio.move_on_after(timeout):
        return await _rest_of_body(await receive(), receive, limit)
    raise HttpError(408, "body_timeout", f"the body took more than {timeout:g}s to arrive")


def _too_large(limit: int) -> HttpError:
    return HttpError(413, "too_large", f"the body is over the {limit}-byte limit")


async def _rest_of_body(message: Message, receive: Receive, limit: int, size: int = 0) -> bytes:
    """The body from ``message`` on (``size`` bytes of it read before)."""
    chunks: list[bytes] = []
    while True:
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
        message = await receive()


class Headers:
    """The request headers bls reads, found in one pass over the request's headers."""

    __slots__ = (
        "accept",
        "content_length",
        "prefer",
        "priority",
        "raw",
        "request_id",
        "tenant",
        "timeout",
    )

    def __init__(self, scope: Scope) -> None:
        self.raw = scope["headers"]  # all of them (an affinity may be keyed by any)
        self.content_length: bytes | None = None
        self.request_id: bytes | None = None
        self.timeout: bytes | None = None
        self.priority: bytes | None = None
        self.tenant: bytes | None = None
        self.prefer: bytes | None = None  # (Prefer: respond-async asks for a background run)
        self.accept = b""
        for key, value in scope["headers"]:
            if key == b"content-length":
                self.content_length = bytes(value)
            elif key == b"x-request-id":
                self.request_id = bytes(value)
            elif key == b"x-request-timeout":
                self.timeout = bytes(value)
            elif key == b"accept":
                self.accept = bytes(value)
            elif key == b"x-priority":
                self.priority = bytes(value)
            elif key == b"x-tenant":
                self.tenant = bytes(value)
            elif key == b"prefer":
                self.prefer = bytes(value)


def request_timeout(headers: Headers, bound: float | None) -> float | None:
    """The request's deadline in seconds: ``X-Request-Timeout`` capped by ``bound``; 400
    for a header that is not a positive number."""
    raw = headers.timeout
    if raw is None:
        return bound
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not seconds > 0 or math.isinf(seconds):
        raise bad_header("X-Request-Timeout", "a positive number of seconds", raw)
    return seconds if bound is None else min(seconds, bound)


def request_id_of(scope: Scope) -> bytes:
    """The id a request's answer carries: its ``X-Request-Id``, or a new one."""
    return request_id(header(scope, b"x-request-id"))


def request_id(given: bytes | None) -> bytes:
    """The client's ``X-Request-Id`` (``given``) when it sent a sane one (up to 128
    printable ASCII characters: the answer's head echoes it), else a new id."""
    if given and len(given) <= 128 and given.isascii() and given.decode().isprintable():
        return given
    return b"%s%08x" % (_ID_PREFIX, next(_ids))
