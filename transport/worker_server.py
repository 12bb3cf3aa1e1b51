"""The worker server: serves one stage on a ZeroMQ ROUTER socket (``bls worker``'s
process around it is :mod:`.worker_process`, a call's own life :mod:`.worker_calls`).

It reads frames, admits calls (limits, draining, a caller's wrong ``to``) and runs each
on a lane (a reusable task). Calls are acknowledged to the caller (``Header.ack`` on
every frame, or a coalesced ACK) so that a caller whose worker dies knows which calls may
be retried elsewhere (never started) and which must fail (started). Callers that fall
silent or stop reading are given up on, and their calls cancelled.
"""

from __future__ import annotations

import collections
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import msgspec
import zmq

from bls.bindings import Binding
from bls.errors import ErrorKind, StageError
from bls.lifecycle import Drain
from bls.messages import json_schema
from bls.scope import Reason
from bls.tracing import Trace
from bls.typenames import class_path

from . import wire
from .sockets import AsyncSocket
from .wire import Header, Kind, WorkerInfo
from .worker_callers import Caller, Callers
from .worker_calls import CallRunner, CallState, WorkerStats, undecodable
from .worker_queue import CallQueue, Lanes

__all__ = ["WorkerServer", "WorkerStats"]

log = logging.getLogger("bls.worker")

DEFAULT_CREDIT = 16
# Messages queued for one caller that is not reading them; past this the caller is
# presumed gone, its calls are cancelled and what is sent to it is dropped.
SEND_QUEUE = 10_000
BUSY_WINDOW_S = 10.0  # the busy fraction a worker reports is over this long


