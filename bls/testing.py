"""Testing a pipeline's logic without models, workers or GPUs.

    from bls import testing

    async def test_the_judge_gets_a_second_try() -> None:
        with testing.fake({"draft": draft_fn, "judge": [Verdict(ok=False, reason="no"),
                                                        Verdict(ok=True, reason="ok")]}) as calls:
            answer = await testing.call(hello, Ask(text="hi"))
        assert answer.attempts == 2 and len(calls["judge"]) == 2

:func:`fake` names what answers each stage; :func:`call` runs an entry with them, in
process, on asyncio or trio (under pytest-anyio or pytest-trio). A fake is

- a function, async function or async generator (a streaming stage), called with the
  request as the stage would get it;
- a value, answered to every call, or a list of values, one per call (for a streaming
  stage, a list is the items every call yields; :func:`each` gives one list per call);
- an exception, raised at the call (``bls.StageError("judge", "overloaded", "...")``, a
  ``bls.DeadlineExceeded``), also as an element of a list.

Values are checked against the types the script declares for the stage (``bls.Stage``,
``bls.StreamStage``) when the entry runs, and arrive in those types. Deadlines,
cancellation and ``bls.timeout`` act on fakes as on real stages: a fake that sleeps past
the deadline is cancelled, and its :class:`Call` says so. A stage the script calls that
has no fake is an error naming it. :func:`client` serves the script over HTTP (httpx over
ASGI, no server) with fakes behind it; :func:`replay` runs a recorded request again
(``bls run --record``, ``bls serve --record``); :class:`FakeLLM` is an engine with the vLLM
worker's contract and no model.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import msgspec

from .bindings import Binding, worker_error
from .cache import CachedBinding, CacheOptions
from .check import find_stage_uses, typed_handles
from .entry import Script
from .errors import DeadlineExceeded, InvalidRequest, StageError, StageNotBound
from .messages import Signature, convert, field_hint, signature_of, type_name
from .models.fakellm import FakeLLM, FakeOptions
from .recording import Record
from .replay import Divergence, ordinal, read
from .replay import replay as _replay
from .runtime import Runtime
from .scope import NO_CONTEXT, CallContext
from .scriptfile import ScriptFile

__all__ = [
    "Call",
    "Calls",
    "Divergence",
    "FakeLLM",
    "FakeOptions",
    "cached",
    "call",
    "client",
    "each",
    "fake",
    "replay",
]


class Call(msgspec.Struct, kw_only=True):
    """One call a fake answered: what it got, what it gave, when (seconds after the
    first call of the block), and whether its caller cancelled it."""

    stage: str
    request: Any
    response: Any = None  # a unary call's result
    items: list[Any] = []  # a streaming call's items
    error: BaseException | None = None
    cancelled: bool = False
    started: float
    ended: float = 0.0

    @property
    def duration(self) -> float:
        return self.ended - self.started


class Calls(dict[str, list[Call]]):
    """The calls each faked stage got, in order: ``calls["judge"][0].request``."""

    def __missing__(self, stage: str) -> list[Call]:
        return []


class each:
    """One answer per call, for a streaming stage too: ``testing.each([1, 2], [3])``."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)


class cached:
    """A fake behind the stage's result cache, as ``cache = {...}`` in bls.toml puts a
    real one: ``testing.cached(encode, capacity_mb=64)``. A hit does not reach the fake
    (it is not in :class:`Calls`) and ``bls.cache_report()`` counts it. The cache lasts
    as long as the :func:`fake` block."""

    def __init__(self, spec: Any, **options: Any) -> None:
        self.spec = spec
        self.options = msgspec.convert(options, CacheOptions)


_active: contextvars.ContextVar[_Fakes | None] = contextvars.ContextVar("bls_fakes", default=None)


class _Fakes:
    def __init__(self, stages: Mapping[str, Any]) -> None:
        self.stages = dict(stages)
        self.calls = Calls()
        self.t0 = time.monotonic()
        self.made: dict[str, Binding] = {}  # a faked stage's binding, kept for the block

    def binding(self, name: str, sig: Signature) -> Binding:
        made = self.made.get(name)
        if made is None:
            spec = self.stages[name]
            if isinstance(spec, cached):
                inner = _Fake(name, spec.spec, sig, self)
                made = CachedBinding(inner, spec.options, identity={"fake": name})
            else:
                made = _Fake(name, spec, sig, self)
            self.made[name] = made
        return made


