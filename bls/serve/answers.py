"""Running an accepted request's entry and sending what it produces: a unary result as
JSON, a stream as SSE (or NDJSON when asked), and the chat route's completion or chunks.

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
from . import chat
from .framing import (
    NDJSON,
    SSE,
    SSE_END,
    ChatChunks,
    HttpError,
    Scope,
    Send,
    data_error,
    ndjson_error,
    ndjson_item,
    respond,
    sse_item,
    start,
)
from .intake import Request

__all__ = ["answer_chat", "answer_entry"]

_encode = msgspec.json.encode


async def answer_entry(
    runtime: Runtime, scope: Scope, send: Send, entry: Script, req: Any, request: Request
) -> None:
    """``POST /v1/scripts/ENTRY``: the result, or the items then an end."""
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


async def answer_chat(
    runtime: Runtime,
    models: list[str],
    scope: Scope,
    send: Send,
    entry: Script,
    req: Any,
    request: Request,
) -> None:
    """``POST /v1/chat/completions``: a ``chat.completion``, or with ``"stream": true``
    a role chunk, a chunk per piece of text, the finish (and usage) and ``[DONE]``."""
    problem = chat.unsupported(req)
    if problem is not None:
        raise HttpError(400, "unsupported", problem[0], path=problem[1])
    model = getattr(req, "model", "") or models[0]
    if model not in models:
        raise HttpError(
            404,
            "NotFoundError",  # as vllm serve answers, and the openai client expects
            f"The model `{model}` does not exist. Valid aliases: {', '.join(models)}.",
            path="$.model",
            param="model",
        )
    cid = chat.completion_id()
    transcript = chat.Transcript()
    if getattr(req, "stream", False):
        await _chat_stream(runtime, send, entry, req, request, ChatChunks(cid, model), transcript)
        return
    parts: list[str] = []

    async def collect(item: Any) -> None:
        parts.append(transcript.add(item)[0])

    if entry.streaming:
        await runtime.feed(entry, req, collect)
    else:
        await collect(await runtime.run(entry, req))
    request.reply.status = 200
    body = chat.completion(cid, model, "".join(parts), transcript)
    request.reply.finishing = True
    await respond(scope, send, 200, body, request.id.encode())


async def _chat_stream(
    runtime: Runtime,
    send: Send,
    entry: Script,
    req: Any,
    request: Request,
    chunks: ChatChunks,
    transcript: chat.Transcript,
) -> None:
    def frame(item: Any) -> bytes:
        text, finish = transcript.add(item)
        if text:
            return chunks.text(text, finish)
        return chunks.finish(finish) if finish is not None else b""

    request.reply.error_frame = data_error
    await _stream(runtime, send, entry, req, request, SSE, frame, chunks.role())
    last = b"" if transcript.finish_reason else chunks.finish("stop")
    usage = transcript.usage()
    options = getattr(req, "stream_options", None) or {}
    if usage is not None and options.get("include_usage"):
        last += chunks.usage(usage)
    request.reply.finishing = True
    await send({"type": "http.response.body", "body": last + chunks.done()})


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