class WorkerServer:
    """Serves ``binding`` (already set up) on ``address`` until cancelled.

    ``stage`` is the name advertised; when ``strict_name`` is set, callers that expect
    another name are refused at hello time.
    """

    def __init__(
        self,
        binding: Binding,
        address: str,
        *,
        stage: str,
        strict_name: bool = False,
        max_inflight: int = 256,
        max_running: int | None = None,
        max_inflight_per_caller: int | None = None,
        max_frame_bytes: int = 256 * 1024 * 1024,
        heartbeat_s: float = 0.25,
        dead_after_s: float = 15.0,
        configure_socket: Callable[[zmq.Socket[Any]], None] | None = None,
    ) -> None:
        self.binding = binding
        self.address = address
        self.stage = stage
        self.strict_name = strict_name
        self.max_inflight = max_inflight
        # Calls run at once; the rest of max_inflight wait, highest priority first.
        self.max_running = min(max_running or max_inflight, max_inflight)
        self.max_per_caller = max_inflight_per_caller or max_inflight
        self.max_frame_bytes = max_frame_bytes
        self.heartbeat_s = heartbeat_s
        self.dead_after_s = dead_after_s
        self.stats = WorkerStats()
        self.instance = secrets.token_hex(8)
        self._configure = configure_socket
        self._ctx: zmq.Context[Any] = zmq.Context.instance()
        self._calls: dict[tuple[bytes, int], CallState] = {}
        self._drain = Drain(self._calls)
        self._callers = Callers(self, stage, heartbeat_s, dead_after_s)
        self._sock: AsyncSocket | None = None
        # How busy it is (--metrics-port): seconds with a call in flight, and samples of
        # that total over the last BUSY_WINDOW_S, taken with each heartbeat tick.
        self._busy_total = 0.0
        self._busy_since = 0.0
        self.busy_samples: collections.deque[tuple[float, float]] = collections.deque(
            maxlen=max(2, int(BUSY_WINDOW_S / heartbeat_s) + 1)
        )
        sig = binding.signature
        self._request = wire.Codec(sig.request)
        self._runner = CallRunner(binding, stage, self.stats, self)
        # Calls taken and not yet running wait in priority order, for a lane (.worker_queue).
        self._pending = CallQueue()
        self._lanes = Lanes(self._pending, self._runner.run, self.max_running)
        self._info = WorkerInfo(
            protocol=wire.PROTOCOL,
            stage=stage,
            streaming=sig.streaming,
            request_schema=json_schema(sig.request),
            response_schema=json_schema(sig.response),
            request_type=class_path(sig.request),
            response_type=class_path(sig.response),
            instance=self.instance,
            max_inflight=max_inflight,
            models=binding.models(),
        )
        self._heartbeat = wire.encode_heartbeat(self.instance)

    @property
    def inflight(self) -> int:
        return len(self._calls)

    @property
    def queued(self) -> int:
        """Calls taken and not yet started on a lane."""
        return len(self._pending)

    def busy_seconds(self) -> float:
        """Seconds so far with at least one call in flight."""
        if self._calls:
            return self._busy_total + time.monotonic() - self._busy_since
        return self._busy_total

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Bind, report the bound address through ``task_status``, serve until cancelled."""
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        # A send to a caller that is gone or not reading fails at once (it is not queued
        # without bound): see _unroutable.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_frame_bytes)
        sock.setsockopt(zmq.SNDHWM, SEND_QUEUE)
        sock.setsockopt(zmq.RCVHWM, SEND_QUEUE)
        if self._configure is not None:
            self._configure(sock)
        try:
            sock.bind(self.address)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise OSError(f"cannot listen on {self.address}: {exc}") from None
        bound = self.address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._runner.replica = bound
        self._sock = AsyncSocket(sock, self._on_message, unroutable=self._unroutable)
        try:
            async with anyio.create_task_group() as tg:
                self._lanes.tg = tg
                tg.start_soon(self._sock.run)
                tg.start_soon(self._sock.watch, self._stalled)
                tg.start_soon(self._callers.watch)
                tg.start_soon(self._callers.acknowledge)
                task_status.started(bound)
        finally:
            # After a drain, replies just queued must still reach their callers.
            self._sock.close(linger_ms=1000 if self.draining else 0)

    async def drain(self, grace: float) -> bool:
        """Refuse new calls and wait up to ``grace`` s for in-flight ones; True if all ended."""

        def cancel_rest() -> None:
            for state in list(self._calls.values()):
                if state.cut(Reason.DRAIN):
                    continue
                if self._pending.remove(state):
                    self.stats.cancelled += 1
                    why = "the worker shut down before the call started"
                    self._end_waiting(state, ErrorKind.SHUTDOWN, why)

        return await self._drain.drain(grace, cancel_rest)

    @property
    def draining(self) -> bool:
        return self._drain.draining

    def _stalled(self) -> None:
        self.stats.read_stalls += 1

    # -- sending ----------------------------------------------------------------------

    def _send(
        self,
        client: bytes,
        kind: int,
        call_id: int,
        body: list[Any] | None = None,
        count: int = 0,
        spans: bytes = b"",
    ) -> None:
        assert self._sock is not None
        peer = self._callers.known.get(client)
        ack = 0
        if peer is not None:
            ack = peer.acked = peer.seen
        header = Header(kind=kind, call=call_id, count=count, ack=ack, spans=spans)
        self._sock.send([client, wire.encode_header(header), *(body or (b"",))])

    def _send_error(self, client: bytes, call_id: int, err: StageError) -> None:
        """An ERROR frame for a call that was never taken (refused, undecodable)."""
        info = wire.error_info(err)
        self._send(client, Kind.ERROR, call_id, [wire.encode_error(info)])

    # Replies: how the calls that run (.worker_calls) answer.

    def data(self, state: CallState, body: list[Any]) -> None:
        self._send(state.client, Kind.DATA, state.id, body)

    def final(self, state: CallState, kind: int, body: list[Any] | None = None) -> None:
        """A call's final frame, with its spans when the caller traces it."""
        spans = b""
        if state.trace is not None:
            spans = wire.encode_spans(state.trace.spans)
        self._send(state.client, kind, state.id, body, spans=spans)

    def ended(self, state: CallState) -> None:
        del self._calls[state.key]
        if not self._calls:
            self._busy_total += time.monotonic() - self._busy_since
        peer = self._callers.known.get(state.client)
        if peer is not None:
            peer.inflight -= 1
        self._drain.left()

    def _reject(self, client: bytes, call_id: int, kind: str, message: str) -> None:
        self.stats.rejected += 1
        self._send_error(client, call_id, StageError(self.stage, kind, message))

    # -- receiving --------------------------------------------------------------------

    def _on_message(self, frames: list[Any]) -> None:
        """Dispatch one message. Never raises: a bad frame is dropped and counted."""
        try:
            self._dispatch(frames)
        except Exception:
            self.stats.dropped += 1
            log.debug("dropped a frame that could not be handled", exc_info=True)

    def _dispatch(self, frames: list[Any]) -> None:
        if len(frames) < 3:
            self.stats.dropped += 1
            return
        client = frames[0].bytes
        parsed = wire.parse(frames[1:])
        if parsed is None:
            self.stats.dropped += 1
            return
        header, rest = parsed
        problem = wire.invalid(header)
        if problem:
            self.stats.dropped += 1
            if header.kind == Kind.CALL and 0 < header.call < 2**63:
                self._send_error(
                    client, header.call, StageError(self.stage, ErrorKind.BAD_FRAME, problem)
                )
            return
        peer = self._callers.heard(client)
        kind = header.kind
        if kind == Kind.CALL:
            self._on_call(client, peer, header, rest)
        elif kind == Kind.CANCEL:
            self._on_cancel(client, header)
        elif kind == Kind.CREDIT:
            state = self._calls.get((client, header.call))
            if state is None or header.count <= 0:
                self.stats.dropped += 1
                return
            state.credit = min(state.credit + header.count, wire.MAX_CREDIT)
            if state.wake is not None:
                state.wake.set()
        elif kind == Kind.HEARTBEAT:
            self._send(client, Kind.HEARTBEAT, 0, [self._heartbeat])
        elif kind == Kind.HELLO:
            self._on_hello(peer, client, rest)
        else:
            self.stats.dropped += 1

    def _on_hello(self, peer: Caller, client: bytes, rest: Any) -> None:
        """Answer a caller's hello with what this worker serves, or why it refuses the
        caller; a refused caller's calls are refused from then on (until a hello of it
        is taken)."""
        try:
            hello = wire.decode_hello(rest[0])
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.stats.dropped += 1
            return
        refused = ""
        if hello.protocol != wire.PROTOCOL:
            refused = (
                f"protocol mismatch: the worker speaks bls wire protocol {wire.PROTOCOL}, "
                f"the caller {hello.protocol}"
            )
        elif self.strict_name and hello.stage and hello.stage != self.stage:
            refused = f"this worker serves stage {self.stage!r}, not {hello.stage!r}"
        peer.refused = refused
        info = msgspec.structs.replace(self._info, error=refused) if refused else self._info
        self._send(client, Kind.HELLO, 0, [wire.encode_info(info)])

    def _on_call(self, client: bytes, peer: Caller, header: Header, rest: Any) -> None:
        call_id = header.call
        if (client, call_id) in self._calls:
            # A duplicate of a call still running (whatever this peer's record says:
            # a caller given up on and heard from again starts a new one).
            self.stats.dropped += 1
            return
        self._callers.called(peer, call_id)
        self.stats.calls += 1
        refused = self._refusal(peer, header, rest)
        if refused is not None:
            self._reject(client, call_id, *refused)
            return
        try:
            req = self._request.decode(rest[0], rest[1:])
        except Exception as exc:  # whatever the bytes were, the caller gets an answer
            self.stats.failed += 1
            self._send_error(client, call_id, undecodable(self.stage, exc))
            return
        self._start(client, peer, header, req)

    def _refusal(self, peer: Caller, header: Header, rest: Any) -> tuple[str, str] | None:
        """Why a new call is refused before it starts, as (error kind, message); None
        when it is taken. At the in-flight limit, a waiting call of lower priority may be
        refused in its place (:meth:`_displace`) to make room for it."""
        if peer.refused:
            return ErrorKind.UNAVAILABLE, f"the worker refused this caller: {peer.refused}"
        if header.to != self.instance:
            # Sent to an earlier process at this address: never started, safe to retry.
            return ErrorKind.UNAVAILABLE, "the worker restarted; call not started"
        if self.draining:
            return ErrorKind.UNAVAILABLE, "the worker is shutting down"
        if len(self._calls) >= self.max_inflight and not self._displace(header.priority):
            return (
                ErrorKind.OVERLOADED,
                f"the worker is at its limit of {self.max_inflight} calls in flight",
            )
        if peer.inflight >= self.max_per_caller:
            limit = self.max_per_caller
            return ErrorKind.OVERLOADED, f"this caller is at its limit of {limit} calls in flight"
        if wire.frame_sizes(rest) > self.max_frame_bytes:
            self.stats.too_large += 1
            return ErrorKind.TOO_LARGE, "the request is over the frame limit"
        return None

    def _start(self, client: bytes, peer: Caller, header: Header, req: Any) -> None:
        """Take a decoded call: it waits for a lane, and a lane starts if none is idle."""
        state = CallState(
            client,
            header.call,
            header.count or DEFAULT_CREDIT,
            req,
            header.deadline,
            header.priority,
        )
        peer.inflight += 1
        if header.trace:
            state.trace = Trace(header.trace, self.stage)
        if not self._calls:
            self._busy_since = time.monotonic()
        self._calls[state.key] = state
        self._lanes.take(state)

    def _on_cancel(self, client: bytes, header: Header) -> None:
        state = self._calls.get((client, header.call))
        if state is None:
            self.stats.dropped += 1
            return
        if state.cut(Reason.CALLER_CANCELLED):
            return
        if self._pending.remove(state):  # waiting for a lane: answered now
            self.stats.cancelled += 1
            self._end_waiting(state, ErrorKind.CANCELLED, "cancelled by the caller")

    def _displace(self, priority: int) -> bool:
        """Every place is held: refuse the waiting call that would start last, if its
        priority is below ``priority``, to make room; False if none is."""
        state = self._pending.displace(priority)
        if state is None:
            return False
        self.stats.rejected += 1
        why = "displaced by a call of higher priority while the worker was at its limit"
        self._end_waiting(state, ErrorKind.OVERLOADED, why)
        return True

    def _end_waiting(self, state: CallState, kind: str, why: str) -> None:
        """End a call that never started: its final frame, and forget it."""
        info = wire.error_info(StageError(self.stage, kind, why))
        self.final(state, Kind.ERROR, [wire.encode_error(info)])
        self.ended(state)

    # -- its callers (.worker_callers) ---------------------------------------------------

    def send_to(self, client: bytes, kind: int) -> None:
        self._send(client, kind, 0)

    def sample_busy(self, now: float) -> None:
        self.busy_samples.append((now, self.busy_seconds()))

    def _unroutable(self, client: bytes) -> None:
        """A send to ``client`` failed: it is gone, or it stopped reading and its queue is
        full. Nothing more can reach it: cancel its calls and forget it."""
        self.stats.dropped += 1
        if client in self._callers.known:
            self.give_up(client, "the caller stopped reading its replies")

    def give_up(self, client: bytes, why: str) -> None:
        orphans = [s for s in self._calls.values() if s.client == client]
        for state in orphans:
            state.lost = why
            if state.cut(Reason.CALLER_LOST):
                continue
            if self._pending.remove(state):  # nobody to answer
                self.stats.cancelled += 1
                self.ended(state)
        self._callers.forget(client, why, len(orphans))
