"""The stage API that scripts use: ``stage(name, req)``, ``stage.stream(...)``, typed handles.

Nothing here knows how a stage is bound; calls go through the current
:class:`bls.Runtime`, which may send them inline or over the wire.
"""

from __future__ import annotations

import sys
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar

from .messages import Signature
from .policy import PolicyError, policy_from
from .runtime import StageStream, current

__all__ = ["Stage", "StreamStage", "stage"]

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class _StageCaller:
    """``stage(name, req)`` and ``stage.stream(name, req)``."""

    __slots__ = ()

    def __call__(self, name: str, req: Any) -> Coroutine[Any, Any, Any]:
        """Call the unary stage ``name`` with ``req``; await it for the result.

        Cancelling the awaiting task cancels the stage's work wherever it runs. Raises
        :class:`bls.StageError` (the worker failed), :class:`bls.InvalidRequest` (the
        request did not validate, with the field path), :class:`bls.StageNotBound`.
        """
        return current().call(name, req)

    def stream(self, name: str, req: Any) -> StageStream:
        """Call the streaming stage ``name``; iterate the result for its items.

        Items arrive as the worker produces them, with flow control: a slow loop pauses
        the worker. Leaving the loop or cancelling closes the call.
        """
        return current().stream(name, req)

    def __repr__(self) -> str:
        return "bls.stage"


stage = _StageCaller()


class Stage(Generic[Req, Resp]):
    """A typed handle on a unary stage: ``encoder = bls.Stage("encoder", Image, Embedding)``.

    ``await encoder(req)`` is ``await stage("encoder", req)``, with the result in
    ``Resp``. The handle declares the types for the name to the runtime that serves the
    script: ``bls check``/``run``/``serve``/``worker`` find the handles among the script
    module's globals (imported ones too) and refuse a binding whose worker declares other
    types before the first request; results of untyped ``stage("encoder", ...)`` calls are
    converted to ``Resp`` too. A library user passes them as ``bls.Runtime(...,
    declared=[...])``; a handle it did not pass is checked at its first call.
    """

    streaming = False

    def __init__(
        self,
        name: str,
        request: type[Req],
        response: type[Resp],
        *,
        idempotent: bool = False,
        hedge: dict[str, Any] | None = None,
        retry: dict[str, Any] | None = None,
        affinity: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.request = request
        self.response = response
        self.signature = Signature(request=request, response=response, streaming=False)
        # Its traffic policy (docs/policy.md), unless bls.toml gives the stage one.
        knobs = {"idempotent": idempotent, "hedge": hedge, "retry": retry, "affinity": affinity}
        given = {k: v for k, v in knobs.items() if v not in (None, False)}
        try:
            self.policy = (
                policy_from(name, given, idempotent="`idempotent=True`") if given else None
            )
        except PolicyError as exc:  # said where the handle is made, as a config error is
            caller = sys._getframe(1)
            where = f"{caller.f_code.co_filename}:{caller.f_lineno}"
            raise PolicyError(f"{where}: bls.Stage({name!r}, ...): {exc}") from None

    def __call__(self, req: Req) -> Coroutine[Any, Any, Resp]:
        return current().call_declared(self.name, self.signature, req)

    def __repr__(self) -> str:
        return f"bls.{type(self).__name__}({self.name!r}, {self.request!r}, {self.response!r})"


class StreamStage(Generic[Req, Resp]):
    """A typed handle on a streaming stage: ``async for tok in generator(req)``."""

    streaming = True

    def __init__(self, name: str, request: type[Req], item: type[Resp]) -> None:
        self.name = name
        self.request = request
        self.item = item
        self.signature = Signature(request=request, response=item, streaming=True)

    def __call__(self, req: Req) -> StageStream:
        return current().stream_declared(self.name, self.signature, req)

    def __repr__(self) -> str:
        return f"bls.StreamStage({self.name!r}, {self.request!r}, {self.item!r})"
