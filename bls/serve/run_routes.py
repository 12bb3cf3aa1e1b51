"""The HTTP routes of background runs (:mod:`.runs`), over the journal::

    GET    /v1/runs                 runs, newest first (?status=, ?limit=, ?before=ID)
    GET    /v1/runs/ID              the run: status, result or error, timings
    GET    /v1/runs/ID/events       SSE of its items and status changes (Last-Event-ID)
    DELETE /v1/runs/ID              cancel it, and every call under it

A run is answered as :func:`run_body` writes it. Events are read from the journal, so a
frontend serves those of a run another frontend on the store is running (looking for
new ones :data:`_POLL_FIRST_S` after the last it found, twice as long after each look
that finds none, up to every :data:`_POLL_S`; a run of its own wakes it as each is
written).
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import msgspec

from ..journal import STATUSES, TERMINAL, Journal, Listed, RunRow
from .framing import (
    SSE,
    HttpError,
    Receive,
    Scope,
    Send,
    holding,
    holding_in_turn,
    respond,
    send_error,
    send_pieces,
    start,
)
from .intake import header, query_of, request_id_of
from .routing import Route, not_allowed
from .runs import Runs, error_object

__all__ = ["RunRoutes", "run_body"]

_encode = msgspec.json.encode

# How soon an events stream looks again for the events of a run another frontend writes:
# soon after it found some (a streaming run's items follow one another), backing off to
# _POLL_S while it finds none (a run waiting on a long call costs two reads a second).
_POLL_FIRST_S = 0.05
_POLL_S = 0.5
_LOOK = 256  # the events a look lists at most
_INLINE = 1024  # a listed event's data comes with it up to this size (256 KiB a look)
# The events a stream reads from the store at once, in bytes, at most (but one, whatever
# its size: past LARGE_ANSWER, held against the bound of large answers being sent).
_PAGE_BYTES = 256 << 10
_MAX_LIST = 1000
_LIST_QUERY = ("status", "limit", "before")  # what GET /v1/runs takes
_MAX_ID_DIGITS = 18  # an event's id is a store's 64-bit integer
_OVER = TERMINAL | {None}  # a run's status once it has its outcome (None: forgotten since)


class RunRoutes:
    """The routes (:attr:`routes`) over ``runs``."""

    def __init__(self, runs: Runs) -> None:
        self.runs = runs
        self.journal = runs.journal
        self.streams = 0  # /events streams open
        self.routes = [
            Route("/v1/runs", ["GET"], self._list),
            Route("/v1/runs/", ["GET", "DELETE"], self._one, prefix=True),
        ]

    async def _list(self, scope: Scope, receive: Receive, send: Send, _: str) -> None:
        query = query_of(scope)
        rid = request_id_of(scope)
        status = query.get("status")
        try:
            unknown = query.keys() - _LIST_QUERY
            if unknown:
                name = min(unknown)
                why = f"unknown query parameter {name!r} (known: {', '.join(_LIST_QUERY)})"
                raise HttpError(400, "invalid_query", why, path=name)
            if status is not None and status not in STATUSES:
                raise HttpError(
                    400,
                    "invalid_query",
                    f"status must be one of {', '.join(STATUSES)}",
                    path="status",
                )
            limit = list_limit(query.get("limit"), 50, _MAX_LIST)
            before = await list_cursor(self.journal, query.get("before"), "before")
        except HttpError as error:
            await send_error(scope, send, error, rid)
            return
        journal = self.journal
        rows = await journal.do(journal.runs, status=status, before=before, limit=limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        data = b",".join(run_body(r, full=False) for r in rows)
        body = b'{"object":"list","data":[%s],"has_more":%s}' % (
            data,
            b"true" if more else b"false",
        )
        await respond(scope, send, 200, body, rid)

    async def _one(self, scope: Scope, receive: Receive, send: Send, rest: str) -> None:
        run_id, _, tail = rest.partition("/")
        rid = request_id_of(scope)
        journal = self.journal
        if tail == "":
            size = await journal.do(journal.result_size, run_id)
            if size is None:
                await send_error(scope, send, _no_run(run_id), rid)
                return
            # A large result is held against the bound of large answers before it is
            # read: clients asking for it at once cannot make the frontend read it each.
            with holding(size):
                await self._answer_run(scope, send, run_id, rid)
            return
        status = await journal.do(journal.status, run_id)
        if status is None:
            await send_error(scope, send, _no_run(run_id), rid)
        elif tail == "events" and scope["method"] != "DELETE":
            await self._events(scope, receive, send, run_id, status)
        elif tail == "events":
            error = not_allowed(scope["method"], scope["path"], ("GET", "HEAD"))
            await send_error(scope, send, error, rid)
        else:
            what = f"no route {scope['method']} {scope['path']}"
            await send_error(scope, send, HttpError(404, "not_found", what), rid)

    async def _answer_run(self, scope: Scope, send: Send, run_id: str, rid: bytes) -> None:
        """``GET`` the run (with its result), or ``DELETE`` it: cancelled, then as it is."""
        journal = self.journal
        row = await journal.do(journal.get, run_id, request=False)
        if row is None:  # (forgotten meanwhile)
            await send_error(scope, send, _no_run(run_id), rid)
            return
        status = 200
        if scope["method"] == "DELETE":
            status, row = await self.runs.cancel(row)
        await respond(scope, send, status, run_body(row), rid, held=True)

    async def _events(
        self, scope: Scope, receive: Receive, send: Send, run_id: str, status: str
    ) -> None:
        """SSE: the run's events after ``Last-Event-ID`` (each with its ``id:``), live as
        they come, until its ``end`` event; the client leaving ends it. 204 for a run
        that ended with nothing after ``Last-Event-ID``; 503 past ``[runs]
        max_event_streams`` streams at once."""
        rid = request_id_of(scope)
        last = header(scope, b"last-event-id") or b"0"
        if not (last.isdigit() and len(last) <= _MAX_ID_DIGITS):
            error = HttpError(400, "invalid_header", "Last-Event-ID must be an event's id")
            await send_error(scope, send, error, rid)
            return
        after = int(last)
        journal = self.journal
        if status in TERMINAL and await journal.do(journal.last_event, run_id) <= after:
            # The client saw the run's end (an EventSource reconnects after each stream
            # ends): 204 tells it there is nothing more to follow, and it stops.
            await start(send, 204, rid, SSE)
            await send({"type": "http.response.body", "body": b""})
            return
        if self.streams >= self.runs.config.max_event_streams:
            why = f"{self.streams} event streams are open ([runs] max_event_streams)"
            error = HttpError(503, "too_many_streams", why, headers=[(b"retry-after", b"1")])
            await send_error(scope, send, error, rid)
            return
        await start(send, 200, rid, SSE, stream=True)
        if scope["method"] == "HEAD":
            await send({"type": "http.response.body", "body": b""})
            return
        self.streams += 1
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_when_gone, receive, tg.cancel_scope)
                await self._send_events(send, run_id, after)
                tg.cancel_scope.cancel()
        finally:
            self.streams -= 1
        await send({"type": "http.response.body", "body": b""})

    async def _send_events(self, send: Send, run_id: str, after: int) -> None:
        """The run's events after ``after``, then each as it comes, to its ``end`` (or
        to the run's end, for a client that named an event past it)."""
        journal = self.journal
        poll = _POLL_FIRST_S
        while True:
            # (A look at a time, the loop serves others: a store's read may not wait, nor
            # may a send, to a client that reads fast or has gone: its cancel comes here.)
            await anyio.lowlevel.checkpoint()
            live = self.runs.live.get(run_id)
            changed = live.changed if live is not None else None  # (taken before the read)
            status, listed = await journal.do(journal.news, run_id, after, _LOOK, _INLINE)
            if not listed and status in _OVER:
                return  # (its end, written with its outcome, was at ``after`` or before)
            if listed:
                after, ended = await self._send_page(send, run_id, after, listed)
                if ended:
                    return
                if changed is not None or after < listed[-1][0] or len(listed) == _LOOK:
                    continue  # (more to send now, or a run of its own: it says when)
                poll = _POLL_FIRST_S
            elif changed is not None:  # a run of its own wakes the stream as it writes
                with anyio.move_on_after(_POLL_S):
                    await changed.wait()
                continue
            await anyio.sleep(poll)  # (another frontend's run: looked at again then)
            poll = min(2 * poll, _POLL_S)

    async def _send_page(
        self, send: Send, run_id: str, after: int, listed: list[Listed]
    ) -> tuple[int, bool]:
        """The events after ``after`` that fit in :data:`_PAGE_BYTES` (``listed``: the
        next ones, as :meth:`Journal.news` lists them; one at least, a large one held
        against the bound of large answers, in turn, before it is read): the id of the
        last one sent, and whether it was the ``end``."""
        take = total = 0
        for _, _, size, _ in listed:
            if take and total + size > _PAGE_BYTES:
                break
            take, total = take + 1, total + size
        events = [(seq, kind, data) for seq, kind, _, data in listed[:take] if data is not None]
        journal = self.journal
        async with holding_in_turn(total):
            if len(events) < take:  # (larger ones, listed without their data: read now)
                events = await journal.do(journal.events, run_id, after, take)
            for seq, kind, data in events:
                head = b"id: %d\nevent: %s\ndata: " % (seq, kind.encode())
                if len(data) <= _PAGE_BYTES:
                    frame = b"%s%s\n\n" % (head, data)
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
                else:
                    await send_pieces(send, head, last=False)
                    await send_pieces(send, data, last=False)
                    await send_pieces(send, b"\n\n", last=False)
                after = seq
                if kind == "end":
                    return after, True
        return after, False


