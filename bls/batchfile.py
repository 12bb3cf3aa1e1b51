"""``bls batch``: one entry over every line of a JSONL file, N lines at a time, each
line's result or error written to the output in input order; run again after a stop, it
runs only the lines not done yet.

The entry runs in this process (a script, its stages bound as for ``bls run``) or on a
server (a URL: each line is a ``POST /v1/scripts/ENTRY``); both write the same lines::

    {"line": 1, "result": ...}                  (a streaming entry: the list of its items)
    {"line": 2, "error": {"type", "message", "stage", "path", "code", ...}}

the error as ``bls serve`` answers it (:class:`bls.serve.framing.HttpError`).

Progress lives beside the output, in ``OUTPUT.progress``: a first line naming the input
(its path, size and SHA-256), then each finished line's answer in the order they
finished, written and flushed as each finishes. When every line is done the output is
written in input order (a temporary file renamed into place) and the progress file
removed. A stop (Ctrl-C, ``kill -9``, a crash) loses only the lines then running; a torn
last progress line is dropped. A power loss may lose what the OS had not written yet.
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import httpx
import msgspec

from .console import UsageError
from .entry import Script
from .runtime import Runtime
from .scope import RequestScope
from .serve.framing import error_for

__all__ = [
    "MAX_LINE_BYTES",
    "Answer",
    "Answered",
    "BatchError",
    "Progress",
    "Unreachable",
    "check_files",
    "run_batch",
]

log = logging.getLogger("bls.batch")

MAX_LINE_BYTES = 16 * 2**20  # an input line (one request): bls serve's body bound
NDJSON = "application/x-ndjson"
MAX_ANSWER_BYTES = 256 * 2**20  # a server's answer to one line
RETRIES = 5  # a line refused for now (429, 503) or not connected is tried again (--retries)
FORMAT = 1

# One line's answer: {"result": ...} or {"error": {...}} (its number is added on write).
Answer = dict[str, Any]
# What runs one line: its number (1-based) and bytes in, its answer out. It never raises
# but to be cancelled: a failure is an answer.
Call = Callable[[int, bytes], Awaitable[Answer]]


class BatchError(UsageError):
    """A batch that cannot start: its input, output or progress file (a one-line message)."""


class Unreachable(Exception):
    """The server could not be connected to, every try of a line failed: the batch stops,
    its progress kept (no line could be answered; marking each one failed would make the
    same command, run again once the server is back, skip them all)."""


def check_files(source: str, output: str) -> None:
    """BatchError for an input or output a batch cannot have: ``-`` (a batch reads its
    input again to go on after a stop, and keeps its progress beside its output), or the
    output being the input (which would be overwritten)."""
    if source == "-":
        raise BatchError(
            "--input -: a batch reads its input again to go on after a stop: give a file"
        )
    if output == "-":
        raise BatchError(
            "--output -: a batch keeps its progress beside its output, to go on after a "
            "stop: give a file (and read it with cat or jq once the batch is done)"
        )
    with contextlib.suppress(OSError):  # (an input that cannot be read is survey's to say)
        if os.path.samefile(source, output):
            raise BatchError(f"--output {output} is the --input: give another file")


def survey(path: Path) -> tuple[dict[str, Any], int, int]:
    """The input's identity (path, size, SHA-256), how many requests it holds (its lines
    but the blank ones) and how many lines, in one read."""
    digest = hashlib.sha256()
    requests = lines = 0
    try:
        with path.open("rb") as f:
            starts = True  # (a line over the bound comes in several reads)
            while line := f.readline(MAX_LINE_BYTES + 1):
                digest.update(line)
                requests += starts and bool(line.strip())
                lines += starts
                starts = line.endswith(b"\n")
        size = path.stat().st_size
    except OSError as exc:
        raise BatchError(f"cannot read --input {path}: {exc.strerror or exc}") from None
    ident = {"input": str(path.resolve()), "bytes": size, "sha256": digest.hexdigest()}
    return ident, requests, lines


def read_lines(path: Path) -> Iterator[tuple[int, bytes | None]]:
    """Each request's line number and bytes (without the newline; blank lines are no
    request); None for a line over :data:`MAX_LINE_BYTES`, skipped unread."""
    with path.open("rb") as f:
        n = 0
        while line := f.readline(MAX_LINE_BYTES + 1):
            n += 1
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                    pass
                yield n, None
            elif line.strip():
                yield n, line.rstrip(b"\r\n")


class Answered:
    """Where each finished line's answer lies in the progress file (offset, length), by
    line number, 1 to ``lines``: 16 bytes a line in two arrays, grown to the last line
    answered (a dict of tuples took 160 bytes a line, 1.6 GB for a batch of ten million
    lines). ``n in``, ``len()`` (how many are answered) and, in line order, iteration
    (their numbers)."""

    __slots__ = ("_at", "_size", "count", "lines")

    def __init__(self, lines: int) -> None:
        self.lines = lines
        self._at = array.array("q")  # -1: not answered
        self._size = array.array("q")
        self.count = 0

    def __contains__(self, n: int) -> bool:
        return 0 < n < len(self._at) and self._at[n] >= 0

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[int]:
        return (n for n, at in enumerate(self._at) if at >= 0)

    def add(self, n: int, at: int, size: int) -> None:
        """Line ``n``'s answer; IndexError for a number the input has no line of."""
        if not 0 < n <= self.lines:
            raise IndexError(f"the input has no line {n}")
        if n >= len(self._at):  # (doubling, up to the input's lines)
            more = min(self.lines + 1, max(n + 1, 2 * len(self._at))) - len(self._at)
            self._at.extend(array.array("q", [-1]) * more)
            self._size.extend(array.array("q", [0]) * more)
        self.count += self._at[n] < 0
        self._at[n], self._size[n] = at, size

    def place(self, n: int) -> tuple[int, int]:
        return self._at[n], self._size[n]


