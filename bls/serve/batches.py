"""The OpenAI Batch API over background runs: ``/v1/batches``, for the chat entry
(``@bls.script(openai="chat")``), as the official ``openai`` client calls it, its files
kept by the Files API (:mod:`.files`).

- ``POST /v1/batches`` (``input_file_id``, ``endpoint`` = ``/v1/chat/completions``,
  ``completion_window`` = ``24h``, ``metadata``) checks every line of the input file
  (400 naming the line and the field: JSON, a unique ``custom_id``, ``method`` POST, the
  ``url`` the endpoint, a ``body``), then makes a background run of kind ``batch``
  (:class:`bls.serve.runs.Runs` runs it, and takes it over when its frontend dies);
  ``GET /v1/batches[/ID]`` and ``POST /v1/batches/ID/cancel`` read and cancel it.

A batch runs its lines ``[runs] batch_concurrency`` at a time, each answered as ``POST
/v1/chat/completions`` answers it (:func:`.chat_answers.completion_body`), and saves each
line's outcome as an event of its run before going on. A batch that was taken over goes
on from those events: a line that ended is not run again; one that was running when its
frontend stopped runs again. At its end (completed, cancelled or expired) its output
file holds the lines that were answered 200 and its error file the others, in the input
file's order, each ``{"id", "custom_id", "response": {"status_code", "request_id",
"body"}, "error"}``. A batch expires ``[runs] batch_window_s`` after it was made (24 h):
its lines not answered by then are cancelled, and the error file has each as OpenAI
writes an expired request, ``"response": null`` and ``"error": {"code":
"batch_expired", ...}``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
import msgspec

from ..entry import Script
from ..errors import InvalidRequest
from ..journal import TERMINAL, RunRow
from ..journal_files import FileRow
from ..runtime import Runtime
from ..scope import Reason, RequestScope
from .chat_answers import completion_body
from .files import BODY_S
from .framing import HttpError, Receive, Scope, Send, error_for, respond, send_error
from .intake import Disconnected, query_of, request_id_of, route_body
from .room import Room
from .routing import Route
from .run_events import journaled
from .run_routes import list_cursor, list_limit
from .runs import Runs

__all__ = ["Batches"]

ENDPOINT = "/v1/chat/completions"
MAX_LINES = 50_000  # lines of one batch, at most (OpenAI's bound)
_STATUS = {  # a batch's status, by its run's
    "queued": "validating",
    "running": "in_progress",
    "succeeded": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}
_encode = msgspec.json.encode


class _Line(msgspec.Struct, forbid_unknown_fields=False):
    custom_id: str
    method: str
    url: str
    body: msgspec.Raw


class _Create(msgspec.Struct, forbid_unknown_fields=False):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


class _Done(msgspec.Struct):
    """A line's outcome, as its event holds it."""

    index: int
    ok: bool
    total: int  # the batch's lines
    completed: int  # lines answered 200 so far, this one included
    failed: int  # lines answered otherwise so far
    line: msgspec.Raw  # the output (or error) file's line


