"""``bls bench``: a load generator for any served script, or the chat endpoint.

N keep-alive HTTP/1.1 connections (``--concurrency``) each send the same request again
and again until ``--requests`` have been sent or ``--duration`` has passed. A stream's
time to its first item is measured as well as its whole time. A live progress bar goes to
stderr; the summary (a table, or one JSON object with ``--json``) to stdout.
``--plot FILE.png`` draws latency over time and its histogram (needs matplotlib:
``pip install 'bls-pipelines[plot]'``).

The client is written on asyncio streams, not an HTTP library: at thousands of requests
a second a library's per-request cost would be measured instead of the server's.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .console import UsageError, emit, read_input

__all__ = ["BenchError", "Result", "Sample", "run_bench"]


PROBE = 20  # answers looked at before going on: all the same client error stops the run


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


# -- one connection ---------------------------------------------------------------------


class _Conn:
    def __init__(self, host: str, port: int, tls: bool) -> None:
        self.host, self.port, self.tls = host, port, tls
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.message = ""  # the last answer's error message

    async def open(self) -> None:
        context = ssl.create_default_context() if self.tls else None
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, ssl=context)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, data: bytes, t0: float) -> tuple[int, str, float | None]:
        """Send one request and read its whole answer: (status, error kind, first item)."""
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        self.writer.write(data)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        stream = headers.get(b"content-type", b"").startswith(
            (b"text/event-stream", b"application/x-ndjson")
        )
        first: float | None = None
        body = bytearray()
        if b"content-length" in headers:
            body += await self.reader.readexactly(int(headers[b"content-length"]))
            if stream and body:
                first = time.perf_counter() - t0
        elif headers.get(b"transfer-encoding") == b"chunked":
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                if first is None and stream:
                    first = time.perf_counter() - t0
                body += chunk[:-2]
        else:  # the body ends with the connection
            body += await self.reader.read()
            self.close()
        if headers.get(b"connection") == b"close":
            self.close()
        kind, self.message = _error(status, bytes(body), stream)
        return status, kind, first


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


async def run_bench(
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
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    data = request_bytes(url, path, body, stream)
    result = Result(url=url, concurrency=concurrency, elapsed=0.0)
    sent = 0
    errors = 0
    began = time.perf_counter()
    until = began + duration if duration is not None else float("inf")
    probe = PROBE if requests is None or requests > PROBE else 0  # a short run just ends
    refused = ""  # why the first answers say the request is wrong, when they all do

    async def connection() -> None:
        nonlocal sent, errors, refused
        conn = _Conn(parts.hostname or "", port, tls)
        try:
            while (
                (requests is None or sent < requests)
                and time.perf_counter() < until
                and not refused
            ):
                sent += 1
                t0 = time.perf_counter()
                try:
                    status, kind, first = await conn.request(data, t0)
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    conn.close()
                    status, kind, first = 0, "connection", None
                    if not result.samples and isinstance(exc, ConnectionRefusedError):
                        raise BenchError(f"cannot connect to {url}: connection refused") from None
                now = time.perf_counter()
                result.samples.append(Sample(t0 - began, now - t0, first, status, kind))
                errors += bool(kind)
                if progress is not None:
                    progress(len(result.samples), errors)
                if len(result.samples) == probe and _all_refused(result.samples[:probe]):
                    refused = f"{status} {kind}: {conn.message}"
        finally:
            conn.close()

    await asyncio.gather(*(connection() for _ in range(concurrency)))
    result.elapsed = time.perf_counter() - began
    if refused:
        raise BenchError(
            f"stopped: the first {probe} answers were all the same client error, "
            f"{refused} (check the URL, --entry and --input)"
        )
    return result


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

        result = asyncio.run(
            run_bench(
                args.url.rstrip("/"),
                path,
                body,
                concurrency=args.concurrency,
                requests=args.requests,
                duration=args.duration,
                stream=args.stream,
                progress=progress,
            )
        )
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
