"""``bls bench``: a load generator for any served script, or the chat endpoint.

N keep-alive HTTP/1.1 connections (``--concurrency``) each send the same request again
and again until ``--requests`` have been sent or ``--duration`` has passed. A stream's
time to its first item is measured as well as its whole time. A live progress bar goes to
stderr; the summary (a table, or one JSON object with ``--json``) to stdout.
``--plot FILE.png`` draws latency over time and its histogram (needs matplotlib:
``pip install 'bls-pipelines[plot]'``).

Every connection runs on one ``selectors`` loop (:mod:`bls.loadconn`), with no event-loop
or HTTP library: at thousands of requests a second a library's per-request cost would be
measured instead of the server's.
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import socket
import ssl
import statistics
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .console import UsageError, emit, read_input
from .loadconn import LoadConnection

__all__ = ["BenchError", "Result", "Sample", "run_bench"]


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


@dataclass
class Result:
    url: str
    concurrency: int
    elapsed: float
    samples: list[Sample] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)  # why connections failed

    def summary(self) -> dict[str, Any]:
        ok = [s for s in self.samples if not s.kind]
        lat = sorted(s.latency for s in ok)
        firsts = sorted(s.first for s in ok if s.first is not None)
        errors = Counter(
            f"{s.status} {s.kind}" if s.status else s.kind for s in self.samples if s.kind
        )
        return {
            "url": self.url,
            "concurrency": self.concurrency,
            "requests": len(self.samples),
            "ok": len(ok),
            "errors": dict(errors),
            "elapsed_s": round(self.elapsed, 3),
            "requests_per_s": round(len(ok) / self.elapsed, 2) if self.elapsed else 0.0,
            "latency_ms": _percentiles(lat),
            "first_item_ms": _percentiles(firsts) if firsts else None,
        }


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


def run_bench(
    url: str,
    path: str,
    body: bytes,
    *,
    concurrency: int,
    requests: int | None,
    duration: float | None,
    stream: bool,
    progress: Any = None,
) -> Result:
    """Drive the server; ``progress(done, errors)`` is called as answers arrive."""
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
    _open_files_for(concurrency)
    data = request_bytes(url, path, body, stream)
    run = _Run(url, data, concurrency, requests, duration, progress)
    conns = [LoadConnection(address, family, parts.hostname, tls) for _ in range(concurrency)]
    try:
        run.drive(conns)
    finally:
        for conn in conns:
            conn.close()
        run.selector.close()
    if run.stopped:
        raise BenchError(f"stopped: the first {PROBE} {run.stopped}")
    return run.result


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
    answer is whole, until ``requests`` were sent or ``duration`` has passed."""

    def __init__(
        self,
        url: str,
        data: bytes,
        concurrency: int,
        requests: int | None,
        duration: float | None,
        progress: Any,
    ) -> None:
        self.url, self.data, self.requests, self.progress = url, data, requests, progress
        self.result = Result(url=url, concurrency=concurrency, elapsed=0.0)
        self.selector = selectors.DefaultSelector()
        self.watched: dict[LoadConnection, tuple[socket.socket, int]] = {}
        self.paused: deque[tuple[float, LoadConnection]] = deque()  # after a failure, until
        self.sent = self.errors = 0
        self.began = time.perf_counter()
        self.until = self.began + duration if duration is not None else float("inf")
        self.probe = PROBE if requests is None or requests > PROBE else 0  # a short run just ends
        self.stopped = ""  # why the first answers say that going on measures nothing

    def drive(self, conns: list[LoadConnection]) -> None:
        for conn in conns:
            self._next(conn)
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
                    self._next(conn)
                else:
                    self._watch(conn)
            now = time.perf_counter()
            while self.paused and self.paused[0][0] <= now:
                self._next(self.paused.popleft()[1])
        self.result.elapsed = time.perf_counter() - self.began

    def _next(self, conn: LoadConnection) -> None:
        """Send ``conn``'s next request, or retire it when the run is over."""
        now = time.perf_counter()
        if (
            (self.requests is not None and self.sent >= self.requests)
            or now >= self.until
            or self.stopped
        ):
            self._unwatch(conn)
            conn.close()
            return
        self.sent += 1
        try:
            conn.start(self.data, now)
        except OSError as exc:
            self._failed(conn, exc)
            return
        self._watch(conn)

    def _answered(self, conn: LoadConnection) -> None:
        answer = conn.answer
        assert answer is not None
        kind, message = _error(answer.status, bytes(answer.body), answer.stream)
        self._sample(answer.t0, answer.status, kind, answer.first)
        samples = self.result.samples
        if len(samples) == self.probe and _all_refused(samples[: self.probe]):
            self.stopped = (
                f"answers were all the same client error, {answer.status} {kind}: {message} "
                "(check the URL, --entry and --input)"
            )

    def _failed(self, conn: LoadConnection, exc: Exception) -> None:
        if not self.result.samples and isinstance(exc, ConnectionRefusedError):
            raise BenchError(f"cannot connect to {self.url}: connection refused") from None
        self._unwatch(conn)
        conn.close()
        reason = getattr(exc, "strerror", None) or str(exc)  # SSLError: its strerror, too
        failures = self.result.failures
        failures[reason] += 1
        assert conn.answer is not None  # (start() makes the answer before it connects)
        self._sample(conn.answer.t0, 0, "connection", None)
        if len(self.result.samples) == self.probe == failures[reason]:
            self.stopped = f"requests all failed to connect: {reason}"
        # Not at once: a server that is down, or out of files, would be asked in a busy loop.
        self.paused.append((time.perf_counter() + PAUSE, conn))

    def _sample(self, t0: float, status: int, kind: str, first: float | None) -> None:
        now = time.perf_counter()
        self.result.samples.append(Sample(t0 - self.began, now - t0, first, status, kind))
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


