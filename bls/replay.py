"""Replaying a record: the script runs again, every stage answered from what was recorded.

No worker, no model, no ``bls.toml``: each stage the script calls is a
:class:`ReplayBinding` that checks the request against the record and answers as the
stage did then (its result, its items, its error; a call that was cancelled then waits
to be cancelled again). When the script now calls differently — another stage, another
request, more calls, fewer, another answer in the end — :class:`Divergence` names the
first difference: which call, which field, what the record has and what the script gave.
Calls to one stage are matched in their recorded order, or by their request when calls
made side by side (``bls.gather``) started in another order.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec

from .bindings import Binding
from .entry import Script
from .errors import DeadlineExceeded, ErrorKind, InvalidRequest, StageError, StageNotBound
from .messages import Signature, convert, type_name
from .recording import (
    Record,
    RecordedCall,
    RecordedError,
    RecordError,
    decode_value,
    encode_value,
    load,
)
from .runtime import Runtime
from .scope import NO_CONTEXT, CallContext
from .scriptfile import ScriptFile
from .segments import SUFFIX, find
from .typenames import resolve

__all__ = [
    "Divergence",
    "ReplayBinding",
    "difference",
    "importable_from",
    "read",
    "recorded_failure",
    "recorded_value",
    "replay",
    "replay_file",
]


class Divergence(AssertionError):
    """The script no longer does what the record says it did; the message says where."""


CANCEL_WAIT_MAX = 60.0  # how long a replayed call waits to be cancelled, at most


class _Calls:
    """What is left of the record's calls, by stage, and how many were made so far;
    which modules a result's type may be imported from (``importable``)."""

    def __init__(self, record: Record, importable: Callable[[str], bool]) -> None:
        self.importable = importable
        self.left: dict[str, list[tuple[int, RecordedCall]]] = {}
        for n, call in enumerate(record.calls, 1):
            self.left.setdefault(call.stage, []).append((n, call))
        self.made: dict[str, int] = {}
        self.diverged: Divergence | None = None  # the first divergence, once found
        self.scope = anyio.CancelScope()  # the replay's: cancelled at the first divergence

    def diverge(self, message: str) -> Divergence:
        """The divergence, kept as the replay's outcome (the first one found wins, even
        if the script catches it), and the replay cancelled."""
        exc = Divergence(message)
        if self.diverged is None:
            self.diverged = exc
            self.scope.cancel()
        return exc

    def take(self, stage: str, req: Any) -> tuple[int, RecordedCall]:
        """The recorded call this one is: the first left for ``stage`` with the same
        request; Divergence when there is none."""
        made = self.made[stage] = self.made.get(stage, 0) + 1
        left = self.left.get(stage, [])
        if not left:
            raise self.diverge(
                f"the script calls stage {stage!r} a {ordinal(made)} time; the record has "
                f"{made - 1} call(s) to it"
            )
        sent = encode_value(req)
        for i, (n, call) in enumerate(left):
            if call.request == sent:
                del left[i]
                return n, call
        n, call = left[0]
        raise self.diverge(
            f"call {n} (stage {stage!r}): the request differs {difference(call.request, sent)}"
        )

    def unmade(self) -> list[tuple[int, RecordedCall]]:
        return sorted(c for calls in self.left.values() for c in calls)


