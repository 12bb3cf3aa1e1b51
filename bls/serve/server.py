"""``bls serve``: the frontend on an HTTP server, with start-up, readiness and drain.

Two servers, chosen by event loop, on the same HTTP/1.1 rules (:mod:`.http11`): on
asyncio, Uvicorn's server (its sockets, lifespan and shutdown) with bls's own connection
(:mod:`.asyncio_http`); on trio, bls's own server (:mod:`.trio_http`). Hypercorn runs on
either when asked (``--server hypercorn``). Either way the runtime is entered first
(remote stages connected and type-checked), then the server starts, then ``ready URL``
is printed. SIGTERM or SIGINT starts a drain: ``/ready`` turns 503, new requests get 503,
in-flight ones get ``grace`` seconds to finish before they are cancelled (and answered
503), then the server stops and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import anyio
import anyio.abc

from ..journal import Journal, JournalError
from ..lifecycle import serve_until_signal
from ..record_writer import RecordWriter
from ..scriptfile import ScriptFile
from ..stores import open_journal
from .app import Frontend
from .cors import Cors
from .intake import Limits
from .metrics_share import SharedMetrics
from .runs import Runs

__all__ = ["bound", "serve"]

log = logging.getLogger("bls.serve")


def bound(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``reuse_port``: with ``SO_REUSEPORT``, one of
    several on the port, ``--processes``); OSError naming the address and why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY on accepted connections only when
    # the protocol says TCP, and without it small responses wait ~40 ms for delayed ACKs.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def _listen(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """The listening socket (:func:`bound`, then listening, non-blocking)."""
    sock = bound(host, port, reuse_port)
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def _uvicorn(
    frontend: Frontend,
    sock: socket.socket,
    stop: anyio.Event,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    import uvicorn

    from .asyncio_http import connection_class

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # bls handles SIGTERM/SIGINT itself (drain first, then stop)

    keep_alive = 30
    config = uvicorn.Config(
        frontend,
        lifespan="off",
        access_log=False,
        log_config=None,
        http=connection_class(  # (.asyncio_http)
            keep_alive,
            asyncio.get_running_loop(),
            frontend.limits.max_header_bytes,
            frontend.limits.send_timeout,
        ),
        # The frontend reads neither X-Forwarded-* nor a banner: no middleware per request
        # for them (the trio driver reads none either).
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=keep_alive,
    )
    server = Server(config)

    async def stopper() -> None:
        await stop.wait()
        server.should_exit = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(stopper)
        tg.start_soon(server.serve, [sock])
        while not server.started:
            if server.should_exit:
                raise OSError("the HTTP server did not start")
            await anyio.sleep(0.005)
        task_status.started()


async def _trio(
    frontend: Frontend,
    sock: socket.socket,
    stop: anyio.Event,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    from .trio_http import serve as serve_trio

    limits = frontend.limits
    await serve_trio(
        frontend,
        sock,
        stop,
        max_header_bytes=limits.max_header_bytes,
        send_timeout=limits.send_timeout,
        task_status=task_status,
    )


async def _hypercorn(
    frontend: Frontend,
    sock: socket.socket,
    stop: anyio.Event,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    import sniffio
    from hypercorn.config import Config, Sockets
    from hypercorn.utils import wrap_app

    from .http11 import MAX_URL_BYTES

    config = Config()
    config.accesslog = None
    config.errorlog = logging.getLogger("bls.hypercorn")
    config.graceful_timeout = 5
    config.keep_alive_timeout = 30
    config.keep_alive_max_requests = 1 << 62  # as Uvicorn: no cap on a connection's requests
    # h11 bounds the whole head (a longer one is answered 400 and its connection closed).
    config.h11_max_incomplete_size = frontend.limits.max_header_bytes + MAX_URL_BYTES
    sockets = Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])
    app = wrap_app(frontend, config.wsgi_max_body_size, "asgi")  # type: ignore[arg-type]
    if sniffio.current_async_library() == "trio":
        from hypercorn.trio.run import worker_serve as trio_serve

        # anyio's task status has the .started() that trio's start protocol calls.
        status: Any = task_status
        await trio_serve(
            app, config, sockets=sockets, shutdown_trigger=stop.wait, task_status=status
        )
    else:
        from hypercorn.asyncio.run import worker_serve as asyncio_serve

        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: asyncio_serve(app, config, sockets=sockets, shutdown_trigger=stop.wait)
            )
            await anyio.sleep(0.05)  # asyncio's worker_serve has no started signal
            task_status.started()


def _unrecorded(records: RecordWriter) -> str:
    """What the closing line adds about records that were not written."""
    counts = [
        (records.dropped, "dropped: the writer did not keep up"),
        (records.lost, "lost with a writer that died or was stopped"),
        (records.failed, "failed to write"),
    ]
    said = [f"{n} {why}" for n, why in counts if n]
    return f" ({'; '.join(said)})" if said else ""


def _server_for(server: str) -> tuple[str, str, Any]:
    """The running backend, the server's name (``auto`` decided) and what runs it."""
    import sniffio

    backend = sniffio.current_async_library()
    if server == "auto":
        server = "uvicorn" if backend == "asyncio" else "bls"
    if server == "uvicorn" and backend != "asyncio":
        raise ValueError("uvicorn runs on asyncio only: use --server hypercorn with trio")
    return backend, server, {"uvicorn": _uvicorn, "bls": _trio, "hypercorn": _hypercorn}[server]


