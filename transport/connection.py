"""One replica of a remote stage: a DEALER socket to a ``bls worker`` and what keeps it
honest.

A :class:`Connection` has its own socket, a reader, a monitor socket (a dead peer is
noticed the moment its TCP/IPC connection drops), heartbeats (a hung peer is noticed
after ``dead_after_s``) and the worker's hello (its types, its instance). Each call made
on it has an :class:`Inbox` its frames arrive in; a lost connection tells each
waiting call whether its worker had started it (:data:`LOST_STARTED`) or not
(:data:`LOST_UNSTARTED`, safe to retry elsewhere). Choosing among replicas is
:mod:`.replicas`' business.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import msgspec
import zmq
from zmq.utils.monitor import parse_monitor_message

from bls import loop
from bls.config import TransportConfig
from bls.messages import shape
from bls.scope import NO_CONTEXT, CallContext

from . import wire
from .ejection import Health
from .keys import client_curve
from .liveness import ticks
from .sockets import AsyncSocket
from .wire import Header, Hello, Kind, WorkerInfo

__all__ = ["LOST_STARTED", "LOST_UNSTARTED", "Connection", "Inbox", "adopt_spans", "serves"]

log = logging.getLogger("bls.transport")

_CANCELLED_TRACES_MAX = 1024  # acknowledgements a lost worker never sends are forgotten

# Pseudo-kinds delivered to waiting calls when their connection is lost.
LOST_UNSTARTED = -1  # the worker never acknowledged the call: safe to retry elsewhere
LOST_STARTED = -2  # the worker had the call: it must not be re-run

_MONITOR_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)

_monitors = 0  # monitor sockets made so far (each needs an endpoint of its own)


class Inbox:
    """One call's inbox: frames for it, in order, as the reader delivers them; when it
    was sent, and whether its time was sampled for its replica's health (.ejection)."""

    __slots__ = ("backend", "done", "id", "items", "sampled", "sent", "spans", "waiter")

    def __init__(self, call_id: int, backend: loop.Backend) -> None:
        self.id = call_id
        self.sent = time.monotonic()
        self.sampled = False
        self.items: collections.deque[tuple[int, Any]] = collections.deque()
        self.backend = backend
        self.waiter: loop.Waiter | None = None
        self.done = False
        self.spans = b""  # what a traced call's worker recorded, from its final frame

    def put(self, kind: int, rest: Any) -> None:
        self.items.append((kind, rest))
        if self.waiter is not None:
            self.waiter.wake()

    async def get(self) -> tuple[int, Any]:
        while not self.items:
            self.waiter = self.backend.waiter()
            await self.waiter.wait()
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
        self.calls: dict[int, Inbox] = {}
        self.health = Health()  # its standing for outlier ejection (.ejection's alone)
        self.acked = 0
        self.last_heard = 0.0
        # Cancelled traced calls: call id -> (trace, span) their worker's spans belong to.
        self._cancelled_traces: dict[int, tuple[Any, int]] = {}
        self._next_id = 0
        self._connected = False
        self._sock: AsyncSocket | None = None
        self._backend: loop.Backend | None = None  # the loop's, once it runs
        self._hello_done: anyio.Event = anyio.Event()
        self._hello_error = ""
        self._handshake_error = ""
        # The binding's check of a replica that first answers after start-up: returns
        # why it is refused ("" to take it).
        self.vet: Callable[[WorkerInfo], str] | None = None
        # Left discovery: no new calls; closed once the calls in flight have ended.
        self.retired = False
        self.scope: anyio.CancelScope | None = None

    @property
    def load(self) -> int:
        """Its calls outstanding (what :func:`bls.affinity.place` balances)."""
        return len(self.calls)

    def close_when_idle(self) -> None:
        if self.retired and not self.calls and self.scope is not None:
            self.scope.cancel()

    # -- life cycle -------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        self._backend = loop.backend()
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
        priority: int = 0,
    ) -> None:
        assert self._sock is not None
        header = Header(
            kind=kind,
            call=call_id,
            stage=stage,
            deadline=deadline,
            count=count,
            to=to,
            trace=trace,
            priority=priority,
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
                call.put(LOST_STARTED if call.id <= self.acked else LOST_UNSTARTED, reason)
        if self._sock is not None:
            self._sock.drop_backlog(lambda frames: False)

    # -- calls ------------------------------------------------------------------------

    def send_call(
        self,
        stage: str,
        body: Sequence[Any],
        deadline: float,
        credit: int = 0,
        trace: str = "",
        priority: int = 0,
    ) -> Inbox:
        assert self.info is not None and self._backend is not None
        self._next_id += 1
        call = Inbox(self._next_id, self._backend)
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
            priority=priority,
        )
        return call

    def end_call(self, call: Inbox, ctx: CallContext = NO_CONTEXT) -> None:
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

    def grant(self, call: Inbox, count: int) -> None:
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
                    ctx[0].adopt(wire.decode_spans(header.spans), ctx[1])
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
            self.reason = f"refused: {info.error}"
            log.error("stage %r: %s refused this caller: %s", self.stage, self.address, info.error)
        elif self.info is not None and serves(info) != serves(self.info):
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
                self._sock.pump()
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


def serves(info: WorkerInfo) -> tuple[bool, Any, Any]:
    """What a replica serves, for telling whether two serve the same stage."""
    return info.streaming, shape(info.request_schema), shape(info.response_schema)


def adopt_spans(call: Inbox, ctx: CallContext) -> None:
    """Hang the spans a traced call's worker reported under the call's own span."""
    if call.spans and ctx.trace is not None:
        ctx.trace.adopt(wire.decode_spans(call.spans), ctx.parent)
