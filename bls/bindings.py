"""Bindings: what a stage name is attached to.

A :class:`Binding` is the one interface between the runtime and whatever does the work.
This module holds the interface, a binding in front of another (:class:`Wrapper`), and
the inline kind (an in-process function, async generator, :class:`bls.Worker` or
script). :func:`bls.targets.binding_for` makes a binding of any kind from a target; other
kinds register the schemes of their targets as entry points in the ``bls.schemes`` group
(``tcp``, ``ipc``, ``inproc``, ``etcd``: the remote kind, in ``bls.transport``), so
neither module imports them.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import anyio.abc
import msgspec

from .counts import StageCounts
from .entry import Script
from .errors import ErrorKind, InvalidRequest, StageError
from .loop import backend
from .mathlibs import settle
from .messages import Signature, convert, fast_type, json_schema, signature_of, type_name
from .policy import Policy
from .scope import NO_CONTEXT, CallContext
from .worker import Worker

__all__ = [
    "Binding",
    "InlineBinding",
    "Wrapper",
    "worker_error",
]


class Binding:
    """How one stage is called. Subclasses implement ``call`` or ``stream``.

    Life cycle: ``open`` (learn the signature: import, or connect and read the worker's
    hello) → ``start`` (set up: load models) → calls → ``aclose``. ``bls check`` only
    opens. ``call``/``stream`` return what the worker gave (a remote binding decodes it
    straight into the expected type); :meth:`invoke`, what the runtime calls, and each
    stream item the runtime hands over go through :meth:`result`, which converts them to
    the type the script expects (:meth:`expect`), the same way for every kind of binding.

    Each call is handed its :class:`~bls.scope.CallContext`: the deadline to carry and
    the span to record into (a remote binding sends both). Code an inline binding runs
    sees the same context as current, so its own stage calls nest under the call.
    """

    name: str
    signature: Signature
    description: str
    # The type the script expects back; set by the runtime when it opens the binding.
    result_type: Any = Any
    _result_fast: type | None = None
    # Idempotency, hedging, retries, ejection (bls.policy); a remote binding applies them.
    policy: Policy = Policy()
    policy_given = False  # set in bls.toml (a typed handle's own policy gives way to it)

    def set_policy(self, policy: Policy) -> None:
        self.policy = policy
        self.policy_given = True

    def expect(self, tp: Any) -> None:
        """Convert every result and stream item to ``tp`` (see :mod:`bls.messages`)."""
        self.result_type = tp
        self._result_fast = fast_type(tp)

    def result(self, value: Any) -> Any:
        """``value`` converted to the expected type; StageError(kind="invalid_response")."""
        if self._result_fast is not None and isinstance(value, self._result_fast):
            return value
        try:
            return convert(value, self.result_type)
        except msgspec.ValidationError as exc:
            raise StageError(
                self.name,
                ErrorKind.INVALID_RESPONSE,
                f"result does not match {type_name(self.result_type)}: {exc}",
            ) from None

    async def invoke(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        """What ``await stage(name, req)`` runs: ``call`` then :meth:`result`."""
        return self.result(await self.call(req, ctx))

    async def open(self, tg: anyio.abc.TaskGroup | None = None) -> None:
        """Learn the signature. May connect (background tasks go in ``tg``, which lives
        as long as the runtime); must not load models."""

    async def start(self) -> None:
        """Make the binding ready for calls."""

    async def aclose(self) -> None:
        """Release everything. Safe to call more than once, and after a failed start."""

    async def call(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        raise StageError(self.name, ErrorKind.WRONG_MODE, f"stage {self.name!r} is streaming")

    def stream(self, req: Any, ctx: CallContext = NO_CONTEXT) -> AsyncIterator[Any]:
        raise StageError(self.name, ErrorKind.WRONG_MODE, f"stage {self.name!r} is unary")

    @property
    def schemas(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """JSON schemas of the request and response, for comparing across processes."""
        return json_schema(self.signature.request), json_schema(self.signature.response)

    @property
    def type_labels(self) -> tuple[str, str]:
        """Readable names of the request and response types, for messages."""
        return type_name(self.signature.request), type_name(self.signature.response)

    def ready(self) -> bool:
        """Whether calls can be made now (remote: some replica is connected)."""
        return True

    def counts(self) -> StageCounts:
        """What the stage counts for ``/metrics`` (:class:`bls.counts.StageCounts`): its
        traffic policy's counts by version (none where no policy acts: a call in process
        has no replica to hedge to, retry on or eject), its cache's. A wrapper adds its
        own to its inner binding's."""
        return StageCounts()

    def models(self) -> list[str]:
        """The model names its workers serve (:meth:`bls.Worker.served_models`), which
        the chat route answers to as ``vllm serve`` would."""
        return []

    def resolve_later(self, check: Callable[[], list[str]]) -> bool:
        """Whether the binding can run before it can answer (a remote stage whose workers
        are not up yet). If it can, it takes ``check`` to vet the types it learns later
        (the problems found, none to accept them) and returns True; most cannot: False."""
        return False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}: {self.description}>"


