"""``POST /v1/chat/completions``: checking the request's fields, running the chat entry
once per choice, and sending a ``chat.completion`` or its chunks (:mod:`.chat`'s shapes).

A field the endpoint does not implement and that would change the answer is a 400
naming it; one neither OpenAI's nor vLLM's API knows is logged and ignored
(:func:`bls.chat_request.extra_fields`). ``n`` > 1 runs the entry ``n`` times side by
side, each run with ``n = 1`` and, when the request has a ``seed``, ``seed + i`` (the
same request would otherwise give the same answer ``n`` times); their chunks interleave
as they come, each with its choice's ``index``. With a forced ``tool_choice`` a choice's
text is its tool calls (:func:`.chat.tool_calls`), sent whole in one chunk at its end.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec

from ..chat_request import ChatRequest, ToolMode, extra_fields
from ..entry import Script
from ..errors import InvalidRequest
from ..runtime import Runtime
from . import chat
from .chat import ChatChunks, Transcript
from .framing import SSE, HttpError, Scope, Send, data_error, respond, start
from .intake import Request

__all__ = ["answer_chat", "completion_body"]

log = logging.getLogger("bls.http")


async def answer_chat(
    runtime: Runtime,
    models: list[str],
    scope: Scope,
    send: Send,
    entry: Script,
    req: Any,
    request: Request,
    body: bytes,
) -> None:
    """A ``chat.completion``, or with ``"stream": true`` each choice's role chunk, a
    chunk per piece of text, its finish, then the usage (when asked) and ``[DONE]``."""
    _check_fields(req, body)
    model = _model(req, models)
    if getattr(req, "stream", False):
        runs = _runs(req)
        mode = req.tool_mode() if isinstance(req, ChatRequest) else None
        transcripts = [Transcript() for _ in runs]
        chunks = ChatChunks(chat.completion_id(), model, len(runs))
        streamed = _Stream(send, request, chunks, mode)
        await _each(runs, lambda i, r: streamed.choice(runtime, entry, r, i, transcripts[i]))
        await streamed.end(req, transcripts)
        return
    answer = await _completion(runtime, model, entry, req)
    request.reply.status = 200
    request.reply.finishing = True
    await respond(scope, send, 200, answer, request.id.encode())


async def completion_body(
    runtime: Runtime, models: list[str], entry: Script, req: Any, body: bytes
) -> bytes:
    """The ``chat.completion`` a request without ``"stream": true`` is answered with (a
    batch's line is answered so): its fields checked, the entry run once per choice."""
    _check_fields(req, body)
    return await _completion(runtime, _model(req, models), entry, req)


def _model(req: Any, models: list[str]) -> str:
    """The model the request names (the first served one when it names none); 404."""
    model = getattr(req, "model", "") or models[0]
    if model not in models:
        raise HttpError(
            404,
            "NotFoundError",  # as vllm serve answers, and the openai client expects
            f"The model `{model}` does not exist. Valid aliases: {', '.join(models)}.",
            path="$.model",
            param="model",
        )
    return model


async def _completion(runtime: Runtime, model: str, entry: Script, req: Any) -> bytes:
    runs = _runs(req)
    mode = req.tool_mode() if isinstance(req, ChatRequest) else None
    transcripts = [Transcript() for _ in runs]
    await _each(runs, lambda i, r: _collect(runtime, entry, r, transcripts[i]))
    calls = [
        None if mode is None else chat.tool_calls(entry.name, req, mode, t) for t in transcripts
    ]
    return chat.completion(chat.completion_id(), model, transcripts, calls, mode)


def _check_fields(req: Any, body: bytes) -> None:
    """400 naming a field bls cannot honour; one log line naming those it ignores."""
    try:
        ignored = extra_fields(body) if isinstance(req, ChatRequest) else []
    except InvalidRequest as exc:
        raise HttpError(400, "unsupported", exc.message, path=exc.path) from None
    if ignored:
        log.info(
            "chat request: ignoring field(s) that neither OpenAI's nor vLLM's chat API knows: %s",
            ", ".join(sorted(ignored)[:20]),
        )
    problem = chat.unsupported(req)
    if problem is not None:
        raise HttpError(400, "unsupported", problem[0], path=problem[1])


def _runs(req: Any) -> list[Any]:
    """One request per choice (see the module)."""
    n = getattr(req, "n", 1)
    if n == 1 or not isinstance(req, ChatRequest):
        return [req]
    seed = req.seed
    return [
        msgspec.structs.replace(req, n=1, seed=None if seed is None else seed + i) for i in range(n)
    ]


async def _each(runs: list[Any], run: Any) -> None:
    """``run(i, request)`` for each choice: in this task for one, side by side for more."""
    if len(runs) == 1:
        await run(0, runs[0])
        return
    async with anyio.create_task_group() as tg:
        for i, r in enumerate(runs):
            tg.start_soon(run, i, r)


async def _collect(runtime: Runtime, entry: Script, req: Any, transcript: Transcript) -> None:
    async def add(item: Any) -> None:
        transcript.add(item)

    await _feed(runtime, entry, req, add)


async def _feed(
    runtime: Runtime, entry: Script, req: Any, sink: Callable[[Any], Awaitable[None]]
) -> None:
    """Each item of one run to ``sink``: a streaming entry's as it yields them, a unary
    chat entry's answer as its one item."""
    if entry.streaming:
        await runtime.feed(entry, req, sink)
    else:
        await sink(await runtime.run(entry, req))


class _Stream:
    """One streamed answer: the headers wait for the first item of any choice (an error
    before it still gets a status of its own); a choice's role chunk goes before its
    first item; sends from the choices take turns."""

    def __init__(
        self, send: Send, request: Request, chunks: ChatChunks, mode: ToolMode | None
    ) -> None:
        self.send = send
        self.request = request
        self.chunks = chunks
        self.mode = mode
        self.turns = anyio.Lock()
        request.reply.error_frame = data_error

    async def choice(
        self, runtime: Runtime, entry: Script, req: Any, index: int, transcript: Transcript
    ) -> None:
        chunks = self.chunks
        opened = False

        async def sink(item: Any) -> None:
            nonlocal opened
            text, finish, logprobs = transcript.add(item)
            if self.mode is not None:  # (its calls go whole, at the end)
                return
            if text or logprobs:
                frame = chunks.text(text, finish, index, logprobs)
            elif finish is not None:
                frame = chunks.finish(finish, index)
            else:
                return
            if not opened:
                opened = True
                frame = chunks.role(index) + frame
            await self._send(frame)

        await _feed(runtime, entry, req, sink)
        last = b"" if opened else chunks.role(index)
        if self.mode is not None:
            made = chat.tool_calls(entry.name, req, self.mode, transcript)
            last += chunks.calls(made, chat.finish_of(transcript, self.mode), index)
        elif transcript.finish_reason is None:
            last += chunks.finish("stop", index)
        await self._send(last)

    async def _send(self, frame: bytes) -> None:
        async with self.turns:
            reply = self.request.reply
            if not reply.streamed:
                await start(self.send, 200, self.request.id.encode(), SSE, stream=True)
                reply.streamed = True
                reply.status = 200
            await self.send({"type": "http.response.body", "body": frame, "more_body": True})

    async def end(self, req: Any, transcripts: list[Transcript]) -> None:
        last = b""
        usage = chat.total_usage(transcripts)
        options = getattr(req, "stream_options", None) or {}
        if usage is not None and options.get("include_usage"):
            last += self.chunks.usage(usage)
        self.request.reply.finishing = True
        await self.send({"type": "http.response.body", "body": last + self.chunks.done()})