class Progress:
    """``OUTPUT.progress``: the input's identity, then the finished lines' answers. Opened
    with what an earlier run finished (where each answer lies in the file); an OUTPUT
    with no progress beside it is a finished batch's, or another file: refused.
    (``lines``: how many the input has, blank ones included.)"""

    def __init__(self, output: Path, ident: dict[str, Any], lines: int) -> None:
        self.output = output
        self.path = output.with_name(output.name + ".progress")
        if output.exists() and not self.path.exists():
            raise BatchError(
                f"{output} exists and no batch into it is under way: it is a finished "
                "batch's output or another file; remove it to run the batch (again)"
            )
        self.done = Answered(lines)
        self.errors = 0
        self._file: BinaryIO
        header = json.dumps({"bls_batch": FORMAT, **ident}).encode() + b"\n"
        try:
            if self.path.exists() and self.path.stat().st_size > 0:  # (empty: stopped at once)
                self._resume(header)
            else:
                self._file = self.path.open("w+b")
                self._file.write(header)
                self._file.flush()
        except OSError as exc:
            why = exc.strerror or str(exc)
            raise BatchError(f"cannot write --output {output}: {self.path}: {why}") from None

    def _resume(self, header: bytes) -> None:
        self._file = self.path.open("r+b")
        first = self._file.readline()
        if first != header:
            self._file.close()
            raise BatchError(
                f"{self.path} is the progress of another input (or of this one before it "
                "changed): remove it to start again, or give that --input"
            )
        end = self._file.tell()
        for raw in iter(self._file.readline, b""):
            try:
                answer = json.loads(raw) if raw.endswith(b"\n") else None
            except ValueError:
                answer = None
            if not isinstance(answer, dict):
                break  # torn by a stop: what follows is redone
            n = answer.get("line")
            if type(n) is not int or not 0 < n <= self.done.lines:
                break  # (nor a line of the input: another file's, or edited)
            self.done.add(n, end, len(raw))
            self.errors += "error" in answer
            end += len(raw)
        self._file.seek(end)
        self._file.truncate()

    def add(self, n: int, answer: Answer) -> None:
        """Line ``n``'s answer, written through to the OS before the next line starts."""
        data = msgspec.json.encode({"line": n, **answer}) + b"\n"
        self.done.add(n, self._file.tell(), len(data))
        self.errors += "error" in answer
        self._file.write(data)
        self._file.flush()

    def finish(self) -> None:
        """Every line is done: the output in input order, and no progress file."""
        self._file.flush()
        temporary = self.output.with_name(self.output.name + ".partial")
        with self.path.open("rb") as source, temporary.open("wb") as out:
            for n in self.done:
                offset, length = self.done.place(n)
                source.seek(offset)
                out.write(source.read(length))
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.output)
        self.close()
        self.path.unlink()

    def close(self) -> None:
        self._file.close()


async def run_batch(
    call: Call,
    path: Path,
    progress: Progress,
    lines: int,
    concurrency: int,
    tick: Callable[[int, int], None] = lambda done, errors: None,
) -> None:
    """Run every line of ``path`` that ``progress`` does not hold, ``concurrency`` at a
    time; ``tick(done, errors)`` after each. :class:`Unreachable` when a line's call
    raised it: the lines under way then are cancelled, unanswered."""
    slots = anyio.Semaphore(concurrency)
    stopped: list[Unreachable] = []

    async def one(n: int, raw: bytes | None) -> None:
        try:
            if raw is None:
                bound = f"{MAX_LINE_BYTES // 2**20} MiB"
                answer = {"error": _error("invalid_request", f"the line is over {bound}")}
            else:
                try:
                    answer = await call(n, raw)
                except Unreachable as exc:
                    stopped.append(exc)
                    tg.cancel_scope.cancel()
                    return
            try:
                progress.add(n, answer)
            except (TypeError, msgspec.EncodeError) as exc:  # (written only once encoded)
                why = f"the result cannot be written as JSON: {exc}"
                progress.add(n, {"error": _error("internal", why)})
            tick(len(progress.done), progress.errors)
        finally:
            slots.release()

    tick(len(progress.done), progress.errors)
    async with anyio.create_task_group() as tg:
        for n, raw in read_lines(path):
            if n in progress.done:
                continue
            await slots.acquire()
            tg.start_soon(one, n, raw)
    if stopped:
        raise stopped[0]
    if len(progress.done) < lines:  # (the input changed under the run)
        raise BatchError(f"--input {path} changed while it ran: remove {progress.path}")