class Wrapper(Binding):
    """A binding in front of another (``inner``): everything is the inner binding's
    unless a subclass says otherwise (a result cache, a recorder)."""

    def __init__(self, inner: Binding) -> None:
        self.inner = inner
        self.name = inner.name

    @property
    def signature(self) -> Signature:  # type: ignore[override]
        return self.inner.signature

    @property
    def description(self) -> str:  # type: ignore[override]
        return self.inner.description

    @property
    def schemas(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.inner.schemas

    @property
    def type_labels(self) -> tuple[str, str]:
        return self.inner.type_labels

    @property
    def policy(self) -> Policy:  # type: ignore[override]
        return self.inner.policy

    @property
    def policy_given(self) -> bool:  # type: ignore[override]
        return self.inner.policy_given

    def set_policy(self, policy: Policy) -> None:
        self.inner.set_policy(policy)

    async def open(self, tg: anyio.abc.TaskGroup | None = None) -> None:
        await self.inner.open(tg)

    def resolve_later(self, check: Callable[[], list[str]]) -> bool:
        return self.inner.resolve_later(check)

    async def start(self) -> None:
        await self.inner.start()

    async def aclose(self) -> None:
        await self.inner.aclose()

    def ready(self) -> bool:
        return self.inner.ready()

    def counts(self) -> StageCounts:
        return self.inner.counts()

    def models(self) -> list[str]:
        return self.inner.models()

    def expect(self, tp: Any) -> None:
        super().expect(tp)
        self.inner.expect(tp)

    async def call(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        return await self.inner.call(req, ctx)

    async def invoke(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        return await self.inner.invoke(req, ctx)

    def stream(self, req: Any, ctx: CallContext = NO_CONTEXT) -> AsyncIterator[Any]:
        return self.inner.stream(req, ctx)


def worker_error(stage: str, exc: BaseException) -> StageError:
    """The :class:`StageError` a script sees for an exception raised by worker code.

    A StageError the worker raised itself keeps its stage name; one raised with an empty
    name (a worker that does not know what it is bound as) gets this stage's.
    """
    if isinstance(exc, StageError):
        if not exc.stage:
            exc.stage = stage
        return exc
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return StageError(stage, type(exc).__name__, str(exc) + _hint(exc), tb)


def _hint(exc: BaseException) -> str:
    """What a newcomer's exception leaves out: asyncio called where trio runs."""
    if isinstance(exc, RuntimeError) and str(exc) == "no running event loop":
        try:
            running = backend().name
        except RuntimeError:
            return ""
        if running == "trio":
            return (
                " (asyncio was called in a process that runs on trio: use anyio, which runs "
                "on both (anyio.sleep, anyio.to_thread.run_sync, ...), or --backend asyncio)"
            )
    return ""


class _InlineStream:
    """Drives an inline async generator, turning its exceptions into StageErrors."""

    __slots__ = ("_agen", "_name")

    def __init__(self, name: str, agen: Any) -> None:
        self._name = name
        self._agen = agen

    def __aiter__(self) -> _InlineStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._agen.__anext__()
        except StopAsyncIteration:
            raise
        except StageError as exc:
            raise worker_error(self._name, exc) from None
        except Exception as exc:
            raise worker_error(self._name, exc) from exc

    async def aclose(self) -> None:
        await self._agen.aclose()


class InlineBinding(Binding):
    """A stage served by a function, async generator, Worker or script in this process.

    The request is converted to the worker's annotated request type exactly as the
    wire would decode it; a cancelled caller cancels the worker's code directly (its
    ``finally`` blocks run in the caller's task).
    """

    def __init__(
        self,
        name: str,
        target: Any,
        *,
        options: Mapping[str, Any] | None = None,
        description: str | None = None,
    ) -> None:
        self.name = name
        self.description = description or f"inline {_describe(target)}"
        self._worker: Worker | None = None
        self._started = False
        fn: Callable[..., Any]
        self.script_file: str | None = None
        self.script_module: Any = None
        if isinstance(target, Script):
            fn, sig = target.fn, target.signature
            self.script_file = inspect.getsourcefile(target.fn)
            self.script_module = inspect.getmodule(target.fn)
        elif isinstance(target, type) and issubclass(target, Worker):
            self._worker = target(_worker_options(name, target, options))
            fn = self._worker.__call__
            sig = signature_of(target.__call__, skip_self=True)
        elif isinstance(target, Worker):
            self._worker = target
            fn = target.__call__
            sig = signature_of(type(target).__call__, skip_self=True)
        elif inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target):
            fn, sig = target, signature_of(target)
        elif isinstance(getattr(target, "__bls_signature__", None), Signature):
            fn, sig = target, target.__bls_signature__  # e.g. a @bls.batch function
        else:
            raise TypeError(
                f"stage {name!r}: {_describe(target)} is not an async function, async "
                f"generator, bls.Worker subclass or @bls.script entrypoint"
            )
        if options and self._worker is None:
            raise TypeError(f"stage {name!r}: options given, but {_describe(target)} takes none")
        self._fn = fn
        self.signature = sig
        self._req_type = sig.request
        self._req_fast = fast_type(sig.request)

    @property
    def worker(self) -> Worker | None:
        return self._worker

    def models(self) -> list[str]:
        return self._worker.served_models() if self._worker is not None and self._started else []

    async def start(self) -> None:
        settle()  # (torch's math set up on one thread: the same bits in any process)
        if self._worker is not None and not self._started:
            await self._worker.setup()
            self._started = True
            settle()  # (for a torch loaded by setup)

    async def aclose(self) -> None:
        if self._worker is not None and self._started:
            self._started = False
            await self._worker.teardown()

    def _request(self, req: Any) -> Any:
        try:
            return convert(req, self._req_type)
        except msgspec.ValidationError as exc:
            raise InvalidRequest.from_validation(self.name, exc) from None

    async def call(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        if self.signature.streaming:
            return await Binding.call(self, req)
        if self._req_fast is None or not isinstance(req, self._req_fast):
            req = self._request(req)
        try:
            return await self._fn(req)
        except StageError as exc:
            raise worker_error(self.name, exc) from None
        except Exception as exc:
            raise worker_error(self.name, exc) from exc

    async def invoke(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        # Binding.invoke with call() inlined: one coroutine fewer on the hot path.
        if self.signature.streaming:
            return await Binding.call(self, req)
        if self._req_fast is None or not isinstance(req, self._req_fast):
            req = self._request(req)
        try:
            value = await self._fn(req)
        except StageError as exc:
            raise worker_error(self.name, exc) from None
        except Exception as exc:
            raise worker_error(self.name, exc) from exc
        if self._result_fast is not None and isinstance(value, self._result_fast):
            return value
        return self.result(value)

    def stream(self, req: Any, ctx: CallContext = NO_CONTEXT) -> AsyncIterator[Any]:
        if not self.signature.streaming:
            return Binding.stream(self, req)
        return _InlineStream(self.name, self._fn(self._request(req)))


def _worker_options(stage: str, cls: type[Worker], options: Mapping[str, Any] | None) -> Any:
    if cls.Options is None:
        if options:
            raise TypeError(f"stage {stage!r}: {cls.__qualname__} takes no options")
        return None
    try:
        return msgspec.convert(dict(options or {}), cls.Options, strict=False)
    except msgspec.ValidationError as exc:
        err = InvalidRequest.from_validation(stage, exc)
        raise TypeError(
            f"stage {stage!r}: bad option for {cls.__qualname__} at {err.path}: {err.message}"
        ) from None


def _describe(target: Any) -> str:
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", None) or type(target).__module__
    qual = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}:{qual}"