class Batches:
    """The Batch API's routes (:attr:`routes`) for a frontend's chat entry ``entry``
    over ``runs``; ``models``: the names the chat route answers to."""

    def __init__(self, runs: Runs, runtime: Runtime, entry: Script, models: list[str]) -> None:
        self.runs = runs
        self.journal = runs.journal
        self.runtime = runtime
        self.entry = entry
        self.models = models
        self.kind = f"batch:{entry.name}"
        # The input files held at once: running batches' lines, and files being checked
        # (each its own room: a check never waits for a batch to end).
        self._inputs = Room(runs.config.batch_input_bytes)
        self._checking = Room(runs.config.batch_input_bytes)
        runs.jobs["batch"] = self._run
        self.routes = [
            Route("/v1/batches", ["GET", "POST"], self._batches),
            Route("/v1/batches/", ["GET", "POST"], self._batch, prefix=True),
        ]

    # -- batches ------------------------------------------------------------------------

    async def _batches(self, scope: Scope, receive: Receive, send: Send, _: str) -> None:
        rid = request_id_of(scope)
        try:
            if scope["method"] == "GET":
                await respond(scope, send, 200, await self._list(query_of(scope)), rid)
                return
            body = await route_body(scope, receive, 64 * 1024, BODY_S)
            row = await self._create(body)
        except HttpError as error:
            await send_error(scope, send, error, rid)
            return
        except Disconnected:
            return
        await respond(scope, send, 200, await self._batch_body(row), rid)

    async def _list(self, query: dict[str, str]) -> bytes:
        """``GET /v1/batches``: newest first, ``limit`` of them (1 to 100, 20 when not
        given) after batch ``after``, paged as OpenAI's list pages them."""
        limit = list_limit(query.get("limit"), 20, 100)
        journal = self.journal
        after = await list_cursor(journal, query.get("after"), "after", "batch")
        rows = await journal.do(
            journal.runs, entry=self.kind, before=after, limit=limit + 1, request=True
        )
        more, rows = len(rows) > limit, rows[:limit]
        page = {
            "object": "list",
            "data": [msgspec.Raw(await self._batch_body(r)) for r in rows],
            "first_id": rows[0].id if rows else None,
            "last_id": rows[-1].id if rows else None,
            "has_more": more,
        }
        return _encode(page)

    async def _create(self, body: bytes) -> RunRow:
        try:
            asked = msgspec.json.decode(body, type=_Create)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise HttpError(400, "invalid_request", f"the batch: {exc}") from None
        if asked.endpoint != ENDPOINT:
            why = f"endpoint {asked.endpoint!r}: batches run {ENDPOINT} only"
            raise HttpError(400, "invalid_request", why, path="$.endpoint")
        if asked.completion_window != "24h":
            why = f"completion_window {asked.completion_window!r}: only '24h' is supported"
            raise HttpError(400, "invalid_request", why, path="$.completion_window")
        async with self._input(self._checking, asked.input_file_id) as data:
            if data is None:
                why = f"no file {asked.input_file_id!r}"
                raise HttpError(400, "invalid_request", why, path="$.input_file_id")
            # (Each line checked now, in a worker thread: 400 naming the first wrong one.)
            await anyio.to_thread.run_sync(_lines, data)
        request = _encode(
            {
                "input_file_id": asked.input_file_id,
                "metadata": asked.metadata,
                "endpoint": ENDPOINT,
                "completion_window": "24h",
            }
        )
        return await self.runs.submit_job(self.kind, request, self.runs.config.batch_window_s)

    async def _batch(self, scope: Scope, receive: Receive, send: Send, rest: str) -> None:
        rid = request_id_of(scope)
        batch_id, _, tail = rest.partition("/")
        method = scope["method"]
        row = await self.journal.do(self.journal.get, batch_id)
        if row is None or row.entry != self.kind:
            error = HttpError(404, "not_found", f"no batch {batch_id!r}")
            await send_error(scope, send, error, rid)
            return
        if (method, tail) == ("POST", "cancel"):
            _, row = await self.runs.cancel(row)
        elif (method, tail) != ("GET", ""):
            error = HttpError(404, "not_found", f"no route {method} {scope['path']}")
            await send_error(scope, send, error, rid)
            return
        await respond(scope, send, 200, await self._batch_body(row), rid)

    async def _batch_body(self, row: RunRow) -> bytes:
        """A batch as OpenAI's API gives it, from its run and its last line's counts."""
        journal = self.journal
        asked = msgspec.json.decode(row.request)
        last = await journal.do(journal.last_event, row.id)
        counts = {"total": 0, "completed": 0, "failed": 0}
        for _, kind, data in await journal.do(journal.events, row.id, max(0, last - 3)):
            if kind == "line":
                done = msgspec.json.decode(data, type=_Done)
                counts.update(total=done.total, completed=done.completed, failed=done.failed)
            elif kind == "lines":
                counts["total"] = int(data)
        status = _STATUS[row.status]
        failure = None if row.error is None else msgspec.json.decode(row.error)["error"]
        if row.status == "failed" and failure and failure["type"] == "deadline_exceeded":
            status = "expired"
        elif row.cancel and row.status in ("queued", "running"):
            status = "cancelling"  # (its frontend was asked, and stops it within a lease/5)
        output = error = None
        if row.status in TERMINAL:
            if await journal.do(journal.file, _output_id(row.id)) is not None:
                output = _output_id(row.id)
            if await journal.do(journal.file, _error_id(row.id)) is not None:
                error = _error_id(row.id)
        created = int(row.created)
        ended = None if row.ended is None else int(row.ended)
        body: dict[str, Any] = {
            "id": row.id,
            "object": "batch",
            "endpoint": ENDPOINT,
            "errors": None,
            "input_file_id": asked["input_file_id"],
            "completion_window": "24h",
            "status": status,
            "output_file_id": output,
            "error_file_id": error,
            "created_at": created,
            "in_progress_at": None if row.started is None else int(row.started),
            "expires_at": int(row.deadline) if row.deadline is not None else None,
            "completed_at": ended if status == "completed" else None,
            "failed_at": ended if status == "failed" else None,
            "expired_at": ended if status == "expired" else None,
            "cancelled_at": ended if status == "cancelled" else None,
            "request_counts": counts,
            "metadata": asked.get("metadata"),
        }
        if status == "failed" and failure is not None:
            body["errors"] = {
                "object": "list",
                "data": [{"code": failure.get("type"), "message": failure.get("message")}],
            }
        return _encode(body)

    # -- running one --------------------------------------------------------------------

    async def _run(
        self, row: RunRow, scope: RequestScope, note: Callable[[str, bytes], Awaitable[None]]
    ) -> bytes:
        """The batch's run (a :data:`bls.serve.runs.Job`): once its input file fits in
        ``batch_input_bytes`` beside the others running, its lines (:meth:`_run_lines`)."""
        file_id = msgspec.json.decode(row.request)["input_file_id"]
        async with self._input(self._inputs, file_id) as data:
            if data is None:
                why = f"the input file {file_id!r} was deleted"
                raise HttpError(400, "invalid_request", why)
            return await self._run_lines(row, scope, note, data)  # (held while it runs)

    @asynccontextmanager
    async def _input(self, room: Room, file_id: str) -> AsyncIterator[bytes | None]:
        """The bytes of input file ``file_id`` (None: there is none), read once ``room``
        holds its size, and held there while the block runs."""
        journal = self.journal
        found = await journal.do(journal.file, file_id)
        if found is None:
            yield None
            return
        async with room.hold(found.size):
            file = await journal.load_file(file_id)
            yield None if file is None else file.data

    async def _run_lines(
        self,
        row: RunRow,
        scope: RequestScope,
        note: Callable[[str, bytes], Awaitable[None]],
        source: bytes,
    ) -> bytes:
        """The batch's lines (``source``: its input file) not done yet, then its output and
        error files (those made even when it is cancelled or expires)."""
        journal = self.journal
        lines = await anyio.to_thread.run_sync(_lines, source)
        done: dict[int, _Done] = {}
        async for data in journaled(journal, row.id, "line"):
            ended = msgspec.json.decode(data, type=_Done)
            done[ended.index] = ended
        if not done:
            await note("lines", b"%d" % len(lines))
        counts = [sum(d.ok for d in done.values()), sum(not d.ok for d in done.values())]
        # The lines not answered yet, taken one at a time by batch_concurrency workers (a
        # task per line waiting its turn took kilobytes a line: gigabytes for a large file).
        todo = ((index, line) for index, line in enumerate(lines) if index not in done)

        async def work() -> None:
            for index, line in todo:
                await one(index, line)

        async def one(index: int, line: _Line) -> None:
            status, answer = await self._answer(line)
            ok = status == 200
            counts[0 if ok else 1] += 1
            out = _encode(
                {
                    "id": f"batch_req_{uuid.uuid4().hex}",
                    "custom_id": line.custom_id,
                    "response": {
                        "status_code": status,
                        "request_id": f"{row.id}-{index}",
                        "body": msgspec.Raw(answer),
                    },
                    "error": None,
                }
            )
            entry = _Done(index, ok, len(lines), counts[0], counts[1], msgspec.Raw(out))
            done[index] = entry
            with anyio.CancelScope(shield=True):  # (an answered line is kept)
                await note("line", _encode(entry))

        try:
            async with anyio.create_task_group() as tg:
                for _ in range(min(self.runs.config.batch_concurrency, len(lines) - len(done))):
                    tg.start_soon(work)
        except BaseException:
            # Cancelled, or past its deadline: what it answered is its output; expired,
            # the lines it did not answer are errors. (Stopped for another frontend to go
            # on with: none yet.)
            if scope.cancelling in (Reason.CANCELLED, Reason.DEADLINE):
                if scope.cancelling is Reason.DEADLINE:
                    _expire(lines, done)
                with anyio.CancelScope(shield=True):
                    await self._write_files(row.id, done)
            raise
        await self._write_files(row.id, done)
        return b"null"

    async def _answer(self, line: _Line) -> tuple[int, bytes]:
        """(status, body) of one line, as ``POST /v1/chat/completions`` answers it."""
        body = bytes(line.body)
        try:
            req = self.entry.decode(body)
            if getattr(req, "stream", False):
                why = "a batch's line cannot stream: leave out 'stream'"
                raise HttpError(400, "unsupported", why, path="$.body.stream")
            answer = await completion_body(self.runtime, self.models, self.entry, req, body)
            return 200, answer
        except InvalidRequest as exc:
            error = HttpError(422, "invalid_request", exc.message, path=exc.path)
            return error.status, error.body()
        except Exception as exc:
            error = error_for(exc, self.entry.name)
            return error.status, error.body()

    async def _write_files(self, run_id: str, done: dict[int, _Done]) -> None:
        journal = self.journal
        limit = self.runs.config.max_file_bytes
        for ok, file_id, name in (
            (True, _output_id(run_id), "output"),
            (False, _error_id(run_id), "errors"),
        ):
            lines = [bytes(done[i].line) for i in sorted(done) if done[i].ok is ok]
            if not lines or await journal.do(journal.file, file_id) is not None:
                continue  # (none; or written before this frontend took the batch over)
            data = b"".join(line + b"\n" for line in lines)
            if len(data) > limit:
                raise HttpError(
                    500,
                    "too_large",
                    f"the batch's {name} would be {len(data)} bytes, over [runs] "
                    f"max_file_bytes ({limit})",
                )
            file = FileRow(
                id=file_id,
                purpose="batch_output",
                filename=f"{run_id}_{name}.jsonl",
                size=len(data),
                created=journal.now(),
                data=data,
            )
            await journal.save_file(file)