def script_call(runtime: Runtime, entry: Script, timeout: float | None) -> Call:
    """Each line through ``entry`` in this process, as a request of its own."""

    async def call(n: int, raw: bytes) -> Answer:
        try:
            req = entry.decode(raw)
            async with RequestScope(f"line-{n}"):
                if entry.streaming:
                    async with runtime.run_stream(entry, req, timeout=timeout) as items:
                        return {"result": [item async for item in items]}
                return {"result": await runtime.run(entry, req, timeout=timeout)}
        except Exception as exc:
            return {"error": _error_of(exc, entry.name, n)}
        # (a scope ends its own cancel quietly: nothing here cancels it but to say so)
        return {"error": _error("cancelled", "the line's run was cancelled")}

    return call


def url_call(
    client: httpx.AsyncClient,
    url: str,
    entry: str,
    timeout: float | None,
    retries: int = RETRIES,
) -> Call:
    """Each line a ``POST /v1/scripts/ENTRY`` to the server at ``url``. A refusal that
    says to come back (429, 503) or a connection that fails is tried again, up to
    ``retries`` times, after ``Retry-After`` (or 1, 2, 4... s, at most 30). The last
    refusal is the line's answer; a connection that failed every time raises
    :class:`Unreachable` (the server is down, not the line wrong); a failure after the
    request was sent (the connection cut, an answer that is not HTTP) is the line's
    answer, an ``unreachable`` error."""
    target = f"{url.rstrip('/')}/v1/scripts/{entry}"
    headers = {"content-type": "application/json", "accept": f"{NDJSON}, application/json"}
    if timeout is not None:
        headers["x-request-timeout"] = f"{timeout:g}"

    async def call(n: int, raw: bytes) -> Answer:
        for attempt in range(retries + 1):
            wait = min(2.0**attempt, 30.0)
            try:
                async with client.stream("POST", target, content=raw, headers=headers) as got:
                    if got.status_code not in (429, 503) or attempt == retries:
                        return await _answer_of(got)
                    wait = _retry_after(got.headers.get("retry-after"), wait)
                    log.debug("line %d: refused for now (HTTP %d)", n, got.status_code)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt == retries:
                    raise Unreachable(f"cannot connect to {url}: {exc}") from None
                log.warning(
                    "line %d: cannot connect to %s (%s); trying again in %gs", n, url, exc, wait
                )
            except httpx.HTTPError as exc:
                if attempt == retries:
                    return {"error": _error("unreachable", f"{target}: {exc}")}
                log.warning("line %d: %s: %s; trying again in %gs", n, target, exc, wait)
            await anyio.sleep(wait)
        raise AssertionError("unreachable")  # (the last attempt returns or raises)

    return call


async def _answer_of(got: httpx.Response) -> Answer:
    body = bytearray()
    async for chunk in got.aiter_bytes():
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            bound = f"{MAX_ANSWER_BYTES // 2**20} MiB"
            return {"error": _error("answer_too_large", f"the answer is over {bound}")}
    if got.status_code == 200 and got.headers.get("content-type", "").startswith(NDJSON):
        items = [json.loads(line) for line in bytes(body).splitlines() if line.strip()]
        if items and isinstance(items[-1], dict) and items[-1].keys() == {"error"}:
            return {"error": items[-1]["error"]}
        return {"result": items}
    try:
        decoded = json.loads(body)
    except ValueError:
        decoded = None
    if got.status_code == 200 and decoded is not None:
        return {"result": decoded}
    if isinstance(decoded, dict) and isinstance(decoded.get("error"), dict):
        return {"error": decoded["error"]}
    text = bytes(body[:200]).decode(errors="replace")
    return {"error": _error("http_error", f"HTTP {got.status_code}: {text}", code=got.status_code)}


def _retry_after(value: str | None, default: float) -> float:
    try:
        return min(max(float(value), 0.0), 30.0) if value is not None else default
    except ValueError:
        return default


def _error_of(exc: Exception, entry: str, n: int) -> dict[str, Any]:
    """The error ``bls serve`` would answer for ``exc`` (its body's ``error`` object)."""
    error = error_for(exc, entry)
    if error.status == 500:
        log.error("line %d failed", n, exc_info=exc)
    answer: dict[str, Any] = msgspec.json.decode(error.body())["error"]
    return answer


def _error(kind: str, message: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "message": message, "stage": None, "path": None, **fields}
