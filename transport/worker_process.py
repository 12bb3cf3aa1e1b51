"""A ``bls worker`` process's life: set the stage up, serve it until SIGTERM or SIGINT
(registered in etcd when asked), drain, tear down, say what it served.

The order matters to callers: a worker withdraws from etcd before it drains (so callers
stop sending), keeps reading a moment after its last replies (so they reach their
callers), and lets libzmq flush what is queued before the process exits.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.abc
import msgspec
import zmq

from bls.bindings import Binding
from bls.config import TransportConfig
from bls.lifecycle import serve_until_signal
from bls.runtime import Runtime

from .keys import server_curve
from .worker_server import WorkerServer

__all__ = ["WorkerOptions", "run_worker"]

log = logging.getLogger("bls.worker")

SETTLE_S = 0.25  # after a drain, how long the socket stays open for the last replies


class WorkerOptions(msgspec.Struct, kw_only=True):
    """What ``bls worker``'s flags say about serving a stage."""

    stage: str
    strict_name: bool = False  # refuse callers that expect another stage name
    max_inflight: int = 256
    max_running: int | None = None  # calls run at once; the rest wait (default: all)
    max_inflight_per_caller: int | None = None
    grace: float = 10.0
    transport: TransportConfig = msgspec.field(default_factory=TransportConfig)
    curve_secret: str | None = None
    curve_allow: str | None = None
    register_at: str | None = None  # etcd://HOST:PORT to register in
    advertise: str | None = None  # the address registered (default: the bound one)
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None  # serve /metrics (load, for autoscaling) on this port


async def run_worker(
    binding: Binding,
    address: str,
    options: WorkerOptions,
    *,
    runtime: Runtime,
    on_ready: Callable[[str, list[str]], None] = lambda addr, _: print(f"ready {addr}", flush=True),
) -> int:
    """Set up, serve until SIGTERM/SIGINT, drain for ``options.grace`` s; exit status 0.
    ``on_ready(address, unreachable)`` is told the bound address and the stages (of a
    script served as a stage) not reachable yet."""
    with _zmq_context(options) as configure:
        async with runtime:
            await _set_up(binding, options.stage)
            server = _server(binding, address, options, configure)
            announced = _Announcement(options, server)
            stop_metrics = None
            if options.metrics_port is not None:
                from .worker_metrics import serve_metrics

                _, stop_metrics = serve_metrics(server, options.metrics_host, options.metrics_port)
            try:
                await serve_until_signal(
                    server,
                    announced.serve,
                    grace=options.grace,
                    what=f"stage {options.stage!r}",
                    noun="call(s)",
                    on_ready=lambda bound: on_ready(bound, runtime.unreachable()),
                    stop=_settle,
                    before_drain=announced.withdraw,
                )
            finally:
                if stop_metrics is not None:
                    stop_metrics()
                with anyio.CancelScope(shield=True):
                    await binding.aclose()
    stats = msgspec.json.encode(server.stats).decode()
    log.info("stage %r: stopped (%s)", options.stage, stats)
    return 0


def _server(
    binding: Binding,
    address: str,
    options: WorkerOptions,
    configure: Callable[[zmq.Socket[Any]], None],
) -> WorkerServer:
    return WorkerServer(
        binding,
        address,
        stage=options.stage,
        strict_name=options.strict_name,
        max_inflight=options.max_inflight,
        max_running=options.max_running,
        max_inflight_per_caller=options.max_inflight_per_caller,
        max_frame_bytes=options.transport.max_frame_bytes,
        heartbeat_s=options.transport.heartbeat_s,
        dead_after_s=options.transport.caller_dead_after_s,
        configure_socket=configure,
    )


@contextlib.contextmanager
def _zmq_context(options: WorkerOptions) -> Iterator[Callable[[zmq.Socket[Any]], None]]:
    """The process's ZeroMQ context, with CURVE when asked (yields what configures the
    worker's socket); on the way out, what is still queued goes out first."""
    ctx: zmq.Context[Any] = zmq.Context.instance()
    authenticator = None
    if options.curve_secret:
        from zmq.auth.thread import ThreadAuthenticator

        authenticator = ThreadAuthenticator(ctx)
        authenticator.start()
        allow = options.curve_allow or zmq.auth.CURVE_ALLOW_ANY
        authenticator.configure_curve(domain="*", location=allow)

    def configure(sock: zmq.Socket[Any]) -> None:
        if options.curve_secret:
            server_curve(sock, options.curve_secret)

    try:
        yield configure
    finally:
        if authenticator is not None:
            authenticator.stop()
        # The process exits next, and with it libzmq's threads: replies still queued in
        # closed sockets (a drain's last results) must go out first, within the linger.
        ctx.destroy(linger=1000)


async def _set_up(binding: Binding, stage: str) -> None:
    log.info("stage %r: setting up %s", stage, binding.description)
    started = time.monotonic()
    await binding.start()
    log.info("stage %r: set up in %.2fs", stage, time.monotonic() - started)


async def _settle(tg: anyio.abc.TaskGroup) -> None:
    """Stop serving, after reading a moment longer while the last replies reach their
    callers: closing a socket with unread input resets the TCP connection, and a reset
    can discard what the caller has not read yet."""
    await anyio.sleep(SETTLE_S)
    tg.cancel_scope.cancel()


class _Announcement:
    """The server, serving, and registered in etcd when the options say so."""

    def __init__(self, options: WorkerOptions, server: WorkerServer) -> None:
        self.options = options
        self.server = server
        self.registration: Any = None

    async def serve(self, *, task_status: anyio.abc.TaskStatus[str]) -> None:
        async with anyio.create_task_group() as tg:
            bound = await tg.start(self.server.serve)
            options = self.options
            if options.register_at:
                # Serving does not wait for etcd: it registers when it can.
                from .discovery import Etcd, Registration

                self.registration = Registration(
                    Etcd(options.register_at),
                    options.transport.namespace,
                    options.stage,
                    options.advertise or bound,
                    self.server.instance,
                )
                tg.start_soon(self.registration.run)
            task_status.started(bound)

    async def withdraw(self) -> None:
        """Leave etcd (before the drain, so callers stop sending)."""
        if self.registration is not None:
            await self.registration.withdraw()
            await self.registration.etcd.aclose()
