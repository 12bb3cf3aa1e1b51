"""The runtime: the bindings in force, the stage types declared, and request scopes.

A :class:`Runtime` is entered once per process (``bls run``/``serve``/``worker`` do it)
or by a library user (``async with bls.Runtime({...})``). While it is entered, every
``stage()`` call in that task and the tasks it spawns resolves through it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping
from contextlib import AsyncExitStack, aclosing, asynccontextmanager
from functools import partial
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from .bindings import Binding
from .check import StageUse, declare, type_problems, use_problems
from .entry import Script
from .errors import DeadlineExceeded, StageNotBound
from .messages import Signature
from .policy import Policy
from .record_binding import noted_items
from .scope import (
    CallContext,
    OpenStreams,
    RequestScope,
    enter,
    leave,
    traced_call,
)
from .scope import current as current_context
from .stage_stream import StageStream
from .targets import binding_for

log = logging.getLogger("bls")

__all__ = ["BindingError", "Runtime", "StageStream", "current"]

_current: contextvars.ContextVar[Runtime | None] = contextvars.ContextVar(
    "bls_runtime", default=None
)


_UNSET: Any = object()  # (no value yet: a request's own scope ended it first)


class BindingError(Exception):
    """Bindings and the script disagree (unbound stage, type or mode mismatch).

    Raised before the first request; ``problems`` lists every one found.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def current() -> Runtime:
    """The runtime serving the current task. RuntimeError outside of one."""
    rt = _current.get()
    if rt is None:
        raise RuntimeError(
            "bls.stage() was called outside a running bls script: run it with `bls run`/"
            "`bls serve`, or inside `async with bls.Runtime({...})`"
        )
    return rt


def _expect(name: str, binding: Binding, decl: Signature | None) -> None:
    """Results come back in the declared type, or else in the worker's own."""
    binding.expect(decl.response if decl is not None else binding.signature.response)


async def _not_bound(name: str, known: list[str]) -> Any:
    raise StageNotBound(name, known)


