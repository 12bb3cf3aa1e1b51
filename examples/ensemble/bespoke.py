"""The ensemble written by hand: anyio and the transport client, no script runtime.

    python examples/ensemble/bespoke.py --encoder tcp://... --classifier tcp://... \\
        --generator tcp://... [--port 8000]

It serves ``POST /v1/scripts/ensemble`` with the same request, the same server-sent
events and the same `bls worker` processes as ``bls serve examples/ensemble/ensemble.py``
with every stage bound remote, so the two can be measured against each other
(bench/ensemble.py). Read beside ensemble.py, it is also what a script saves its author:
everything marked BY HAND below is done by the runtime and the frontend there.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ensemble import HIDDEN, Chunk, Picture

from bls.models.adapters import embeds_prompt
from bls.models.encoder import Embedding, EncodeRequest, Labels
from bls.models.vllm import GenerateItem
from bls.scope import CallContext
from bls.transport.replicas import RemoteBinding

log = logging.getLogger("bespoke")
TIMEOUT_S = 300.0  # each request's deadline, as bls serve's default --request-timeout

Scope = dict[str, Any]


class Ensemble:
    """The pipeline and its HTTP endpoint: a plain ASGI app."""

    def __init__(self, encoder: str, classifier: str, generator: str) -> None:
        # BY HAND: one client per stage, typed by hand (a script's Stage declarations).
        self.encoder = RemoteBinding("encoder", [encoder])
        self.classifier = RemoteBinding("classifier", [classifier])
        self.generator = RemoteBinding("generator", [generator])

    async def open(self, tg: anyio.abc.TaskGroup) -> None:
        for binding, result in (
            (self.encoder, Embedding),
            (self.classifier, Labels),
            (self.generator, GenerateItem),
        ):
            await binding.open(tg)
            binding.expect(result)

    async def run(self, req: Picture, send_chunk: Any, ctx: CallContext) -> None:
        # BY HAND: every call is handed the request's deadline to carry to its worker.
        emb = await self.encoder.call(EncodeRequest(image=req.image), ctx)
        prompt = embeds_prompt(emb, hidden=HIDDEN, max_tokens=req.max_tokens, seed=req.seed)
        labels: list[Labels] = []
        caption: list[str] = []
        # BY HAND: the sibling task, its result, and cancelling it when the stream fails
        # (the task group does that) or cancelling the stream when it fails (below).
        async with anyio.create_task_group() as tg:

            async def classify() -> None:
                try:
                    labels.append(await self.classifier.call(emb, ctx))
                except Exception:
                    tg.cancel_scope.cancel()
                    raise

            tg.start_soon(classify)
            # BY HAND: close the remote stream on every way out, so the engine aborts.
            items = self.generator.stream(prompt, ctx)
            try:
                async for item in items:
                    caption.append(item.text)
                    if item.text:
                        await send_chunk(Chunk(text=item.text))
            finally:
                with anyio.CancelScope(shield=True):
                    await items.aclose()  # type: ignore[attr-defined]
        top = labels[0]
        await send_chunk(Chunk(label=top.names[0], score=top.scores[0], caption="".join(caption)))

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]
                await send({"type": kind + ".complete"})
                if kind == "lifespan.shutdown":
                    return
        if (scope["method"], scope["path"]) != ("POST", "/v1/scripts/ensemble"):
            await _json(send, 404, {"error": {"type": "not_found"}})
            return
        # BY HAND: read the body, validate it, answer 422 naming the field.
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            req = msgspec.json.decode(body, type=Picture)
        except msgspec.ValidationError as exc:
            await _json(send, 422, {"error": {"type": "invalid_request", "message": str(exc)}})
            return
        started = False

        async def send_chunk(chunk: Chunk) -> None:
            nonlocal started
            if not started:
                started = True
                headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
            data = b"data: " + msgspec.json.encode(chunk) + b"\n\n"
            await send({"type": "http.response.body", "body": data, "more_body": True})

        # BY HAND: the request's deadline, for this process (the cancel scope) and for
        # the workers (the absolute time each remote call carries).
        ctx = CallContext(deadline=time.time() + TIMEOUT_S)
        try:
            async with anyio.create_task_group() as tg:
                # BY HAND: a client that goes away cancels the whole request.
                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(watch)
                with anyio.fail_after(TIMEOUT_S):
                    await self.run(req, send_chunk, ctx)
                tg.cancel_scope.cancel()
            await send({"type": "http.response.body", "body": b"event: end\ndata: {}\n\n"})
        except Exception as exc:
            # BY HAND: an error before the stream started is a status; after, an event.
            error = {"error": {"type": type(exc).__name__, "message": str(exc)}}
            if not started:
                await _json(send, 504 if isinstance(exc, TimeoutError) else 502, error)
            else:
                data = b"event: error\ndata: " + msgspec.json.encode(error) + b"\n\n"
                await send({"type": "http.response.body", "body": data})


async def _json(send: Any, status: int, payload: Any) -> None:
    body = msgspec.json.encode(payload)
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def main(args: argparse.Namespace) -> None:
    app = Ensemble(args.encoder, args.classifier, args.generator)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")
    config.http = "httptools"
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        await app.open(tg)  # the clients' connections live in this task group

        async def serve() -> None:
            await server.serve()  # until SIGTERM/SIGINT
            tg.cancel_scope.cancel()

        tg.start_soon(serve)
        while not server.started:  # noqa: ASYNC110 - Uvicorn has no event for it
            await anyio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        print(f"ready http://{args.host}:{port}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for stage in ("encoder", "classifier", "generator"):
        parser.add_argument(f"--{stage}", required=True, metavar="ADDR")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # uvloop where it is installed, as Uvicorn (and bls serve) pick by default.
    try:
        import uvloop  # noqa: F401

        options = {"use_uvloop": True}
    except ImportError:
        options = {}
    anyio.run(main, parser.parse_args(), backend_options=options)
