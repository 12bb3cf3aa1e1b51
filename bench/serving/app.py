"""What bench/frontend.py serves: a no-op script, a one-remote-stage script, and the floor —
bare Starlette routes doing the same work on the same server (Uvicorn + httptools).

    bls serve bench/serving/app.py --bind echo=tcp://...        (bls)
    python bench/serving/app.py PORT_FILE tcp://...               (the floor)
"""

from __future__ import annotations

import sys

import bls
from bls import stage


class Ping(bls.Message):
    text: str


async def echo(req: Ping) -> Ping:
    """The remote stage: served by `bls worker bench/serving/app.py:echo`."""
    return req


@bls.script
async def noop(req: Ping) -> Ping:
    return req


@bls.script
async def remote(req: Ping) -> Ping:
    return await stage("echo", req)


def floor(address: str) -> None:
    """Starlette on Uvicorn: /noop decodes and re-encodes; /remote calls the same worker
    through a bls runtime (the stage call without bls's HTTP layer)."""
    import socket
    from contextlib import asynccontextmanager

    import msgspec
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    runtime = bls.Runtime({"echo": address})

    async def noop_route(request: Request) -> Response:
        req = msgspec.json.decode(await request.body(), type=Ping)
        return Response(msgspec.json.encode(req), media_type="application/json")

    async def remote_route(request: Request) -> Response:
        req = msgspec.json.decode(await request.body(), type=Ping)
        result = await runtime.call("echo", req)
        return Response(msgspec.json.encode(result), media_type="application/json")

    @asynccontextmanager
    async def lifespan(app: Starlette):  # type: ignore[no-untyped-def]
        async with runtime:
            yield

    app = Starlette(
        routes=[
            Route("/v1/scripts/noop", noop_route, methods=["POST"]),
            Route("/v1/scripts/remote", remote_route, methods=["POST"]),
        ],
        lifespan=lifespan,
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    print(f"ready http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, http="httptools", access_log=False, log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    floor(sys.argv[1])