@contextlib.contextmanager
def fake(stages: Mapping[str, Any]) -> Iterator[Calls]:
    """Within the block, :func:`call` and :func:`client` answer each stage named in
    ``stages`` with its fake; yields the :class:`Calls` they record."""
    fakes = _Fakes(stages)
    token = _active.set(fakes)
    try:
        yield fakes.calls
    finally:
        _active.reset(token)


async def call(entry: Script, req: Any, *, timeout: float | None = None) -> Any:
    """Run ``entry`` on ``req`` (its request type, or that request's JSON form as dicts
    and lists) with the stages answered by the :func:`fake` block around it: a unary
    entry's result, or the list of a streaming entry's items. ``timeout`` is the request's
    deadline (``bls.DeadlineExceeded`` when it passes)."""
    fakes = _current_fakes()
    req = entry.coerce(req)
    module = inspect.getmodule(entry.fn)
    source = inspect.getsourcefile(entry.fn)
    async with _runtime(fakes, module, source) as rt:
        try:
            if not entry.streaming:
                return await rt.run(entry, req, timeout=timeout)
            async with rt.run_stream(entry, req, timeout=timeout) as items:
                return [item async for item in items]
        except StageNotBound as exc:
            raise _unfaked(exc.stage, fakes) from None


@contextlib.asynccontextmanager
async def client(script: str | Path, **limits: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of ``script`` served with the :func:`fake` block's stages (httpx
    over ASGI: no server, no socket): ``await http.post("/v1/scripts/hello", json=...)``.
    ``limits`` set :class:`bls.serve.intake.Limits` (``request_timeout=0.5``)."""
    # The HTTP package loads only for a client: fakes and calls do without it.
    from .serve.app import Frontend
    from .serve.intake import Limits

    fakes = _current_fakes()
    loaded = ScriptFile(script, configured=False)
    async with _runtime(fakes, loaded.module, str(loaded.path)) as rt:
        app = Frontend(
            loaded.entries,
            rt,
            title=loaded.path.name,
            limits=Limits(**limits),
            admission=loaded.config.admission,
        )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bls") as http:
            yield http


async def replay(path: str | Path, entry: Script | None = None) -> Any:
    """Run the recorded request in ``path`` again, every stage answered from the record,
    through ``entry`` (default: the entry the record names, in the script file it was
    recorded from): what :func:`call` returns, a unary entry's result or the list of a
    streaming entry's items. Raises :class:`Divergence` (an AssertionError) naming the
    first difference; a request that failed in the record fails the same way again."""
    record = read(path)
    if entry is None:
        loaded = ScriptFile(record.path or record.script, configured=False)
        entry = loaded.entry(record.entry)
    module = inspect.getmodule(entry.fn)
    answers = await _replay(record, entry, typed_handles(module) if module else [])
    if entry.streaming:
        return answers
    if record.error is not None:  # (it failed as recorded: _replay checked that)
        raise _recorded_failure(record)
    return answers[0]


def _recorded_failure(record: Record) -> Exception:
    """The error a unary request failed with in the record, as :func:`call` raises it."""
    error = record.error
    assert error is not None
    if error.kind == "deadline":
        return DeadlineExceeded(error.message)
    if error.kind == "invalid_request":
        return InvalidRequest(error.stage, error.message, error.path or "$")
    return StageError(error.stage, error.kind, error.message)


# -- the runtime of fakes ---------------------------------------------------------------


def _current_fakes() -> _Fakes:
    fakes = _active.get()
    if fakes is None:
        raise RuntimeError("bls.testing needs a `with bls.testing.fake({...}):` block around it")
    return fakes


def _runtime(fakes: _Fakes, module: Any, source: str | None) -> Runtime:
    """A runtime with a binding for each fake, and for each stage the script uses that
    has none: one that says so when called."""
    declared = {h.name: h.signature for h in typed_handles(module)} if module else {}
    used: dict[str, bool] = {}
    if source is not None:
        used = {u.name: u.streaming for u in find_stage_uses(Path(source), module)}
    bindings: dict[str, Binding] = {}
    for name in {*used, *declared, *fakes.stages}:
        sig = declared.get(name)
        streaming = sig.streaming if sig else used.get(name, _streams(fakes.stages.get(name)))
        if sig is None:
            sig = _inferred(fakes.stages.get(name), streaming)
        if name in fakes.stages:
            bindings[name] = fakes.binding(name, sig)
        else:
            bindings[name] = _Unfaked(name, sig, fakes)
    return Runtime(bindings, declared=list(typed_handles(module)) if module else [])


def _streams(spec: Any) -> bool:
    return inspect.isasyncgenfunction(spec.spec if isinstance(spec, cached) else spec)


def _inferred(spec: Any, streaming: bool) -> Signature:
    """The types of a stage no typed handle declares, from its fake, as an inline stage
    has them from its function: a function's annotations; a value's own type (the common
    type of a list's values, exceptions aside). What it cannot tell is ``Any``: a request
    then arrives, and a result leaves, as the wire's builtins."""
    spec = spec.spec if isinstance(spec, cached) else spec
    if callable(spec) and not isinstance(spec, type):
        try:
            found = signature_of(spec)
        except (TypeError, ValueError):  # a callable with no signature to read
            return Signature(request=Any, response=Any, streaming=streaming)
        request, response = (_named(t) for t in (found.request, found.response))
        return Signature(request=request, response=response, streaming=streaming)
    if isinstance(spec, each):
        values = [v for answer in spec.answers for v in _listed(answer)]
    else:
        values = _listed(spec)
    kinds = {type(v) for v in values if not isinstance(v, BaseException)}
    response = kinds.pop() if len(kinds) == 1 else Any
    if not (isinstance(response, type) and issubclass(response, msgspec.Struct)):
        response = Any  # (a str stays a str as builtins; a dict, a dict)
    return Signature(request=Any, response=response, streaming=streaming)


def _named(tp: Any) -> Any:
    """An annotation as a type; one left a string (a name the fake's module cannot
    resolve, under ``from __future__ import annotations``) as ``Any``."""
    return Any if isinstance(tp, str) else tp


def _listed(answer: Any) -> list[Any]:
    if isinstance(answer, Sequence) and not isinstance(answer, (str, bytes)):
        return list(answer)
    return [answer]


def _unfaked(stage: str, fakes: _Fakes) -> StageNotBound:
    exc = StageNotBound(stage, list(fakes.stages))
    faked = ", ".join(sorted(fakes.stages)) or "none"
    exc.args = (
        f"stage {stage!r} is called by the script but has no fake: add it to "
        f"bls.testing.fake({{...}}) (faked: {faked})",
    )
    return exc


class _Unfaked(Binding):
    """A stage the script uses that the test did not fake: calling it says so."""

    def __init__(self, name: str, signature: Signature, fakes: _Fakes) -> None:
        self.name = name
        self.signature = signature
        self.description = "no fake"
        self._fakes = fakes

    async def call(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        raise _unfaked(self.name, self._fakes)

    def stream(self, req: Any, ctx: CallContext = NO_CONTEXT) -> AsyncIterator[Any]:
        raise _unfaked(self.name, self._fakes)


class _Fake(Binding):
    """A stage answered by its fake (see the module's docstring)."""

    def __init__(self, name: str, spec: Any, signature: Signature, fakes: _Fakes) -> None:
        self.name = name
        self.signature = signature
        self.description = f"fake {_describe(spec)}"
        self._fakes = fakes
        self._answers = _answers(name, spec, signature)
        self._spec = spec

    def _request(self, req: Any) -> Any:
        try:
            return convert(req, self.signature.request)
        except msgspec.ValidationError as exc:
            raise InvalidRequest.from_validation(self.name, exc) from None

    def _begin(self, req: Any) -> Call:
        record = Call(stage=self.name, request=req, started=time.monotonic() - self._fakes.t0)
        self._fakes.calls.setdefault(self.name, []).append(record)
        return record

    def _end(self, record: Call, exc: BaseException | None = None) -> None:
        record.ended = time.monotonic() - self._fakes.t0
        if exc is not None and isinstance(exc, Exception):
            record.error = exc
        elif exc is not None:
            record.cancelled = True

    async def call(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        if self.signature.streaming:
            return await Binding.call(self, req)
        req = self._request(req)
        record = self._begin(req)
        try:
            answer = self._answers(len(self._fakes.calls[self.name]))
            if callable(answer):
                answer = answer(req)
                if inspect.isawaitable(answer):
                    answer = await answer
            elif isinstance(answer, BaseException):
                raise answer
        except BaseException as exc:
            self._end(record, exc)
            raise _as_stage_error(self.name, exc) from None
        record.response = answer
        self._end(record)
        return answer

    def stream(self, req: Any, ctx: CallContext = NO_CONTEXT) -> AsyncIterator[Any]:
        if not self.signature.streaming:
            return Binding.stream(self, req)
        return self._items(self._request(req))

    async def _items(self, req: Any) -> AsyncIterator[Any]:
        record = self._begin(req)
        try:
            answer = self._answers(len(self._fakes.calls[self.name]))
            produced = answer(req) if callable(answer) else answer
            if isinstance(produced, BaseException):
                raise produced
            if hasattr(produced, "__aiter__"):
                async for item in produced:
                    record.items.append(item)
                    yield item
            else:
                for item in produced:
                    if isinstance(item, BaseException):
                        raise item
                    record.items.append(item)
                    yield item
        except BaseException as exc:
            self._end(record, exc)
            if isinstance(exc, GeneratorExit):
                raise
            raise _as_stage_error(self.name, exc) from None
        self._end(record)


def _as_stage_error(stage: str, exc: BaseException) -> BaseException:
    """What the script sees: a cancel stays a cancel, a deadline a deadline, a failed
    ``assert`` in a fake a test failure (no ``except StageError`` in the script hides
    it), anything else as an inline worker's exception would arrive."""
    passed = (DeadlineExceeded, StageNotBound, AssertionError)
    if isinstance(exc, passed) or not isinstance(exc, Exception):
        return exc
    return worker_error(stage, exc)


def _answers(stage: str, spec: Any, sig: Signature) -> Any:
    """``answer(n)``: the fake's answer to the ``n``-th call (a value, a callable, an
    exception), the canned values checked against the declared type up front."""
    if callable(spec) and not isinstance(spec, type):
        return lambda n: spec
    per_call = isinstance(spec, each) or (
        not sig.streaming and isinstance(spec, Sequence) and not isinstance(spec, (str, bytes))
    )
    answers = list(spec.answers if isinstance(spec, each) else spec) if per_call else [spec]
    checked = [_checked(stage, a, sig, i, len(answers) > 1) for i, a in enumerate(answers, 1)]
    if not per_call:
        return lambda n: checked[0]

    def nth(n: int) -> Any:
        if n > len(checked):
            raise AssertionError(
                f"the fake for stage {stage!r} has {len(checked)} answer(s) and was called "
                f"a {ordinal(n)} time"
            )
        return checked[n - 1]

    return nth


def _checked(stage: str, value: Any, sig: Signature, n: int, several: bool) -> Any:
    if isinstance(value, BaseException) or callable(value) or sig.response is Any:
        return value
    which = f" answer {n}" if several else ""
    if not sig.streaming:
        return _typed(f"fake for stage {stage!r}{which}", value, sig.response)
    return [
        v
        if isinstance(v, BaseException)
        else _typed(f"fake for stage {stage!r}{which} item {i}", v, sig.response)
        for i, v in enumerate(value, 1)
    ]


def _typed(what: str, value: Any, tp: Any) -> Any:
    """``value`` as a ``tp``, or a TypeError naming ``what`` and the field."""
    try:
        return convert(value, tp)
    except (msgspec.ValidationError, TypeError) as exc:
        problem = InvalidRequest.from_validation("", exc)
        try:
            hint = field_hint(tp, msgspec.json.encode(value), problem.message, problem.path)
        except (TypeError, msgspec.EncodeError):
            hint = ""
        at = f" at `{problem.path}`" if problem.path != "$" else ""
        raise TypeError(f"{what}: not a {type_name(tp)}{at}: {problem.message}{hint}") from None


def _describe(spec: Any) -> str:
    name = getattr(spec, "__qualname__", None)
    return name if isinstance(name, str) else type(spec).__name__
