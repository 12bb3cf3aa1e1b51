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
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from .bindings import Binding
from .cache import CachedBinding
from .check import find_stage_uses, typed_handles
from .entry import Script
from .errors import DeadlineExceeded, ErrorKind, InvalidRequest, StageError, StageNotBound
from .fakes import Call, CallLog, Calls, FakeBinding, cached, each, inferred, streams
from .messages import Signature
from .models.fakellm import FakeLLM, FakeOptions
from .recording import Record
from .replay import Divergence, read
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


_active: contextvars.ContextVar[_Fakes | None] = contextvars.ContextVar("bls_fakes", default=None)


class _Fakes:
    def __init__(self, stages: Mapping[str, Any]) -> None:
        self.stages = dict(stages)
        self.log = CallLog()
        self.calls = self.log.calls
        self.made: dict[str, Binding] = {}  # a faked stage's binding, kept for the block

    def binding(self, name: str, sig: Signature) -> Binding:
        made = self.made.get(name)
        if made is None:
            spec = self.stages[name]
            if isinstance(spec, cached):
                inner = FakeBinding(name, spec.spec, sig, self.log)
                made = CachedBinding(inner, spec.options, identity={"fake": name})
            else:
                made = FakeBinding(name, spec, sig, self.log)
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


async def replay(
    path: str | Path, entry: Script | None = None, *, request_id: str | None = None
) -> Any:
    """Run the recorded request in ``path`` again, every stage answered from the record,
    through ``entry`` (default: the entry the record names, in the script file it was
    recorded from): what :func:`call` returns, a unary entry's result or the list of a
    streaming entry's items. ``path`` is a ``.blsrec`` file, or a ``bls serve --record``
    folder (or one of its segments) with the ``request_id`` to replay. Raises
    :class:`Divergence` (an AssertionError) naming the first difference; a request that
    failed in the record fails the same way again."""
    record = read(path, request_id)
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
    if error.kind == ErrorKind.DEADLINE:
        return DeadlineExceeded(error.message)
    if error.kind == ErrorKind.INVALID_REQUEST:
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
        streaming = sig.streaming if sig else used.get(name, streams(fakes.stages.get(name)))
        if sig is None:
            sig = inferred(fakes.stages.get(name), streaming)
        if name in fakes.stages:
            bindings[name] = fakes.binding(name, sig)
        else:
            bindings[name] = _Unfaked(name, sig, fakes)
    return Runtime(bindings, declared=list(typed_handles(module)) if module else [])


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