class Runtime:
    """The bindings for a process, entered as an async context manager.

    ``bindings`` maps stage names to :class:`Binding` objects or to anything
    :func:`bls.targets.binding_for` accepts (a function, a Worker, ``"module:attr"``,
    ``"tcp://host:port"``). ``declared`` are the typed handles (:class:`bls.Stage`,
    :class:`bls.StreamStage`) whose types the bindings must fit: ``bls run``/``serve``/
    ``worker`` pass the ones their script can see. Entering opens every binding, checks
    them against the declared types (:class:`BindingError` on any mismatch, before any
    set-up), then sets the workers up; leaving tears them down, also on error or
    cancellation. A handle not declared up front is checked at its first call, and its
    types are declared from then on.
    """

    def __init__(
        self,
        bindings: Mapping[str, Any] | None = None,
        *,
        declared: Iterable[Any] = (),
        uses: Iterable[StageUse] = (),
        start_unreachable: bool = False,
    ) -> None:
        self._declared: dict[str, Signature] = {}
        self._policies: dict[str, Policy] = {}  # those typed handles give
        for handle in declared:
            declare(self._declared, handle.name, handle.signature)
            if getattr(handle, "policy", None) is not None:
                self._policies[handle.name] = handle.policy
        self._uses = list(uses)
        # Serving processes start before their remote stages are up (any start order).
        self._start_unreachable = start_unreachable
        self._bindings: dict[str, Binding] = {
            name: binding_for(name, target) for name, target in (bindings or {}).items()
        }
        self._token: contextvars.Token[Runtime | None] | None = None
        self._streams = OpenStreams()  # left open outside any request: closed on exit
        self._opened: list[Binding] = []
        self._stack: AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    @property
    def bindings(self) -> Mapping[str, Binding]:
        return self._bindings

    def unreachable(self) -> list[str]:
        """The stages no replica of which can take a call now (what ``/ready`` names)."""
        return [name for name, binding in self._bindings.items() if not binding.ready()]

    def binding(self, name: str) -> Binding:
        try:
            return self._bindings[name]
        except KeyError:
            raise StageNotBound(name, list(self._bindings)) from None

    async def open(self) -> list[str]:
        """Open every binding and return the type problems found (no set-up)."""
        problems: list[str] = []
        unopened: list[str] = []
        self._stack = AsyncExitStack()
        tg = self._tg = await self._stack.enter_async_context(anyio.create_task_group())
        for name, binding in self._bindings.items():
            self._opened.append(binding)
            if name in self._policies and not binding.policy_given:  # bls.toml's wins
                binding.set_policy(self._policies[name])
            try:
                await binding.open(tg)
            except OSError as exc:
                late = partial(self._late_problems, name, binding)
                if self._start_unreachable and binding.resolve_later(late):
                    log.warning(
                        "%s; starting without it: its calls fail with 'unavailable' (and "
                        "/ready answers 503) until a replica answers",
                        exc,
                    )
                else:
                    problems.append(str(exc))
                unopened.append(name)
                continue
            problems.extend(type_problems(name, binding, self._declared.get(name)))
            if binding.policy.repeats and binding.signature.streaming:
                problems.append(
                    f"stage {name!r}: hedge and retry apply to unary stages; it streams"
                )
        problems.extend(use_problems(self._uses, self._bindings, self._declared, unopened))
        for name, binding in self._bindings.items():
            _expect(name, binding, self._declared.get(name))
        return problems

    def _late_problems(self, name: str, binding: Binding) -> list[str]:
        """The checks :meth:`open` makes, for a stage whose first replica answered late."""
        uses = [use for use in self._uses if use.name == name]
        decl = self._declared.get(name)
        problems = type_problems(name, binding, decl)
        problems += use_problems(uses, {name: binding}, self._declared)
        if not problems:
            _expect(name, binding, decl)
        return problems

    def _learn(self, name: str, signature: Signature) -> None:
        """A typed handle not declared up front, at its first call: its types are
        checked against the binding now, then declared (BindingError if they differ)."""
        declare(self._declared, name, signature)
        binding = self._bindings.get(name)
        if binding is None or not binding.ready():
            return  # not bound (the call says so) or not resolved yet (checked then)
        problems = type_problems(name, binding, signature)
        if problems:
            del self._declared[name]
            raise BindingError(problems)
        _expect(name, binding, signature)

    async def start(self) -> None:
        problems = await self.open()
        if problems:
            raise BindingError(problems)
        for binding in self._bindings.values():
            await binding.start()

    async def aclose(self) -> None:
        """Tear down every opened binding (shielded from cancellation), then stop the
        bindings' background tasks."""
        first: BaseException | None = None
        await self._streams.aclose()
        with anyio.CancelScope(shield=True):
            for binding in reversed(self._opened):
                try:
                    await binding.aclose()
                except Exception as exc:  # keep closing the others
                    first = first or exc
            self._opened.clear()
        stack, self._stack = self._stack, None
        if stack is not None:
            assert self._tg is not None
            self._tg.cancel_scope.cancel()
            await stack.aclose()
        if first is not None:
            raise first

    async def __aenter__(self) -> Runtime:
        try:
            await self.start()
        except BaseException:
            await self.aclose()
            raise
        self._token = _current.set(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            try:
                _current.reset(self._token)
            except ValueError:  # exited from another context (e.g. a fixture's task)
                _current.set(None)
            self._token = None
        await self.aclose()

    # -- stage calls ------------------------------------------------------------------

    def call(self, name: str, req: Any) -> Coroutine[Any, Any, Any]:
        """Call a unary stage; awaiting gives the result in the declared (or worker's) type."""
        binding = self._bindings.get(name)
        if binding is None:
            return _not_bound(name, list(self._bindings))
        ctx = current_context()
        if ctx.trace is None:
            return binding.invoke(req, ctx)
        return traced_call(ctx, name, binding.description, binding.invoke, req)

    def stream(self, name: str, req: Any) -> StageStream:
        """Open a streaming stage call (lazily: nothing is sent until iterated)."""
        ctx = current_context()
        streams = ctx.streams if ctx.streams is not None else self._streams
        return StageStream(self.binding(name), req, ctx, streams)

    def call_declared(self, name: str, signature: Signature, req: Any) -> Any:
        """:meth:`call` from a typed handle that declares ``signature`` for ``name``."""
        if name not in self._declared:
            self._learn(name, signature)
        return self.call(name, req)

    def stream_declared(self, name: str, signature: Signature, req: Any) -> StageStream:
        """:meth:`stream` from a typed handle that declares ``signature`` for ``name``."""
        if name not in self._declared:
            self._learn(name, signature)
        return self.stream(name, req)

    # -- requests ---------------------------------------------------------------------

    async def run(self, entry: Script, req: Any, *, timeout: float | None = None) -> Any:
        """Run a unary entry as one request under its own cancel scope.

        ``req`` is converted to the entry's request type (InvalidRequest on failure).
        A ``timeout`` cancels everything under the request, remote work included, then
        raises :class:`DeadlineExceeded`. Streaming entries: use :meth:`run_stream`.
        """
        if entry.streaming:
            raise TypeError(f"entry {entry.name!r} is streaming: use run_stream()")
        req = entry.coerce(req)
        token = _current.set(self)
        try:
            ctx = current_context()
            # (The request and its answer noted here, not by a coroutine around the
            # entry's: a frame more in the await chain costs every resumption of the task.)
            record = ctx.record
            if record is not None:
                record.entry(entry.name, req)
            try:
                if timeout is None:  # no scope of its own: the caller's scopes govern it
                    if ctx.streams is not None:  # a request's: it closes them
                        value = await entry.fn(req)
                    else:
                        async with _streams_closed():
                            value = await entry.fn(req)
                else:
                    value = _UNSET
                    async with _own_scope(entry, ctx, timeout):
                        value = await entry.fn(req)
                    if value is _UNSET:
                        raise _deadline(entry, timeout)
            except BaseException as exc:
                if record is not None:
                    record.entry_failed(exc)
                raise
            if record is not None:
                record.answer(value)
            return entry.check_result(value)
        finally:
            _current.reset(token)

    async def feed(self, entry: Script, req: Any, sink: Callable[[Any], Awaitable[None]]) -> None:
        """Run a streaming entry in the calling task, awaiting ``sink(item)`` for each item
        as the script yields it (no buffering: a slow sink pauses the script).

        For a caller whose whole use of an item is one await, such as an HTTP frontend
        writing it out: unlike :meth:`run_stream`, no task runs beside the caller and no
        item is handed between tasks. The request's deadline and cancellation are the
        caller's own scopes. ``sink`` runs while the script is suspended at its ``yield``,
        inside whatever scopes the script holds there, as :meth:`run_stream`'s hand-over
        does. An error in the script, or in ``sink``, is raised here after the script's
        generator is closed.
        """
        if not entry.streaming:
            raise TypeError(f"entry {entry.name!r} is unary: use run()")
        req = entry.coerce(req)
        token = _current.set(self)
        try:
            async with _streams_closed(), aclosing(_items(entry, req)) as agen:
                async for item in agen:
                    await sink(item)
        finally:
            _current.reset(token)

    @asynccontextmanager
    async def run_stream(
        self, entry: Script, req: Any, *, timeout: float | None = None
    ) -> AsyncIterator[AsyncIterator[Any]]:
        """Run a streaming entry as one request: ``async with rt.run_stream(e, r) as items``.

        The entry runs in its own task under the request's cancel scope and hands items
        over one at a time (no buffering: a slow reader pauses the script). An error in
        the script is raised from the iterator at the point it happened. Leaving the
        block early cancels the script and everything under it.
        """
        if not entry.streaming:
            raise TypeError(f"entry {entry.name!r} is unary: use run()")
        req = entry.coerce(req)
        send, receive = anyio.create_memory_object_stream[Any](0)

        ctx = current_context()

        async def produce() -> None:
            token = _current.set(self)
            scope = _own_scope(entry, ctx, timeout)
            async with send:
                try:
                    async with scope:
                        async with aclosing(_items(entry, req)) as agen:
                            async for item in agen:
                                await send.send(item)
                        return
                    await send.send(_Failure(_deadline(entry, timeout)))
                except anyio.BrokenResourceError:
                    pass  # the reader went away
                except Exception as exc:
                    with contextlib.suppress(anyio.BrokenResourceError):
                        await send.send(_Failure(exc))
                finally:
                    _current.reset(token)

        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            try:
                async with receive:
                    yield _Items(receive)
            except Exception as exc:
                failure = exc  # raised below as itself, not inside an ExceptionGroup
            finally:
                tg.cancel_scope.cancel()
        if failure is not None:
            raise failure


def _items(entry: Script, req: Any) -> Any:
    """A streaming entry's items, noted in the request's recording when it keeps one."""
    ctx = current_context()
    if ctx.record is None:
        return entry.fn(req)
    return noted_items(ctx.record, entry.name, req, entry.fn(req))


@asynccontextmanager
async def _streams_closed() -> AsyncIterator[None]:
    """The stage streams opened inside and left open are closed at the end, unless a
    request around already does that (its scope holds the set they join)."""
    ctx = current_context()
    if ctx.streams is not None:
        yield
        return
    streams = OpenStreams()
    inner = CallContext(
        ctx.deadline, ctx.trace, ctx.span, streams, ctx.record, ctx.priority, headers=ctx.headers
    )
    token = enter(inner)
    try:
        yield
    finally:
        leave(token)
        await streams.aclose()


def _own_scope(entry: Script, ctx: CallContext, timeout: float | None) -> RequestScope:
    """A request's own scope inside its caller's (``ctx``): the caller's trace, span and
    priority, the caller's deadline carried, and ``timeout`` of its own."""
    scope = RequestScope(
        entry.name,
        trace=ctx.trace,
        span=ctx.span,
        carried=ctx.deadline,
        record=ctx.record,
        priority=ctx.priority,
        headers=ctx.headers,
    )
    if timeout is not None:
        scope.expire_after(timeout)
    return scope


def _deadline(entry: Script, timeout: float | None) -> DeadlineExceeded:
    return DeadlineExceeded(f"request to {entry.name!r} exceeded its {timeout}s deadline")


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Items:
    """The reader's side of :meth:`Runtime.run_stream`."""

    __slots__ = ("_receive",)

    def __init__(self, receive: Any) -> None:
        self._receive = receive

    def __aiter__(self) -> _Items:
        return self

    async def __anext__(self) -> Any:
        try:
            item = await self._receive.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None
        if isinstance(item, _Failure):
            raise item.error
        return item