async def _cancel_when_gone(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


def _no_run(run_id: str) -> HttpError:
    return HttpError(404, "not_found", f"no run {run_id!r}")


def run_body(row: RunRow, *, full: bool = True) -> bytes:
    """A run as the routes answer it (``full``: with its result or error)."""
    head = {
        "id": row.id,
        "object": "run",
        "entry": row.entry,
        "status": row.status,
        "created": row.created,
        "started": row.started,
        "ended": row.ended,
        "deadline": row.deadline,
    }
    body = _encode(head)
    if not full:
        return body
    result = row.result or b"null"
    return body[:-1] + b',"result":%s,"error":%s}' % (result, error_object(row.error))


def list_limit(given: str | None, default: int, most: int) -> int:
    """A list route's ``limit`` query parameter (``default`` when not given);
    HttpError 400 naming it when it is not a number from 1 to ``most``."""
    if given is None:
        return default
    try:
        limit = int(given)
    except ValueError:
        limit = 0
    if not 1 <= limit <= most:
        raise HttpError(400, "invalid_query", f"limit must be 1 to {most}", path="limit")
    return limit


async def list_cursor(
    journal: Journal, given: str | None, name: str, what: str = "run"
) -> str | None:
    """A list route's cursor, query parameter ``name`` (the id of a run, a ``what``: the
    page goes on past it); HttpError 400 naming it when no run has that id (one
    forgotten since, say: a page that went on from nowhere would look like the end)."""
    if given is not None and await journal.do(journal.status, given) is None:
        raise HttpError(400, "invalid_query", f"no {what} {given!r} to go on from", path=name)
    return given
