"""``bls bench``: a load generator for any served script, or the chat endpoint.

N keep-alive HTTP/1.1 connections (``--concurrency``) each send the same request again
and again until ``--requests`` have been sent or ``--duration`` has passed; with several
URLs the connections are spread over them. A stream's time to its first item is
measured as well as its whole time. With ``--turns`` the connections hold multi-turn
chat conversations instead (:mod:`bls.loadchat`). Here: the run and its summary; the
command, its table and plot are :mod:`bls.loadreport`'s.

Every connection runs on one ``selectors`` loop (:mod:`bls.loadconn`), with no event-loop
or HTTP library: at thousands of requests a second a library's per-request cost would be
measured instead of the server's.
"""

from __future__ import annotations

import functools
import json
import resource
import selectors
import socket
import ssl
import statistics
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from . import loadchat
from .console import UsageError
from .loadchat import Conversations
from .loadconn import LoadConnection

__all__ = ["BenchError", "Result", "Sample", "input_json", "run_bench"]


PROBE = 20  # answers looked at before going on: all the same client error stops the run
PAUSE = 0.01  # seconds a connection that failed waits before it connects again


class BenchError(UsageError):
    """Bad ``bls bench`` input, or a server that cannot be benchmarked as asked."""


@dataclass(slots=True)
class Sample:
    start: float  # seconds since the run began
    latency: float  # the whole answer, seconds
    first: float | None  # a stream's first item, seconds
    status: int
    kind: str  # "" for success; else the error's type (or "connection")
    turn: int | None = None  # of its conversation (with --turns), from 0
    prompt_tokens: int | None = None  # (with --turns: the answer's usage)
    cached_tokens: int | None = None


@dataclass
class Result:
    urls: list[str]
    concurrency: int
    elapsed: float
    samples: list[Sample] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)  # why connections failed
    conversations: Conversations | None = None  # with --turns

    @property
    def url(self) -> str:
        return self.urls[0]

    def summary(self) -> dict[str, Any]:
        ok = [s for s in self.samples if not s.kind]
        lat = sorted(s.latency for s in ok)
        firsts = sorted(s.first for s in ok if s.first is not None)
        errors = Counter(
            f"{s.status} {s.kind}" if s.status else s.kind for s in self.samples if s.kind
        )
        summary = {
            "url": self.url,
            "urls": self.urls,
            "concurrency": self.concurrency,
            "requests": len(self.samples),
            "ok": len(ok),
            "errors": dict(errors),
            "elapsed_s": round(self.elapsed, 3),
            "requests_per_s": round(len(ok) / self.elapsed, 2) if self.elapsed else 0.0,
            "latency_ms": _percentiles(lat),
            "first_item_ms": _percentiles(firsts) if firsts else None,
        }
        if self.conversations is not None:
            summary["conversations"] = loadchat.summary(
                self.samples, self.conversations, _percentiles
            )
        return summary


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}

    def at(q: float) -> float:
        return round(values[min(len(values) - 1, int(len(values) * q))] * 1000, 3)

    return {
        "mean": round(statistics.fmean(values) * 1000, 3),
        "p50": at(0.5),
        "p90": at(0.9),
        "p99": at(0.99),
        "max": round(values[-1] * 1000, 3),
    }


# -- one answer -------------------------------------------------------------------------