# -- presenting -------------------------------------------------------------------------


def table(summary: dict[str, Any]) -> Any:
    from rich.table import Table

    title = f"{summary['url']}, {summary['concurrency']} connections"
    out = Table(title=title, min_width=len(title) + 4)
    out.add_column("measure")
    out.add_column("value", justify="right")
    out.add_row("requests", f"{summary['requests']} ({summary['ok']} ok)")
    out.add_row("elapsed", f"{summary['elapsed_s']:.2f} s")
    out.add_row("requests/s", f"{summary['requests_per_s']:,.1f}")
    for label, key in (("latency", "latency_ms"), ("first item", "first_item_ms")):
        values = summary.get(key)
        if values:
            for q in ("p50", "p90", "p99"):
                out.add_row(f"{label} {q}", f"{values[q]:.2f} ms")
    for what, count in sorted(summary["errors"].items()):
        out.add_row(f"errors: {what}", str(count))
    return out


def plot(result: Result, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [s for s in result.samples if not s.kind]
    bad = [s for s in result.samples if s.kind]
    fig, (over_time, histogram) = plt.subplots(1, 2, figsize=(12, 4.5))
    over_time.scatter([s.start for s in ok], [s.latency * 1000 for s in ok], s=4, label="ok")
    if bad:
        over_time.scatter(
            [s.start for s in bad], [s.latency * 1000 for s in bad], s=8, c="red", label="error"
        )
    firsts = [s for s in ok if s.first is not None]
    if firsts:
        over_time.scatter(
            [s.start for s in firsts],
            [(s.first or 0) * 1000 for s in firsts],
            s=4,
            label="first item",
        )
    over_time.set_xlabel("time since start (s)")
    over_time.set_ylabel("latency (ms)")
    over_time.set_title("latency over time")
    over_time.legend(loc="upper right")
    histogram.hist([s.latency * 1000 for s in ok], bins=50)
    histogram.set_xlabel("latency (ms)")
    histogram.set_ylabel("requests")
    histogram.set_title(f"{len(ok)} requests, {result.concurrency} connections")
    fig.suptitle(result.url)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(args: Any) -> int:
    """``bls bench`` (its flags are in :mod:`bls.cli`): run, then print the summary."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if (args.requests is None) == (args.duration is None):
        if args.duration is None:
            args.requests = 100
        else:
            raise BenchError("give --requests or --duration, not both")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise BenchError("--plot needs matplotlib: pip install 'bls-pipelines[plot]'") from None
    if args.chat:
        path = "/v1/chat/completions"
    elif args.entry:
        path = f"/v1/scripts/{args.entry}"
    else:
        raise BenchError("name the script's entry with --entry NAME (or --chat for the chat route)")
    body = read_input(args.input)
    try:
        decoded = json.loads(body)
    except ValueError as exc:
        raise BenchError(f"--input is not JSON: {exc}") from None
    if args.chat and args.stream and isinstance(decoded, dict):
        decoded["stream"] = True
        body = json.dumps(decoded).encode()

    console = Console(stderr=True)
    total = args.requests
    columns = [
        TextColumn("[bold]bls bench"),
        BarColumn(),
        MofNCompleteColumn() if total else TextColumn("{task.completed} done"),
        TextColumn("{task.fields[errors]} errors"),
        TimeElapsedColumn(),
    ]
    with Progress(
        *columns, console=console, transient=True, disable=not console.is_terminal
    ) as bar:
        task = bar.add_task("load", total=total or args.duration, errors=0)
        began = time.perf_counter()

        def progress(done: int, errors: int) -> None:
            if total:
                bar.update(task, completed=done, errors=errors)
            else:
                bar.update(
                    task, completed=min(args.duration, time.perf_counter() - began), errors=errors
                )

        result = run_bench(
            args.url.rstrip("/"),
            path,
            body,
            concurrency=args.concurrency,
            requests=args.requests,
            duration=args.duration,
            stream=args.stream,
            progress=progress,
        )
    for reason, count in result.failures.most_common():
        print(f"bls bench: {count} connection errors: {reason}", file=sys.stderr)
    summary = result.summary()
    if args.plot:
        plot(result, args.plot)
        summary["plot"] = os.path.abspath(args.plot)
    if args.json:
        emit(json.dumps(summary).encode())
    else:
        out = Console(file=sys.stdout, width=100)
        out.print(table(summary))
        if args.plot:
            out.print(f"plot: {summary['plot']}")
    return 0 if summary["ok"] else 1