EXPIRED = {
    "code": "batch_expired",
    "message": "This request could not be executed before the completion window expired.",
}


def _expire(lines: list[_Line], done: dict[int, _Done]) -> None:
    """Each line not answered by the batch's expiry, as an error line of its own (as
    OpenAI writes an expired request); kept in the error file only, not as an event."""
    for index, line in enumerate(lines):
        if index not in done:
            out = {
                "id": f"batch_req_{uuid.uuid4().hex}",
                "custom_id": line.custom_id,
                "response": None,
                "error": EXPIRED,
            }
            done[index] = _Done(index, False, len(lines), 0, 0, msgspec.Raw(_encode(out)))


def _output_id(run_id: str) -> str:
    return f"file-{run_id}-output"


def _error_id(run_id: str) -> str:
    return f"file-{run_id}-errors"


def _lines(data: bytes) -> list[_Line]:
    """The input file's lines, each checked: 400 naming the first that is wrong."""
    lines: list[_Line] = []
    seen: set[str] = set()
    for number, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = msgspec.json.decode(raw, type=_Line)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise HttpError(400, "invalid_request", f"input file line {number}: {exc}") from None
        where = f"input file line {number}"
        if line.method != "POST":
            raise HttpError(400, "invalid_request", f"{where}: method must be POST", path="method")
        if line.url != ENDPOINT:
            why = f"{where}: url {line.url!r} is not the batch's endpoint {ENDPOINT}"
            raise HttpError(400, "invalid_request", why, path="url")
        if line.custom_id in seen:
            why = f"{where}: custom_id {line.custom_id!r} is used twice"
            raise HttpError(400, "invalid_request", why, path="custom_id")
        seen.add(line.custom_id)
        lines.append(line)
        if len(lines) > MAX_LINES:
            raise HttpError(400, "invalid_request", f"more than {MAX_LINES} lines")
    if not lines:
        raise HttpError(400, "invalid_request", "the input file has no lines")
    return lines