def _error(status: int, body: bytes, stream: bool) -> tuple[str, str]:
    """("", "") for a successful answer; else the error's type and message from its JSON
    body or event."""
    if status == 200:
        if not stream:
            return "", ""
        if b"event: error" in body:
            data = body.split(b"event: error\ndata: ", 1)[1].split(b"\n", 1)[0]
        elif b'"error"' in body and body.rstrip().endswith(b"}") and b"\n" in body.strip():
            data = body.strip().rsplit(b"\n", 1)[1]  # NDJSON's error line
        elif b'data: {"error"' in body:  # an OpenAI-style error chunk
            data = body.split(b'data: {"error"', 1)[1].split(b"\n", 1)[0]
            data = b'{"error"' + data
        else:
            return "", ""
    else:
        data = body
    try:
        error = json.loads(data)["error"]
        return str(error.get("type") or error.get("code") or "error"), str(error.get("message"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return "error", data[:200].decode(errors="replace")


# -- the run ----------------------------------------------------------------------------


def request_bytes(url: str, path: str, body: bytes, stream: bool) -> bytes:
    parts = urlsplit(url)
    host = parts.netloc
    accept = "text/event-stream" if stream else "application/json"
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Accept: {accept}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class Plan(Protocol):
    """What each connection sends next, and what its answer said."""

    def next(self, slot: int) -> tuple[int, bytes]:
        """(the URL's index, the request's bytes) for connection ``slot``."""
        ...

    def answered(
        self, slot: int, ok: bool, body: bytes
    ) -> tuple[int | None, int | None, int | None]:
        """(the turn, its prompt tokens, those cached) of ``slot``'s answer; None where
        the plan has no turns or the answer does not say."""
        ...


class _Same:
    """The same request again and again, connection ``slot`` on URL ``slot % len``."""

    def __init__(self, requests: list[bytes]) -> None:
        self.requests = requests

    def next(self, slot: int) -> tuple[int, bytes]:
        where = slot % len(self.requests)
        return where, self.requests[where]

    def answered(
        self, slot: int, ok: bool, body: bytes
    ) -> tuple[int | None, int | None, int | None]:
        return None, None, None


def run_bench(
    urls: str | Sequence[str],
    path: str,
    body: bytes,
    *,
    concurrency: int,
    requests: int | None,
    duration: float | None,
    stream: bool,
    progress: Any = None,
    turns: int | None = None,
) -> Result:
    """Drive the server(s); ``progress(done, errors)`` is called as answers arrive. With
    ``turns``, each connection holds chat conversations of that many turns."""
    urls = [urls] if isinstance(urls, str) else list(urls)
    places = [_place(url) for url in urls]
    _open_files_for(concurrency * (len(urls) if turns else 1))
    conversations: Conversations | None = None
    plan: Plan
    if turns is None:
        plan = _Same([request_bytes(url, path, body, stream) for url in urls])
    else:
        heads = [functools.partial(request_bytes, url, path, stream=stream) for url in urls]
        plan = conversations = Conversations(_chat_body(body), turns, heads, stream)
    result = Result(urls=urls, concurrency=concurrency, elapsed=0.0, conversations=conversations)
    slots = [
        [LoadConnection(address, family, host, tls) for address, family, host, tls in places]
        for _ in range(concurrency)
    ]
    run = _Run(result, plan, slots, requests, duration, progress)
    try:
        run.drive()
    finally:
        for conns in slots:
            for conn in conns:
                conn.close()
        run.selector.close()
    if run.stopped:
        raise BenchError(f"stopped: the first {PROBE} {run.stopped}")
    return result


def _place(url: str) -> tuple[tuple[object, ...], int, str, ssl.SSLContext | None]:
    """(address, family, host, TLS context) to connect to ``url``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BenchError(f"the URL must be http://HOST:PORT or https://..., got {url!r}")
    tls = ssl.create_default_context() if parts.scheme == "https" else None
    port = parts.port or (443 if tls else 80)
    try:
        family, _, _, _, address = socket.getaddrinfo(
            parts.hostname, port, type=socket.SOCK_STREAM
        )[0]
    except OSError as exc:
        raise BenchError(f"cannot connect to {url}: {exc.strerror or exc}") from None
    return address, family, parts.hostname, tls


def input_json(body: bytes) -> Any:
    """The request body (``--input``) decoded; :class:`BenchError` when it is not JSON."""
    try:
        return json.loads(body)
    except ValueError as exc:
        raise BenchError(f"--input is not JSON: {exc}") from None


def _chat_body(body: bytes) -> dict[str, Any]:
    decoded = input_json(body)
    if not isinstance(decoded, dict):
        raise BenchError("--turns needs a chat request (a JSON object) as --input")
    return decoded


def _open_files_for(concurrency: int) -> None:
    """Raise this process's soft limit on open files to what the connections need."""
    need = concurrency + 64  # and a few for the process itself
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise BenchError(
            f"--concurrency {concurrency} needs {need} open files, and this process may "
            f"open {hard} (ulimit -Hn)"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


class _Run:
    """Every connection on one selector: each sends its next request as soon as its last
    answer is whole, until ``requests`` were sent or ``duration`` has passed.

    A slot is one connection of ``--concurrency``: one request at a time, on the
    connection to the URL its plan names (it keeps one per URL, idle ones unwatched)."""

    def __init__(
        self,
        result: Result,
        plan: Plan,
        slots: list[list[LoadConnection]],
        requests: int | None,
        duration: float | None,
        progress: Any,
    ) -> None:
        self.result, self.plan, self.requests, self.progress = result, plan, requests, progress
        self.selector = selectors.DefaultSelector()
        self.watched: dict[LoadConnection, tuple[socket.socket, int]] = {}
        self.slots = slots
        self.busy: list[LoadConnection | None] = [None] * len(slots)  # each one's in use
        self.slot_of = {conn: i for i, conns in enumerate(slots) for conn in conns}
        self.paused: deque[tuple[float, int]] = deque()  # a slot after a failure, until
        self.sent = self.errors = 0
        self.began = time.perf_counter()
        self.until = self.began + duration if duration is not None else float("inf")
        self.probe = PROBE if requests is None or requests > PROBE else 0  # a short run just ends
        self.stopped = ""  # why the first answers say that going on measures nothing

    def drive(self) -> None:
        for slot in range(len(self.slots)):
            self._next(slot)
        while self.watched or self.paused:
            wait = max(0.0, self.paused[0][0] - time.perf_counter()) if self.paused else None
            for key, _ in self.selector.select(wait):
                conn = key.data
                try:
                    whole = conn.advance()
                except (OSError, ValueError) as exc:
                    self._failed(conn, exc)
                    continue
                if whole:
                    self._answered(conn)
                    self._next(self.slot_of[conn])
                else:
                    self._watch(conn)
            now = time.perf_counter()
            while self.paused and self.paused[0][0] <= now:
                self._next(self.paused.popleft()[1])
        self.result.elapsed = time.perf_counter() - self.began

    def _next(self, slot: int) -> None:
        """Send ``slot``'s next request, or retire it when the run is over."""
        now = time.perf_counter()
        if (
            (self.requests is not None and self.sent >= self.requests)
            or now >= self.until
            or self.stopped
        ):
            for conn in self.slots[slot]:
                self._unwatch(conn)
                conn.close()
            self.busy[slot] = None
            return
        where, data = self.plan.next(slot)
        conn = self.slots[slot][where]
        last = self.busy[slot]
        if last is not None and last is not conn:
            self._unwatch(last)  # (kept alive, idle, for the slot's next turn there)
            if conn.dropped():  # (while it was idle)
                self._unwatch(conn)
                conn.close()
        self.busy[slot] = conn
        self.sent += 1
        try:
            conn.start(data, now)
        except OSError as exc:
            self._failed(conn, exc)
            return
        self._watch(conn)

    def _answered(self, conn: LoadConnection) -> None:
        answer = conn.answer
        assert answer is not None
        body = bytes(answer.body)
        kind, message = _error(answer.status, body, answer.stream)
        turn, prompt, cached = self.plan.answered(self.slot_of[conn], not kind, body)
        self._sample(answer.t0, answer.status, kind, answer.first, turn, prompt, cached)
        samples = self.result.samples
        if len(samples) == self.probe and _all_refused(samples[: self.probe]):
            self.stopped = (
                f"answers were all the same client error, {answer.status} {kind}: {message} "
                "(check the URL, --entry and --input)"
            )

    def _failed(self, conn: LoadConnection, exc: Exception) -> None:
        if not self.result.samples and isinstance(exc, ConnectionRefusedError):
            raise BenchError(f"cannot connect to {self.result.url}: connection refused") from None
        self._unwatch(conn)
        conn.close()
        reason = getattr(exc, "strerror", None) or str(exc)  # SSLError: its strerror, too
        failures = self.result.failures
        failures[reason] += 1
        assert conn.answer is not None  # (start() makes the answer before it connects)
        slot = self.slot_of[conn]
        turn, _, _ = self.plan.answered(slot, False, b"")
        self._sample(conn.answer.t0, 0, "connection", None, turn)
        if len(self.result.samples) == self.probe == failures[reason]:
            self.stopped = f"requests all failed to connect: {reason}"
        # Not at once: a server that is down, or out of files, would be asked in a busy loop.
        self.paused.append((time.perf_counter() + PAUSE, slot))

    def _sample(
        self,
        t0: float,
        status: int,
        kind: str,
        first: float | None,
        turn: int | None = None,
        prompt: int | None = None,
        cached: int | None = None,
    ) -> None:
        now = time.perf_counter()
        sample = Sample(t0 - self.began, now - t0, first, status, kind, turn, prompt, cached)
        self.result.samples.append(sample)
        self.errors += bool(kind)
        if self.progress is not None:
            self.progress(len(self.result.samples), self.errors)

    def _watch(self, conn: LoadConnection) -> None:
        """Have the selector wait for what ``conn`` waits for (a socket may be new)."""
        assert conn.sock is not None
        watched = self.watched.get(conn)
        if watched == (conn.sock, conn.want):
            return
        if watched is not None and watched[0] is conn.sock:
            self.selector.modify(conn.sock, conn.want, conn)
        else:
            self._unwatch(conn)
            self.selector.register(conn.sock, conn.want, conn)
        self.watched[conn] = (conn.sock, conn.want)

    def _unwatch(self, conn: LoadConnection) -> None:
        watched = self.watched.pop(conn, None)
        if watched is not None:
            try:
                self.selector.unregister(watched[0])
            except (KeyError, ValueError):
                pass


def _all_refused(samples: list[Sample]) -> bool:
    """Whether every answer is one and the same client error (4xx, same type): the
    request is wrong, and sending it again measures nothing. 429 is load, not a mistake."""
    first = samples[0]
    if not 400 <= first.status < 500 or first.status == 429:
        return False
    return all((s.status, s.kind) == (first.status, first.kind) for s in samples)