class ReplayBinding(Binding):
    """A stage answered from the record (see the module's docstring). Its results and
    items reach the script in the type they had then: the type the script declares for
    the stage, else the one the record names (what the binding converted them to)."""

    def __init__(self, name: str, streaming: bool, calls: _Calls) -> None:
        self.name = name
        self.description = "the record"
        self.signature = Signature(request=Any, response=Any, streaming=streaming)
        self._calls = calls

    def result(self, value: Any) -> Any:
        return value  # (converted as it is taken from the record)

    async def call(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        if self.signature.streaming:
            return await Binding.call(self, req)
        n, recorded = self._calls.take(self.name, req)
        if recorded.error is not None:
            await _fail(n, recorded, self._calls)
        return self._value(n, recorded, 0)

    def stream(self, req: Any, ctx: CallContext = NO_CONTEXT) -> AsyncIterator[Any]:
        if not self.signature.streaming:
            return Binding.stream(self, req)
        return self._items(req)

    async def _items(self, req: Any) -> AsyncIterator[Any]:
        n, recorded = self._calls.take(self.name, req)
        for i in range(len(recorded.items)):
            yield self._value(n, recorded, i)
        if recorded.error is not None:
            await _fail(n, recorded, self._calls)

    def _value(self, n: int, call: RecordedCall, i: int) -> Any:
        calls = self._calls
        return recorded_value(call, n, i, self.result_type, calls.importable, calls.diverge)


async def _fail(n: int, call: RecordedCall, calls: _Calls) -> None:
    await recorded_failure(n, call, calls.diverge)


def recorded_value(
    call: RecordedCall,
    n: int,
    i: int,
    result_type: Any,
    importable: Callable[[str], bool],
    diverge: Callable[[str], Exception],
) -> Any:
    """Item ``i`` of recorded call ``n`` (its result: 0), in ``result_type`` (the one
    the script declares for the stage; ``Any``: the type the record names, imported when
    ``importable`` allows); what ``diverge`` makes of a message when it cannot be."""
    what = f"call {n} (stage {call.stage!r})"
    try:
        value = decode_value(call.items[i])
    except Exception as exc:  # (checked as msgpack when read; an array's bytes here)
        raise RecordError(f"the record's {what} item {i + 1} does not decode: {exc}") from None
    tp = result_type
    if tp is Any:
        try:
            tp = resolve(call.result_type, importable)
        except LookupError as exc:
            raise diverge(
                f"{what}: the script got its result as {exc}: import it in the script"
            ) from None
    try:
        return convert(value, tp)
    except (msgspec.ValidationError, TypeError) as exc:
        raise diverge(f"{what}: the recorded result is not a {type_name(tp)}: {exc}") from None


async def recorded_failure(n: int, call: RecordedCall, diverge: Callable[[str], Exception]) -> None:
    """Raise what recorded call ``n`` raised then. A call that was cancelled then (a
    race's loser, a timeout's) waits to be cancelled again: a divergence (``diverge``'s)
    if the script has not done so in the time it took then, plus a second and as long
    again (at most :data:`CANCEL_WAIT_MAX`)."""
    error = call.error
    assert error is not None
    if error.kind in (ErrorKind.CANCELLED, ErrorKind.DEADLINE):
        took = max(0.0, call.end - call.start)
        wait = min(2 * took + 1, CANCEL_WAIT_MAX)
        await anyio.sleep(wait)
        raise diverge(
            f"call {n} (stage {call.stage!r}) was cancelled after {took:.3f}s in the record; "
            f"the script has not cancelled it after {wait:.3f}s"
        )
    if error.kind == ErrorKind.INVALID_REQUEST:
        raise InvalidRequest(error.stage, error.message, error.path or "$")
    raise StageError(error.stage, error.kind, error.message)


def read(path: str | Path, request_id: str | None = None) -> Record:
    """The record in ``path``: a ``.blsrec`` file; or, in a segment (``.blsseg``) or a
    folder of them (``bls serve --record DIR``), request ``request_id``'s
    (:func:`bls.segments.find`). :class:`bls.recording.RecordError` when it cannot be."""
    path = Path(path)
    if path.is_dir() or path.suffix == SUFFIX:
        return find(path, request_id)
    if request_id is not None:
        raise RecordError(f"{path} is one request's record: --id is for a segment or a folder")
    return load(path.read_bytes(), str(path))


async def replay(record: Record, entry: Script, declared: Sequence[Any] = ()) -> list[Any]:
    """Run ``entry`` on the record's request with every stage answered from the record;
    its answers (a unary entry's one result, or a streaming entry's items: those it gave
    before it failed, for a request that failed, and failed the same way again). Raises
    :class:`Divergence` at the first difference; :class:`bls.recording.RecordError` for a
    record that left out a value (one no encoder takes, or past the bytes it keeps)."""
    if record.unrecorded:
        more = len(record.unrecorded) - 1
        also = f" (and {more} more)" if more else ""
        raise RecordError(
            f"the record cannot be replayed: it left out {record.unrecorded[0]}{also}"
        )
    calls = _Calls(record, importable_from(entry))
    streaming = {h.name: h.signature.streaming for h in declared}
    streaming.update({c.stage: c.streaming for c in record.calls})
    bindings = {n: ReplayBinding(n, s, calls) for n, s in streaming.items()}
    try:
        req = decode_value(record.request)
    except Exception as exc:
        raise RecordError(f"the record's request does not decode: {exc}") from None
    # A request its deadline ended then gets the same deadline again.
    timeout = record.duration if record.error and record.error.kind == ErrorKind.DEADLINE else None
    answers: list[Any] = []
    async with Runtime(bindings, declared=declared) as rt:
        failed: Exception | None = None
        with calls.scope:
            try:
                if entry.streaming:
                    async with rt.run_stream(entry, req, timeout=timeout) as items:
                        answers = [item async for item in items]
                else:
                    answers = [await rt.run(entry, req, timeout=timeout)]
            except (StageError, DeadlineExceeded, Divergence) as exc:
                failed = exc
            except StageNotBound as exc:
                raise calls.diverge(
                    f"the script calls stage {exc.stage!r}; the record has no call to it"
                ) from None
        if calls.diverged is not None:
            raise calls.diverged
        if failed is not None:
            _same_error(record, failed)
            return answers
    if record.error is not None:
        raise Divergence(f"the record ends with {_said(record.error)}; the script answered")
    unmade = calls.unmade()
    if unmade:
        n, call = unmade[0]
        raise Divergence(
            f"the record has {len(unmade)} call(s) the script did not make; the first: "
            f"call {n} (stage {call.stage!r})"
        )
    _same_answers(record, answers)
    return answers


def replay_file(
    path: str | Path, script: str | Path, entry: str | None = None, request_id: str | None = None
) -> list[Any]:
    """:func:`replay` the record in ``path`` (:func:`read`) through ``script`` (its entry
    ``entry``, or the one the record names), on asyncio; what ``bls replay`` runs."""
    record = read(path, request_id)
    loaded = ScriptFile(script, configured=False)
    name = entry or record.entry
    if name not in loaded.entries:
        raise Divergence(
            f"the record is of entry {record.entry!r} of {record.script}; "
            f"{loaded.path.name} has no entry {name!r} (it has: {', '.join(loaded.entries)})"
        )
    return anyio.run(replay, record, loaded.entries[name], loaded.declared)


def importable_from(entry: Script) -> Callable[[str], bool]:
    """Which modules a recorded result's type may be imported from, when the script has
    not loaded them (a stage's own module, which the record's bindings had loaded): bls's
    own, and those whose files lie in the script's folder. No other: a record names them,
    and a record may come from anywhere."""
    source = inspect.getsourcefile(entry.fn)
    folder = Path(source).resolve().parent if source else None

    def importable(module: str) -> bool:
        top = module.partition(".")[0]
        if top == "bls":
            return True
        if folder is None or not top.isidentifier():
            return False
        try:
            spec = importlib.util.find_spec(top)  # (a top-level name: nothing is run)
        except (ImportError, ValueError):
            return False
        origin = spec.origin if spec is not None else None
        return origin is not None and Path(origin).resolve().is_relative_to(folder)

    return importable


def _same_error(record: Record, exc: Exception) -> None:
    got = f"{exc}"
    if record.error is None:
        raise Divergence(f"the script failed where the record answered: {got}") from exc
    kind = ErrorKind.DEADLINE if isinstance(exc, DeadlineExceeded) else getattr(exc, "kind", "")
    stage = getattr(exc, "stage", record.error.stage)
    if kind != record.error.kind or (kind != ErrorKind.DEADLINE and stage != record.error.stage):
        raise Divergence(f"the record ends with {_said(record.error)}; the script: {got}") from exc


def _same_answers(record: Record, answers: list[Any]) -> None:
    if len(answers) != len(record.items):
        raise Divergence(
            f"the script gave {len(answers)} answer item(s); the record has {len(record.items)}"
        )
    for n, (want, got) in enumerate(zip(record.items, answers, strict=True), 1):
        sent = encode_value(got)
        if sent != want:
            which = "the result" if len(answers) == 1 else f"answer item {n}"
            raise Divergence(f"{which} differs {difference(want, sent)}")


def _said(error: RecordedError) -> str:
    return f"{error.kind} from stage {error.stage!r}: {error.message}"


def ordinal(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def difference(want: bytes, got: bytes) -> str:
    """Where two encoded values differ: ``at $.text: the record has 'Hi!', the script
    sent 'Hi'``."""
    path, expected, actual = _firstdifference(
        msgspec.msgpack.decode(want), msgspec.msgpack.decode(got), "$"
    )
    return f"at {path}: the record has {_show(expected)}, the script gave {_show(actual)}"


_MISSING = object()


def _firstdifference(want: Any, got: Any, path: str) -> tuple[str, Any, Any]:
    if isinstance(want, dict) and isinstance(got, dict):
        for key in [*want, *(k for k in got if k not in want)]:
            a, b = want.get(key, _MISSING), got.get(key, _MISSING)
            if a != b:
                return _firstdifference(a, b, f"{path}.{key}")
    elif isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            if a != b:
                return _firstdifference(a, b, f"{path}[{i}]")
    return path, want, got


def _show(value: Any) -> str:
    if value is _MISSING:
        return "nothing"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
