"""Running an accepted request's entry and sending what it produces: a unary result as
JSON, a stream as SSE (or NDJSON when asked). (The chat route's: :mod:`.chat_answers`.)

Items go out as the script yields them, from the script's own task: no queue between
the script and the client, so a slow client pauses the script. Before its last body
message each marks the request's reply ``finishing`` (:class:`.framing.Reply`): the
disconnect a server reports once the response is complete is not the client leaving
early. The response's headers
wait for the first item, so an error before it still gets a status of its own; after
it, the stream ends with the error in the stream's own framing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from ..entry import Script
from ..runtime import Runtime
from .framing import (
    NDJSON,
    SSE,
    SSE_END,
    Scope,
    Send,
    ndjson_error,
    ndjson_item,
    respond,
    sse_item,
    start,
)
from .intake import Request

__all__ = ["answer_entry"]

_encode = msgspec.json.encode


async def answer_entry(
    runtime: Runtime,
    scope: Scope,
    send: Send,
    entry: Script,
    req: Any,
    request: Request,
    body: bytes = b"",
) -> None:
    """``POST /v1/scripts/ENTRY``: the result, or the items then an end. (``body``, the
    bytes ``req`` was decoded from, is not needed here.)"""
    if not entry.streaming:
        result = await runtime.run(entry, req)
        reply = request.reply
        reply.status = 200
        reply.finishing = True
        await respond(scope, send, 200, _encode(result), request.id.encode())
        return
    if NDJSON in request.headers.accept:
        request.reply.error_frame = ndjson_error
        await _stream(runtime, send, entry, req, request, NDJSON, ndjson_item)
        request.reply.finishing = True
        await send({"type": "http.response.body", "body": b""})
    else:
        await _stream(runtime, send, entry, req, request, SSE, sse_item)
        request.reply.finishing = True
        await send({"type": "http.response.body", "body": SSE_END})


async def _stream(
    runtime: Runtime,
    send: Send,
    entry: Script,
    req: Any,
    request: Request,
    content_type: bytes,
    frame: Callable[[Any], bytes],
    opening: bytes = b"",
) -> None:
    """Run ``entry`` and send each item as the script yields it (an item framed as
    ``b""`` is skipped). Headers, then ``opening``, wait for the first item."""

    reply = request.reply

    async def begin() -> None:
        await start(send, 200, request.id.encode(), content_type, stream=True)
        reply.streamed = True
        reply.status = 200
        if opening:
            await send({"type": "http.response.body", "body": opening, "more_body": True})

    async def sink(item: Any) -> None:
        body = frame(item)
        if body:
            if not reply.streamed:
                await begin()
            await send({"type": "http.response.body", "body": body, "more_body": True})

    if entry.streaming:
        await runtime.feed(entry, req, sink)
    else:  # a unary chat entry: its answer is the one item
        await sink(await runtime.run(entry, req))
    if not reply.streamed:  # an empty stream: headers, then the end
        await begin()