def _settle_memory() -> None:
    """What start-up loaded (modules, models) lives as long as the process: keep it out of
    the collector's full passes, which requests trigger; and collect the young generation
    less often (each request allocates ~100 tracked objects, almost none in cycles)."""
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def _journal(store: str | None) -> Journal | None:
    """The store of background runs (None: off). One the operator named must open; the
    default one that cannot (a read-only home) leaves runs off, said in the log."""
    if store == "off":
        return None
    try:
        return open_journal(store)
    except JournalError as exc:
        if store is not None:
            raise
        log.warning("background runs are off: %s (name a store with --runs)", exc)
        return None


async def _start_beside(
    frontend: Frontend, tg: anyio.abc.TaskGroup, shared_metrics: str | None
) -> None:
    """What runs beside the server in ``tg``: the background runs' keeper (runs left by
    a frontend that died go on now), and this process's part of a shared ``/metrics``."""
    if frontend.runs is not None:
        await tg.start(frontend.runs.keep)
    if shared_metrics is not None:
        frontend.metrics.shared = shared = SharedMetrics(shared_metrics)
        tg.start_soon(shared.publish, frontend.metrics.render_own)


async def serve(
    app: ScriptFile,
    host: str,
    port: int,
    limits: Limits,
    *,
    server: str = "auto",
    model_aliases: Sequence[str] = (),
    record_to: str | None = None,
    on_ready: Callable[[str, list[str]], None] = lambda url, _: print(f"ready {url}", flush=True),
    reuse_port: bool = False,
    shared_metrics: str | None = None,
    cors_origins: Sequence[str] = (),
) -> int:
    """Serve ``app`` until SIGTERM/SIGINT, then drain; returns the exit status (0).
    ``on_ready(url, unreachable)`` is told the URL and the stages not reachable yet;
    ``record_to``: a folder each request's record is written to (its bindings record).
    ``reuse_port`` and ``shared_metrics`` (a folder): one of the processes of ``bls serve
    --processes`` (:mod:`.processes`), on the port with its siblings, its ``/metrics``
    theirs too (:mod:`.metrics_share`). ``cors_origins``: the origins whose pages may
    call it (``*``: any; :mod:`.cors`)."""
    backend, server, run_server = _server_for(server)
    from .otel import from_environment

    export = from_environment()
    # (Made before anything starts: a folder that cannot be written is an error now.)
    records = RecordWriter(record_to, app.path, finish_s=limits.grace) if record_to else None
    journal = _journal(app.config.runs.store)
    async with contextlib.AsyncExitStack() as stack:
        if records is not None:
            await stack.enter_async_context(records)
        if journal is not None:
            stack.callback(journal.close)
        async with app.runtime(start_unreachable=True) as runtime, anyio.create_task_group() as tg:
            runs = None
            if journal is not None:
                runs = Runs(journal, runtime, app.entries, app.path, app.config.runs)
                log.info("background runs: %s", journal.url())
            frontend = Frontend(
                app.entries,
                runtime,
                title=app.path.name,
                limits=limits,
                export=export,
                model_aliases=model_aliases,
                records=records,
                admission=app.config.admission,
                runs=runs,
                cors=Cors(cors_origins) if cors_origins else None,
            )
            await _start_beside(frontend, tg, shared_metrics)
            sock = _listen(host, port, reuse_port)
            stop = anyio.Event()

            def ready(_: object) -> None:
                _settle_memory()
                where = f"{_url(sock)} with {server}/{backend}"
                log.info("serving %s (%s) on %s", app.path, ", ".join(app.entries), where)
                on_ready(_url(sock), runtime.unreachable())

            async def stopped(_: anyio.abc.TaskGroup) -> None:
                stop.set()  # the server finishes its connections and returns

            await serve_until_signal(
                frontend,
                partial(run_server, frontend, sock, stop),
                grace=limits.grace,
                what="bls serve",
                noun="request(s)",
                on_ready=ready,
                stop=stopped,
            )
            tg.cancel_scope.cancel()  # (the runs were drained with the requests)
    if export is not None:
        export.close()
    if records is not None:
        log.info("recorded %d request(s) in %s%s", records.written, record_to, _unrecorded(records))
    log.info("stopped")
    return 0
