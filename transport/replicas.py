"""A remote stage: its replicas, which of them takes each call, and the calls that a
replica refused or lost before starting, tried again on another.

A :class:`RemoteBinding` is a :class:`bls.bindings.Binding` like any other: the script
layer cannot tell it from an inline one. Its replicas are :class:`.connection.Connection`
s, fixed addresses or those registered in etcd (joining and leaving while it runs). The
first replica to answer gives the stage its types; a replica that serves another schema
is refused. A call goes to the live replica with the fewest calls outstanding; one that
replica refuses (overloaded, draining) or loses before it started is tried on the next.
A replica whose calls keep failing, or lag far behind its peers', is taken out of rotation
for a while (the stage's ``eject`` policy, :mod:`.ejection`). Hedged and retried calls
are :mod:`.attempts`'; a streaming call's items and credit are :mod:`.stream`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import msgspec

from bls import affinity
from bls.bindings import Binding
from bls.config import TransportConfig
from bls.counts import StageCounts
from bls.errors import ErrorKind, InvalidRequest, StageError
from bls.messages import Signature, type_name
from bls.policy import REQUEST_FAULTS, Policy, PolicyState
from bls.scope import NO_CONTEXT, CallContext
from bls.typenames import loaded_class

from . import attempts, ejection, wire
from .connection import LOST_STARTED, LOST_UNSTARTED, Connection, Inbox, adopt_spans, serves
from .stream import RemoteStream
from .wire import ErrorInfo, Kind, WorkerInfo

__all__ = ["RemoteBinding", "remote_binding"]

log = logging.getLogger("bls.transport")

_RETRYABLE = (
    ErrorKind.OVERLOADED,
    ErrorKind.UNAVAILABLE,
)  # kinds a worker uses to refuse before starting


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
        self._rotation = 0
        self.state = PolicyState()  # what its policy keeps: latencies, budget, counts

    def set_policy(self, policy: Policy) -> None:
        super().set_policy(policy)
        self.state = PolicyState(policy)

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
            conn.vet = self._admit
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
        tg.start_soon(ejection.watch, self)  # calls still running far past their peers'
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
            if serves(other) != serves(first):
                raise OSError(
                    f"stage {self.name!r}: replicas disagree: one serves "
                    f"{first.request_type or first.request_schema} -> "
                    f"{first.response_type or first.response_schema}, another "
                    f"{other.request_type or other.request_schema} -> "
                    f"{other.response_type or other.response_schema}"
                )
        self._admit(first)
        for conn in self.connections:
            conn.vet = self._admit  # replicas that answer from now on

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

    def _admit(self, info: WorkerInfo) -> str:
        """Take a replica whose hello came (or refuse it, saying why): the first one gives
        the stage its types; the others must serve the same schema."""
        if self._served is not None:
            if serves(info) != self._served:
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
            # The classes the worker names, if the caller has loaded their modules.
            request=loaded_class(info.request_type),
            response=loaded_class(info.response_type),
            streaming=info.streaming,
        )
        self.request_schema = info.request_schema
        self.response_schema = info.response_schema
        self._served = serves(info)

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
            conn.vet = self._admit
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

    def counts(self) -> StageCounts:
        return StageCounts(traffic={"": self.state.counts})

    def models(self) -> list[str]:
        infos = (c.info for c in self.connections if c.info is not None and c.alive)
        return list(dict.fromkeys(name for info in infos for name in info.models))

    def expect(self, tp: Any) -> None:
        super().expect(tp)
        self._result = wire.Codec(tp)

    # -- calls ------------------------------------------------------------------------

    def _pick(self, tried: Sequence[Connection], key: bytes | None = None) -> Connection | None:
        """The live replica not in ``tried`` with the fewest calls outstanding (in
        rotation among equals), or, for a call with an affinity ``key``, the one the key
        places on (:func:`bls.affinity.place`); an ejected one only when no other is left."""
        best: Connection | None = None
        ejected: Connection | None = None
        now = time.monotonic()
        n = len(self.connections)
        if not tried:  # a call's first pick (not its retry's, nor a hedge's copy)
            self._rotation += 1
        placing = self.policy.affinity if key is not None else None
        ready: list[Connection] = []  # (in rotation, for placing by key)
        for i in range(n):
            conn = self.connections[(self._rotation + i) % n]
            if not conn.alive or conn.retired or conn in tried:
                continue
            if not ejection.in_rotation(conn, now):
                ejected = ejected or conn
            elif placing is not None:
                ready.append(conn)
            elif best is None or len(conn.calls) < len(best.calls):
                best = conn
        if placing is not None and key is not None:
            outstanding = sum(len(c.calls) for c in self.connections)
            best = affinity.place(key, ready, placing.balance, outstanding)
        return best or ejected

    def _unavailable(self) -> StageError:
        states = "; ".join(f"{c.address}: {c.reason or 'busy'}" for c in self.connections)
        return StageError(
            self.name, ErrorKind.UNAVAILABLE, f"no replica can take the call ({states})"
        )

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
                ErrorKind.TOO_LARGE,
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
            expected = type_name(self.result_type)
            raise StageError(
                self.name, ErrorKind.INVALID_RESPONSE, f"result does not match {expected}: {exc}"
            ) from None

    async def start_call(
        self,
        body: list[Any],
        credit: int,
        ctx: CallContext,
        busy: list[Connection] | None = None,
    ) -> tuple[Connection, Inbox, int, Any]:
        """Start the call on some replica and wait for its first frame, retrying calls
        that a replica refused or lost before starting them. ``ctx`` gives the deadline
        and trace the call carries, and the span that records it. ``busy``: replicas
        other copies of the call are on (a hedge's), avoided while others are left; the
        one chosen is added."""
        deadline = ctx.wire_deadline
        span = ctx.span if ctx.trace is not None else None
        trace = ctx.trace.id if ctx.trace is not None else ""
        tried: list[Connection] = []
        refusal: Exception | None = None
        while True:
            conn = self._pick(tried + busy, ctx.key) if busy else self._pick(tried, ctx.key)
            if conn is None and busy:
                conn = self._pick(tried, ctx.key)
            if conn is None:
                raise refusal or self._unavailable()
            if busy is not None:
                busy.append(conn)
            call = conn.send_call(self.name, body, deadline, credit, trace, ctx.priority)
            if span is not None:
                span.replica = conn.address
            try:
                kind, rest = await call.get()
            except BaseException as exc:
                conn.end_call(call, ctx)
                if isinstance(exc, anyio.get_cancelled_exc_class()):
                    ejection.cut(self, conn, call, ctx.deadline)
                raise
            if kind == LOST_UNSTARTED:
                conn.end_call(call)
                tried.append(conn)
                ejection.outcome(self, conn, failed=True)
                continue
            if kind == LOST_STARTED:
                conn.end_call(call)
                ejection.outcome(self, conn, failed=True)
                raise StageError(
                    self.name,
                    ErrorKind.UNAVAILABLE,
                    f"the worker at {conn.address} was lost mid-call: {rest}",
                )
            if kind == Kind.ERROR:
                conn.end_call(call)
                info = wire.decode_error(rest[0])
                ejection.outcome(self, conn, failed=info.kind not in REQUEST_FAULTS)
                if info.kind in _RETRYABLE:
                    tried.append(conn)
                    refusal = self.error(info, conn)
                    continue
                adopt_spans(call, ctx)
                raise self.error(info, conn)
            if span is not None:
                span.bytes_out += wire.frame_sizes(body)
            ejection.took(self, conn, call)  # (a unary call's whole; a stream's first item)
            if kind == Kind.END:  # a unary call's answer (a stream's first item: not yet)
                ejection.outcome(self, conn, failed=False)
            return conn, call, kind, rest

    async def call(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        if not self.resolved:
            raise self._unavailable()
        if self.signature.streaming:
            return await Binding.call(self, req)
        body = self._request(req)
        if self.policy.affinity is not None:
            ctx = ctx.keyed(affinity.key_of(self.policy.affinity, req, ctx))
        if self.policy.repeats:
            rest = await attempts.call(self, body, ctx)
        else:
            rest = await self.answer(body, ctx)
        return self._decode(rest, self._result, ctx)

    async def answer(
        self, body: list[Any], ctx: CallContext, busy: list[Connection] | None = None
    ) -> Any:
        """One unary call, its answer's frames (not decoded); its latency noted."""
        started = time.monotonic()
        conn, call, _, rest = await self.start_call(body, 0, ctx, busy)
        conn.end_call(call)
        adopt_spans(call, ctx)
        self.state.latencies.add(time.monotonic() - started)
        return rest

    def decode_item(self, rest: Any, ctx: CallContext) -> Any:
        """A stream item (or result) as it came off the wire, in the expected type."""
        return self._decode(rest, self._result, ctx)

    async def invoke(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        return await self.call(req, ctx)  # decoded straight into the expected type

    def stream(self, req: Any, ctx: CallContext = NO_CONTEXT) -> AsyncIterator[Any]:
        if not self.resolved:
            raise self._unavailable()
        if not self.signature.streaming:
            return Binding.stream(self, req)
        if self.policy.affinity is not None:
            ctx = ctx.keyed(affinity.key_of(self.policy.affinity, req, ctx))
        return RemoteStream(self, self._request(req), ctx)


def remote_binding(
    name: str, target: str | Sequence[str], settings: TransportConfig | None
) -> RemoteBinding:
    """The binding for a remote target (the ``bls.schemes`` entry point): one or more
    addresses (a list, or comma-separated), or ``etcd:NAME`` (replicas registered in etcd
    under NAME)."""
    if isinstance(target, str) and target.startswith("etcd:"):
        return RemoteBinding.discovered(name, target[len("etcd:") :], settings)
    addresses = target.split(",") if isinstance(target, str) else list(target)
    return RemoteBinding(name, [a.strip() for a in addresses if a.strip()], settings=settings)
