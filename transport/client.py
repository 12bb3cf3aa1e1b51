"""The caller's side: remote bindings over DEALER sockets, one per replica.

A :class:`RemoteBinding` is a :class:`bls.bindings.Binding` like any other: the script layer
cannot tell it from an inline one. Each replica is a :class:`Connection` with its own
DEALER socket, a reader task, a monitor socket (a dead peer is noticed the moment its
TCP/IPC connection drops) and heartbeats (a hung peer is noticed after
``dead_after_s``). Calls go to the live replica with the fewest calls outstanding.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import msgspec
import sniffio
import zmq
from zmq.utils.monitor import parse_monitor_message

from bls.bindings import Binding
from bls.errors import InvalidRequest, StageError
from bls.messages import Signature, shape
from bls.scope import NO_CONTEXT, CallContext
from bls.tracing import decode_spans

from . import wire
from .keys import client_curve
from .liveness import ticks
from .settings import TransportConfig
from .sockets import AsyncSocket, park, unpark, until_unparked
from .wire import ErrorInfo, Header, Hello, Kind, WorkerInfo

__all__ = ["Connection", "RemoteBinding"]

log = logging.getLogger("bls.transport")

_CANCELLED_TRACES_MAX = 1024  # acknowledgements a lost worker never sends are forgotten
WINDOW = 128  # stream items a worker may send ahead of the consumer (the memory bound)

# Pseudo-kinds delivered to waiting calls when their connection is lost.
_LOST_UNSTARTED = -1  # the worker never acknowledged the call: safe to retry elsewhere
_LOST_STARTED = -2  # the worker had the call: it must not be re-run

_MONITOR_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)

_RETRYABLE = ("overloaded", "unavailable")  # kinds a worker uses to refuse before starting
_monitors = 0  # monitor sockets made so far (each needs an endpoint of its own)


class _Call:
    """One call's inbox: frames for it, in order, as the reader delivers them.

    The caller waits on :func:`~.sockets.park` (``loop`` None on trio).
    """

    __slots__ = ("done", "id", "items", "loop", "spans", "waiter")

    def __init__(self, call_id: int, loop: asyncio.AbstractEventLoop | None) -> None:
        self.id = call_id
        self.items: collections.deque[tuple[int, Any]] = collections.deque()
        self.loop = loop
        self.waiter: Any = None
        self.done = False
        self.spans = b""  # what a traced call's worker recorded, from its final frame

    def put(self, kind: int, rest: Any) -> None:
        self.items.append((kind, rest))
        if self.waiter is not None:
            unpark(self.waiter)

    async def get(self) -> tuple[int, Any]:
        while not self.items:
            self.waiter = park(self.loop)
            await until_unparked(self.waiter)
            self.waiter = None
        return self.items.popleft()


class Connection:
    """One replica: a DEALER socket to ``address`` with liveness tracking."""

    def __init__(self, address: str, stage: str, settings: TransportConfig) -> None:
        self.address = address
        self.stage = stage
        self.settings = settings
        self.info: WorkerInfo | None = None
        self.alive = False
        self.reason = "not connected yet"
        self.calls: dict[int, _Call] = {}
        self.acked = 0
        self.last_heard = 0.0
        # Cancelled traced calls: call id -> (trace, span) their worker's spans belong to.
        self._cancelled_traces: dict[int, tuple[Any, int]] = {}
        self._next_id = 0
        self._connected = False
        self._sock: AsyncSocket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # asyncio's, when it runs there
        self._hello_done: anyio.Event = anyio.Event()
        self._hello_error = ""
        self._handshake_error = ""
        # The binding's check of a replica that first answers after start-up: returns
        # why it is refused ("" to take it).
        self.vet: Callable[[WorkerInfo], str] | None = None
        # Left discovery: no new calls; closed once the calls in flight have ended.
        self.retired = False
        self.scope: anyio.CancelScope | None = None

    def close_when_idle(self) -> None:
        if self.retired and not self.calls and self.scope is not None:
            self.scope.cancel()

    # -- life cycle -------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        if sniffio.current_async_library() == "asyncio":
            self._loop = asyncio.get_running_loop()
        ctx: zmq.Context[Any] = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)  # never queue calls for a peer that is not there
        # Bounded queues both ways: past them, sends wait in the socket's backlog (which
        # the callers' own concurrency bounds) and a worker's replies in its own queue.
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        client_curve(sock, self.settings)
        # Our own unique endpoint: pyzmq's default is named after the fd, which is reused.
        global _monitors
        _monitors += 1
        endpoint = f"inproc://bls-monitor-{id(self):x}-{_monitors}"
        sock.monitor(endpoint, _MONITOR_EVENTS)
        monitor = ctx.socket(zmq.PAIR)
        monitor.connect(endpoint)
        try:
            sock.connect(self.address)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            monitor.close(linger=0)
            raise OSError(f"cannot connect to {self.address}: {exc}") from None
        self._sock = AsyncSocket(sock, self._on_message)
        watcher = AsyncSocket(monitor, self._on_monitor)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._sock.run)
                tg.start_soon(self._sock.watch)
                tg.start_soon(watcher.run)
                tg.start_soon(self._heartbeats)
                task_status.started()
        finally:
            self.alive = False  # closing on purpose: not worth a warning
            self._lost("the connection was closed")
            # Stop monitoring before the socket goes, as libzmq requires.
            sock.disable_monitor()
            watcher.close()
            self._sock.close()

    async def hello(self, timeout: float) -> WorkerInfo:
        """Wait for the worker's hello (sent on every handshake); OSError on time-out,
        saying what was seen of the address meanwhile."""
        with anyio.move_on_after(timeout):
            await self._hello_done.wait()
        if self._hello_error:
            raise OSError(self._hello_error)
        if self.info is None:
            if self._handshake_error:
                why = self._handshake_error
            elif self._connected:
                why = "connected, but no bls hello came back: is it a `bls worker`?"
            else:
                why = "nothing accepted the connection: is `bls worker` running there?"
            raise OSError(f"no answer from {self.address} within {timeout:g}s ({why})")
        return self.info

    def _send(
        self,
        kind: int,
        call_id: int = 0,
        body: Sequence[Any] = (b"",),
        *,
        stage: str = "",
        deadline: float = 0.0,
        count: int = 0,
        to: str = "",
        trace: str = "",
    ) -> None:
        assert self._sock is not None
        header = Header(
            kind=kind, call=call_id, stage=stage, deadline=deadline, count=count, to=to, trace=trace
        )
        self._sock.send([wire.encode_header(header), *body])

    def _send_hello(self) -> None:
        self._send(Kind.HELLO, body=[wire.encode_hello(Hello(wire.PROTOCOL, self.stage))])

    def _lost(self, reason: str) -> None:
        """The peer is gone: fail started calls, hand back unstarted ones for retry."""
        was_alive, self.alive = self.alive, False
        self.reason = reason
        if was_alive:
            log.warning("stage %r: lost %s: %s", self.stage, self.address, reason)
        for call in self.calls.values():
            if not call.done:
                call.put(_LOST_STARTED if call.id <= self.acked else _LOST_UNSTARTED, reason)
        if self._sock is not None:
            self._sock.drop_backlog(lambda frames: False)

    # -- calls ------------------------------------------------------------------------

    def start(
        self, stage: str, body: Sequence[Any], deadline: float, credit: int = 0, trace: str = ""
    ) -> _Call:
        assert self.info is not None
        self._next_id += 1
        call = _Call(self._next_id, self._loop)
        self.calls[call.id] = call
        self._send(
            Kind.CALL,
            call.id,
            body,
            stage=stage,
            deadline=deadline,
            count=credit,
            to=self.info.instance,
            trace=trace,
        )
        return call

    def finish(self, call: _Call, ctx: CallContext = NO_CONTEXT) -> None:
        """Forget a call; if no final frame came, tell the worker to cancel it."""
        self.calls.pop(call.id, None)
        self.close_when_idle()
        if not call.done:
            call.done = True
            if self.alive:
                self._send(Kind.CANCEL, call.id)
                if ctx.trace is not None:
                    # The worker's acknowledgement carries its spans: keep where they go.
                    self._cancelled_traces[call.id] = (ctx.trace, ctx.parent)
                    if len(self._cancelled_traces) > _CANCELLED_TRACES_MAX:
                        del self._cancelled_traces[next(iter(self._cancelled_traces))]

    def grant(self, call: _Call, count: int) -> None:
        if self.alive:
            self._send(Kind.CREDIT, call.id, count=count)

    # -- receiving --------------------------------------------------------------------

    def _on_message(self, frames: list[Any]) -> None:
        parsed = wire.parse(frames)
        if parsed is None or wire.invalid(parsed[0]):
            log.debug("stage %r: dropped a malformed frame from %s", self.stage, self.address)
            return
        header, rest = parsed
        self.last_heard = time.monotonic()
        if header.ack > self.acked:
            self.acked = header.ack
        kind = header.kind
        if kind in (Kind.DATA, Kind.END, Kind.ERROR):
            call = self.calls.get(header.call)
            if call is None or call.done:  # e.g. a cancel's acknowledgement
                ctx = self._cancelled_traces.pop(header.call, None)
                if ctx is not None and header.spans:
                    ctx[0].adopt(decode_spans(header.spans), ctx[1])
                return
            if kind != Kind.DATA:
                call.done = True
                call.spans = header.spans
            call.put(kind, rest)
        elif kind == Kind.HEARTBEAT:
            instance = wire.decode_heartbeat(rest[0])
            if self.info is not None and instance != self.info.instance:
                self._lost("the worker restarted")
                self._send_hello()
        elif kind == Kind.HELLO:
            self._on_hello(rest)

    def _on_hello(self, rest: Any) -> None:
        try:
            info = wire.decode_info(rest[0])
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        if info.error:
            self._hello_error = f"{self.address}: {info.error}"
        elif self.info is not None and _serves(info) != _serves(self.info):
            self._hello_error = f"{self.address} came back serving a different schema"
            log.error("stage %r: %s: refusing it", self.stage, self._hello_error)
        elif self.vet is not None and (refusal := self.vet(info)):
            self._hello_error = f"{self.address}: {refusal}"
            self.reason = f"refused: {refusal}"
            log.error("stage %r: refusing %s", self.stage, self._hello_error)
        else:
            if self.info is not None and info.instance != self.info.instance:
                log.warning("stage %r: %s restarted", self.stage, self.address)
            elif self.info is None and self.vet is not None:
                log.info("stage %r: %s answered: it takes calls now", self.stage, self.address)
            self.info = info
            self.alive = True
            self.reason = ""
            self.last_heard = time.monotonic()
        self._hello_done.set()

    def _on_monitor(self, frames: list[Any]) -> None:
        try:
            event = parse_monitor_message([f.bytes for f in frames])["event"]
        except Exception:
            return
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._connected = True
            self._handshake_error = ""
            self._send_hello()
        elif event == zmq.EVENT_DISCONNECTED:
            self._connected = False
            # What the worker sent before it went (a draining worker's last replies) may
            # still wait in the socket: take it before failing the calls it answers.
            if self._sock is not None:
                self._sock.drain()
            self._lost("the connection dropped")
        elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self._handshake_error = "the worker refused this caller's credentials (CURVE)"
        else:
            self._handshake_error = "the handshake failed (wrong CURVE settings?)"

    async def _heartbeats(self) -> None:
        hb, dead_after = self.settings.heartbeat_s, self.settings.dead_after_s
        async for stalled in ticks(hb, dead_after / 2):
            if not self._connected:
                continue
            self._send(Kind.HEARTBEAT)
            if stalled:  # we were not listening either: judge the worker from now on
                self.last_heard = time.monotonic()
            elif self.alive and time.monotonic() - self.last_heard > dead_after:
                self._lost(f"no heartbeat for {dead_after:g}s")
                self._send_hello()


def _resolve(path: str) -> Any:
    """The class a worker names, if the caller has already imported its module."""
    module_name, _, qual = path.partition(":")
    module = sys.modules.get(module_name)
    if not qual or module is None:
        return Any
    obj: Any = module
    for part in qual.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return Any
    return obj if isinstance(obj, type) else Any


def _serves(info: WorkerInfo) -> tuple[bool, Any, Any]:
    """What a replica serves, for telling whether two serve the same stage."""
    return info.streaming, shape(info.request_schema), shape(info.response_schema)


def _adopt(call: _Call, ctx: CallContext) -> None:
    """Hang the spans a traced call's worker reported under the call's own span."""
    if call.spans and ctx.trace is not None:
        ctx.trace.adopt(decode_spans(call.spans), ctx.parent)


class RemoteBinding(Binding):
    """A stage served by ``bls worker`` processes at ``addresses`` (replicas)."""

    def __init__(
        self,
        name: str,
        addresses: list[str],
        settings: TransportConfig | None = None,
        *,
        registered_as: str | None = None,
    ) -> None:
        if not addresses and registered_as is None:
            raise ValueError(f"stage {name!r}: no remote address given")
        self.name = name
        self.addresses = addresses
        self.registered_as = registered_as  # discovered in etcd under this stage name
        self.settings = settings or TransportConfig()
        if registered_as is not None:
            self.description = f"etcd:{registered_as}"
        else:
            self.description = "remote " + ",".join(addresses)
        self.signature = Signature(request=Any, response=Any, streaming=False)
        self.request_schema: dict[str, Any] = {}
        self.response_schema: dict[str, Any] = {}
        self._served: tuple[bool, Any, Any] | None = None  # what its replicas serve, once known
        self.connections: list[Connection] = []
        self._tg: anyio.abc.TaskGroup | None = None
        self._check: Callable[[], list[str]] | None = None  # the runtime's, for late replicas
        self._answered: anyio.Event | None = None  # some replica was taken (made in open)
        self._closers: list[Callable[[], Any]] = []
        self._codec = wire.Codec()
        self._result = wire.Codec()
        self._rr = 0

    @classmethod
    def discovered(
        cls, name: str, registered_as: str, settings: TransportConfig | None = None
    ) -> RemoteBinding:
        """A stage whose replicas are the workers registered in etcd as ``registered_as``
        (``[transport] discovery``): they join and leave while it runs."""
        return cls(name, [], settings, registered_as=registered_as)

    async def _run_connection(self, conn: Connection) -> None:
        with anyio.CancelScope() as conn.scope:
            await conn.run()
        if conn in self.connections:
            self.connections.remove(conn)

    def set_replicas(self, addresses: set[str]) -> None:
        """Make the replica set ``addresses``: connect to new ones; retire those gone (no
        new calls; closed once their calls in flight end, which fail over as ever if the
        worker dies)."""
        assert self._tg is not None
        known = {c.address: c for c in self.connections}
        for address in sorted(addresses - known.keys()):
            conn = Connection(address, self.name, self.settings)
            conn.vet = self._vet
            self.connections.append(conn)
            self._tg.start_soon(self._run_connection, conn)
            log.info("stage %r: replica %s joined", self.name, address)
        for address, conn in known.items():
            if address in addresses:
                conn.retired = False
            elif not conn.retired:
                conn.retired = True
                log.info("stage %r: replica %s left", self.name, address)
                conn.close_when_idle()

    async def open(self, tg: anyio.abc.TaskGroup | None = None) -> None:
        if self.connections or self._tg is not None:
            return
        if tg is None:
            raise RuntimeError("a remote binding needs the runtime's task group")
        self._tg = tg
        self._answered = anyio.Event()
        if self.registered_as is not None:
            await self._open_discovered(tg)
            return
        for address in self.addresses:
            conn = Connection(address, self.name, self.settings)
            await tg.start(conn.run)
            self.connections.append(conn)
        infos: list[WorkerInfo] = []
        failures: list[str] = []

        async def hello(conn: Connection) -> None:
            try:
                infos.append(await conn.hello(self.settings.connect_timeout_s))
            except OSError as exc:
                failures.append(str(exc))

        async with anyio.create_task_group() as hellos:
            for conn in self.connections:
                hellos.start_soon(hello, conn)
        if not infos:
            raise OSError(f"stage {self.name!r}: no replica answered: {'; '.join(failures)}")
        for failure in failures:
            log.warning("stage %r: %s (will keep trying)", self.name, failure)
        first = infos[0]
        for other in infos[1:]:
            if _serves(other) != _serves(first):
                raise OSError(
                    f"stage {self.name!r}: replicas disagree: one serves "
                    f"{first.request_type or first.request_schema} -> "
                    f"{first.response_type or first.response_schema}, another "
                    f"{other.request_type or other.request_schema} -> "
                    f"{other.response_type or other.response_schema}"
                )
        self._vet(first)
        for conn in self.connections:
            conn.vet = self._vet  # replicas that answer from now on

    async def _open_discovered(self, tg: anyio.abc.TaskGroup) -> None:
        from .discovery import Etcd, watch_replicas

        url = self.settings.discovery
        if not url:
            raise OSError(
                f"stage {self.name!r} is bound to etcd:{self.registered_as} but no etcd is "
                f"given: --discovery etcd://HOST:2379 (or [transport] discovery)"
            )
        try:
            etcd = Etcd(url)
        except ValueError as exc:
            raise OSError(str(exc)) from None
        namespace = self.settings.namespace
        assert self.registered_as is not None
        tg.start_soon(watch_replicas, etcd, namespace, self.registered_as, self.set_replicas)
        self._closers.append(etcd.aclose)
        wait = self.settings.connect_timeout_s
        assert self._answered is not None
        with anyio.move_on_after(wait):
            await self._answered.wait()
            return
        where = f"/{namespace}/stages/{self.registered_as}/ in etcd at {url}"
        found = ", ".join(c.address for c in self.connections) or "no worker registered"
        raise OSError(
            f"stage {self.name!r}: no replica answered within {wait:g}s ({where}: {found})"
        )

    def _vet(self, info: WorkerInfo) -> str:
        """Take a replica whose hello came (or refuse it, saying why): the first one gives
        the stage its types; the others must serve the same schema."""
        if self._served is not None:
            if _serves(info) != self._served:
                return "it serves another schema than the stage's other replicas"
            if self._answered is not None:
                self._answered.set()
            return ""
        self._take_types(info)
        problems = self._check() if self._check is not None else []
        if problems:
            self._served = None
            self.signature = Signature(request=Any, response=Any, streaming=False)
            self.request_schema, self.response_schema = {}, {}
            return "; ".join(problems)
        if self._answered is not None:
            self._answered.set()
        return ""

    def _take_types(self, info: WorkerInfo) -> None:
        """Take the types a replica serves as the stage's."""
        self.signature = Signature(
            request=_resolve(info.request_type),
            response=_resolve(info.response_type),
            streaming=info.streaming,
        )
        self.request_schema = info.request_schema
        self.response_schema = info.response_schema
        self._served = _serves(info)

    @property
    def resolved(self) -> bool:
        """Whether the stage's types are known (a replica answered)."""
        return self._served is not None

    def resolve_later(self, check: Callable[[], list[str]]) -> bool:
        """Start without a replica (none answered yet): the first that answers gives the
        stage its types, if ``check()`` (the runtime's type checks, run against them)
        finds no problem; otherwise it is refused and logged, and the next one is tried.
        Replicas that answer later must serve the same schema as the first."""
        self._check = check
        for conn in self.connections:
            conn.vet = self._vet
        return True

    async def aclose(self) -> None:
        for close in self._closers:
            with anyio.CancelScope(shield=True):
                await close()
        self._closers.clear()

    @property
    def schemas(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.request_schema, self.response_schema

    @property
    def type_labels(self) -> tuple[str, str]:
        info = next((c.info for c in self.connections if c.info is not None), None)
        if info is None:
            return "Any", "Any"

        def label(path: str, schema: dict[str, Any]) -> str:
            return path.replace(":", ".") if path else str(schema.get("type", "Any"))

        return (
            label(info.request_type, info.request_schema),
            label(info.response_type, info.response_schema),
        )

    def ready(self) -> bool:
        return any(c.alive and not c.retired for c in self.connections)

    def expect(self, tp: Any) -> None:
        super().expect(tp)
        self._result = wire.Codec(tp)

    # -- calls ------------------------------------------------------------------------

    def _pick(self, tried: list[Connection]) -> Connection | None:
        best: Connection | None = None
        n = len(self.connections)
        self._rr += 1
        for i in range(n):
            conn = self.connections[(self._rr + i) % n]
            if (
                conn.alive
                and not conn.retired
                and conn not in tried
                and (best is None or len(conn.calls) < len(best.calls))
            ):
                best = conn
        return best

    def _unavailable(self) -> StageError:
        states = "; ".join(f"{c.address}: {c.reason or 'busy'}" for c in self.connections)
        return StageError(self.name, "unavailable", f"no replica can take the call ({states})")

    def _request(self, req: Any) -> list[Any]:
        try:
            body = self._codec.encode(req)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            why = f"cannot send the request: {exc}"
            raise InvalidRequest(self.name, why, mismatch=True) from None
        size = wire.frame_sizes(body)
        if size > self.settings.max_frame_bytes:
            raise StageError(
                self.name,
                "too_large",
                f"the request is {size} bytes, over the {self.settings.max_frame_bytes}-byte limit",
            )
        return body

    def error(self, info: ErrorInfo, conn: Connection) -> Exception:
        return wire.error_from(info, self.name, conn.info.stage if conn.info else self.name)

    def _decode(self, rest: Any, codec: wire.Codec, ctx: CallContext) -> Any:
        if ctx.span is not None:
            ctx.span.bytes_in += wire.frame_sizes(rest)
        try:
            return codec.decode(rest[0], rest[1:])
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
            raise StageError(
                self.name, "invalid_response", f"result does not match the expected type: {exc}"
            ) from None

    async def _first(
        self, body: list[Any], credit: int, ctx: CallContext
    ) -> tuple[Connection, _Call, int, Any]:
        """Start the call on some replica and wait for its first frame, retrying calls
        that a replica refused or lost before starting them. ``ctx`` gives the deadline
        and trace the call carries, and the span that records it."""
        deadline = ctx.wire_deadline
        span = ctx.span if ctx.trace is not None else None
        trace = ctx.trace.id if ctx.trace is not None else ""
        tried: list[Connection] = []
        refusal: Exception | None = None
        while True:
            conn = self._pick(tried)
            if conn is None:
                raise refusal or self._unavailable()
            call = conn.start(self.name, body, deadline, credit, trace)
            if span is not None:
                span.replica = conn.address
            try:
                kind, rest = await call.get()
            except BaseException:
                conn.finish(call, ctx)
                raise
            if kind == _LOST_UNSTARTED:
                conn.finish(call)
                tried.append(conn)
                continue
            if kind == _LOST_STARTED:
                conn.finish(call)
                raise StageError(
                    self.name,
                    "unavailable",
                    f"the worker at {conn.address} was lost mid-call: {rest}",
                )
            if kind == Kind.ERROR:
                conn.finish(call)
                info = wire.decode_error(rest[0])
                if info.kind in _RETRYABLE:
                    tried.append(conn)
                    refusal = self.error(info, conn)
                    continue
                _adopt(call, ctx)
                raise self.error(info, conn)
            if span is not None:
                span.bytes_out += wire.frame_sizes(body)
            return conn, call, kind, rest

    async def call(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        if not self.resolved:
            raise self._unavailable()
        if self.signature.streaming:
            return await Binding.call(self, req)
        conn, call, _, rest = await self._first(self._request(req), 0, ctx)
        conn.finish(call)
        _adopt(call, ctx)
        return self._decode(rest, self._result, ctx)

    async def invoke(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        return await self.call(req, ctx)  # decoded straight into the expected type

    def stream(self, req: Any, ctx: CallContext = NO_CONTEXT) -> AsyncIterator[Any]:
        if not self.resolved:
            raise self._unavailable()
        if not self.signature.streaming:
            return Binding.stream(self, req)
        return _RemoteStream(self, self._request(req), ctx)


class _RemoteStream:
    """Items of one remote streaming call, with credit-based flow control."""

    __slots__ = ("_binding", "_body", "_call", "_conn", "_ctx", "_finished", "_unacked")

    def __init__(self, binding: RemoteBinding, body: list[Any], ctx: CallContext) -> None:
        self._binding = binding
        self._body = body
        self._ctx = ctx
        self._conn: Connection | None = None
        self._call: _Call | None = None
        self._finished = False
        self._unacked = 0

    def __aiter__(self) -> _RemoteStream:
        return self

    async def __anext__(self) -> Any:
        if self._finished:
            raise StopAsyncIteration
        try:
            if self._call is None:
                self._conn, self._call, kind, rest = await self._binding._first(
                    self._body, WINDOW, self._ctx
                )
            else:
                kind, rest = await self._call.get()
        except BaseException:
            self._close()
            raise
        assert self._conn is not None and self._call is not None
        if kind == Kind.DATA:
            self._unacked += 1
            if self._unacked >= WINDOW // 2:
                self._conn.grant(self._call, self._unacked)
                self._unacked = 0
            try:
                return self._binding._decode(rest, self._binding._result, self._ctx)
            except BaseException:
                self._close()
                raise
        self._close()
        _adopt(self._call, self._ctx)
        if kind == Kind.END:
            raise StopAsyncIteration
        if kind == Kind.ERROR:
            raise self._binding.error(wire.decode_error(rest[0]), self._conn)
        raise StageError(
            self._binding.name,
            "unavailable",
            f"the worker at {self._conn.address} was lost mid-stream: {rest}",
        )

    def _close(self) -> None:
        self._finished = True
        if self._conn is not None and self._call is not None:
            self._conn.finish(self._call, self._ctx)

    async def aclose(self) -> None:
        self._close()

    def __del__(self) -> None:
        # A loop left with `break` drops the iterator: cancel the remote call now.
        if not self._finished:
            self._close()
