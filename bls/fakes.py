"""A stage answered by a fake (:class:`FakeBinding`): what :mod:`bls.testing` puts in
place of a real binding, with the same conversions, errors and types, and each call it
answered noted (:class:`Call`, :class:`Calls`).

What a fake is — a function, a value, a list of values, :class:`each`, an exception — and
how its answers reach the script is :mod:`bls.testing`'s docstring; here is how it is
done: the answers checked against the types declared for the stage up front
(:func:`answers`), or, where none are declared, the types read from the fake as an
inline stage's are read from its function (:func:`inferred`).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec

from .bindings import Binding, worker_error
from .cache import CacheOptions
from .errors import DeadlineExceeded, InvalidRequest, StageNotBound
from .messages import Signature, convert, field_hint, signature_of, type_name
from .replay import ordinal
from .scope import NO_CONTEXT, CallContext

__all__ = ["Call", "CallLog", "Calls", "FakeBinding", "cached", "each", "inferred", "streams"]


class Call(msgspec.Struct, kw_only=True):
    """One call a fake answered: what it got, what it gave, when (seconds after its
    :func:`fake` block began), and whether its caller cancelled it."""

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


class CallLog:
    """Where a block of fakes notes their calls: :class:`Calls`, and when it began."""

    __slots__ = ("calls", "t0")

    def __init__(self) -> None:
        self.calls = Calls()
        self.t0 = time.monotonic()


def streams(spec: Any) -> bool:
    """Whether a fake streams: an async generator function, or an object whose
    ``__call__`` is one (a ``bls.Worker`` such as ``FakeLLM``)."""
    spec = spec.spec if isinstance(spec, cached) else spec
    if inspect.isasyncgenfunction(spec):
        return True
    call = None if inspect.isroutine(spec) or not callable(spec) else type(spec).__call__
    return inspect.isasyncgenfunction(call)


def inferred(spec: Any, streaming: bool) -> Signature:
    """The types of a stage no typed handle declares, from its fake, as an inline stage
    has them from its function: a function's annotations; a value's own type (the common
    type of a list's values, exceptions aside). What it cannot tell is ``Any``: a request
    then arrives, and a result leaves, as the wire's builtins."""
    spec = spec.spec if isinstance(spec, cached) else spec
    if callable(spec) and not isinstance(spec, type):
        try:
            if inspect.isroutine(spec):
                found = signature_of(spec)
            else:  # an object called as a function: a Worker such as FakeLLM
                found = signature_of(type(spec).__call__, skip_self=True)
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


class FakeBinding(Binding):
    """A stage answered by its fake (see :mod:`bls.testing`), its calls noted in ``log``."""

    def __init__(self, name: str, spec: Any, signature: Signature, log: CallLog) -> None:
        self.name = name
        self.signature = signature
        self.description = f"fake {_describe(spec)}"
        self._log = log
        self._answers = _answers(name, spec, signature)
        self._spec = spec

    def _request(self, req: Any) -> Any:
        try:
            return convert(req, self.signature.request)
        except msgspec.ValidationError as exc:
            raise InvalidRequest.from_validation(self.name, exc) from None

    def _begin(self, req: Any) -> Call:
        record = Call(stage=self.name, request=req, started=time.monotonic() - self._log.t0)
        self._log.calls.setdefault(self.name, []).append(record)
        return record

    def _end(self, record: Call, exc: BaseException | None = None) -> None:
        record.ended = time.monotonic() - self._log.t0
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
            answer = self._answers(len(self._log.calls[self.name]))
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
            answer = self._answers(len(self._log.calls[self.name]))
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
