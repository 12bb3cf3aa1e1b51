"""What bench/frontend.py, bench/streams.py and bench/background_runs.py serve: a no-op
script, a one-stage script (the stage inline, or remote; inline with 4 or 8 µs of CPU
more), three remote calls in turn, a slow stream through an inline stage, and the floor —
bare Starlette routes doing the same work on the same server (Uvicorn + httptools).

    bls serve bench/serving/app.py --bind echo=tcp://... --bind local=bench/serving/app.py:echo \
        --bind tick=bench/serving/app.py:tick
    python bench/serving/app.py tcp://...                         (the floor)
    python bench/serving/app.py tcp://... --trio-guest            (the floor, each route's
                                                                   work run by trio as a
                                                                   guest of the asyncio loop)
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio

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
async def inline(req: Ping) -> Ping:
    """One stage call, the stage in process."""
    return await stage("local", req)


def spin(seconds: float) -> None:
    """Spend ``seconds`` of CPU: what a fixed cost added to each request (recording's, say)
    costs the server over HTTP (`bench/frontend.py --entries inline spin4 spin8`)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@bls.script
async def spin4(req: Ping) -> Ping:
    """``inline``, with 4 µs of CPU more."""
    spin(4e-6)
    return await stage("local", req)


@bls.script
async def spin8(req: Ping) -> Ping:
    """``inline``, with 8 µs of CPU more."""
    spin(8e-6)
    return await stage("local", req)


@bls.script
async def remote(req: Ping) -> Ping:
    return await stage("echo", req)


@bls.script
async def three(req: Ping) -> Ping:
    """Three remote calls in turn (bench/background_runs.py: what a run journals)."""
    for _ in range(3):
        req = await stage("echo", req)
    return req


class Ticks(bls.Message):
    count: int = 15
    interval: float = 1.0


class Tick(bls.Message):
    n: int


async def tick(req: Ticks) -> AsyncIterator[Tick]:
    """The streaming stage: one item every ``interval`` seconds (bound inline)."""
    for n in range(req.count):
        await anyio.sleep(req.interval)
        yield Tick(n=n)


@bls.script
async def ticks(req: Ticks) -> AsyncIterator[Tick]:
    async for item in stage.stream("tick", req):
        yield item


def floor(address: str, trio_guest: bool = False) -> None:
    """Starlette on Uvicorn: /noop decodes and re-encodes; /inline calls the stage's
    function; /remote calls the same worker through a bls runtime (the stage call without
    bls's HTTP layer).

    ``trio_guest``: /noop and /inline hand their work to a trio run hosted by the asyncio
    loop (``trio.lowlevel.start_guest_run``) and wait for its answer — what serving trio
    scripts behind Uvicorn would cost at the least (bench/trio_guest.py)."""
    import socket
    from contextlib import asynccontextmanager

    import msgspec
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    runtime = bls.Runtime({"echo": address}, start_unreachable=True)  # streams.py: none
    guest = _TrioGuest() if trio_guest else None

    async def noop_route(request: Request) -> Response:
        req = msgspec.json.decode(await request.body(), type=Ping)
        if guest is not None:
            req = await guest.call(_same, req)
        return Response(msgspec.json.encode(req), media_type="application/json")

    async def inline_route(request: Request) -> Response:
        req = msgspec.json.decode(await request.body(), type=Ping)
        result = await (echo(req) if guest is None else guest.call(echo, req))
        return Response(msgspec.json.encode(result), media_type="application/json")

    def spun(seconds: float) -> Callable[[Request], Awaitable[Response]]:
        async def spin_route(request: Request) -> Response:
            spin(seconds)
            return await inline_route(request)

        return spin_route

    async def remote_route(request: Request) -> Response:
        req = msgspec.json.decode(await request.body(), type=Ping)
        result = await runtime.call("echo", req)
        return Response(msgspec.json.encode(result), media_type="application/json")

    async def ticks_route(request: Request) -> StreamingResponse:
        req = msgspec.json.decode(await request.body(), type=Ticks)

        async def events() -> AsyncIterator[bytes]:
            async for item in tick(req):
                yield b"data: " + msgspec.json.encode(item) + b"\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @asynccontextmanager
    async def lifespan(app: Starlette):  # type: ignore[no-untyped-def]
        async with runtime:
            if guest is not None:
                await guest.start()
            yield
            if guest is not None:
                await guest.stop()

    app = Starlette(
        routes=[
            Route("/v1/scripts/noop", noop_route, methods=["POST"]),
            Route("/v1/scripts/inline", inline_route, methods=["POST"]),
            Route("/v1/scripts/spin4", spun(4e-6), methods=["POST"]),
            Route("/v1/scripts/spin8", spun(8e-6), methods=["POST"]),
            Route("/v1/scripts/remote", remote_route, methods=["POST"]),
            Route("/v1/scripts/ticks", ticks_route, methods=["POST"]),
        ],
        lifespan=lifespan,
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    print(f"ready http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, http="httptools", access_log=False, log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


async def _same(req: Ping) -> Ping:
    return req


class _TrioGuest:
    """A trio run hosted by the running asyncio loop; :meth:`call` runs a coroutine
    function there (a task in its nursery) and waits for the result on asyncio."""

    async def start(self) -> None:
        import asyncio

        import trio

        loop = asyncio.get_running_loop()
        self._loop = loop
        self._ready = asyncio.Event()
        self._stopped: asyncio.Future[None] = loop.create_future()

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

        trio.lowlevel.start_guest_run(
            main,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            run_sync_soon_not_threadsafe=loop.call_soon,
            done_callback=lambda outcome: self._stopped.set_result(None),
            host_uses_signal_set_wakeup_fd=True,
        )
        await self._ready.wait()

    async def call(self, fn, req):  # type: ignore[no-untyped-def]
        answer = self._loop.create_future()

        async def run() -> None:
            answer.set_result(await fn(req))

        self._token.run_sync_soon(self._nursery.start_soon, run)
        return await answer

    async def stop(self) -> None:
        self._token.run_sync_soon(self._stop.set)
        await self._stopped


if __name__ == "__main__":
    floor(sys.argv[1], trio_guest="--trio-guest" in sys.argv[2:])
