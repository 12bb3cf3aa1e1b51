"""``@bls.script``: marking a function as an entrypoint that can be served and bound."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, overload

import msgspec

from .errors import ErrorKind, InvalidRequest, StageError
from .messages import (
    Signature,
    always_within_limits,
    beyond_limits,
    convert,
    field_hint,
    signature_of,
    type_name,
)

__all__ = ["Script", "entries", "script"]


class Script:
    """An entrypoint: an ``async def`` (unary) or async generator (streaming) function.

    Calling the object calls the function. A script can itself be bound as another
    script's stage, inline (``file.py:name``) or behind ``bls worker``.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str | None = None,
        openai: str | None = None,
        model: str | None = None,
    ):
        if not (inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)):
            raise TypeError(
                f"@bls.script needs an 'async def' function or async generator, got {fn!r}"
            )
        self.fn = fn
        self.name = name or fn.__name__
        self.openai = openai
        self.model = model
        self.signature: Signature = signature_of(fn)
        self.streaming = self.signature.streaming  # an async generator: items, not one result
        self._none_ok = _accepts_none(self.signature.response)
        # A request type that cannot hold a value beyond the limits is not checked each time.
        self._check_limits = not always_within_limits(self.signature.request)
        functools.update_wrapper(self, fn)

    def __call__(self, req: Any) -> Any:
        return self.fn(req)

    def __repr__(self) -> str:
        kind = "streaming" if self.streaming else "unary"
        return f"<bls.script {self.name} ({kind})>"

    def check_result(self, value: Any) -> Any:
        """``value``, unless the entry returned nothing against its declared type."""
        if value is None and not self._none_ok:
            declared = type_name(self.signature.response)
            raise StageError(
                self.name,
                ErrorKind.INVALID_RESPONSE,
                f"entry {self.name!r} returned None but is declared to return {declared}",
            )
        return value

    def decode(self, data: bytes | str) -> Any:
        """Decode a JSON request body into the entry's request type.

        Raises :class:`InvalidRequest` naming the entry and the field path, also for a
        value beyond the limits every binding can carry (:func:`beyond_limits`).
        """
        if not data.strip():
            raise InvalidRequest(self.name, f"the body is empty: {self._expects()}")
        try:
            req = msgspec.json.decode(data, type=self.signature.request)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            err = InvalidRequest.from_validation(self.name, exc)
            hint = field_hint(self.signature.request, data, err.message, err.path)
            raise InvalidRequest(self.name, err.message + hint, err.path) from None
        except RecursionError:
            raise InvalidRequest(self.name, "the request is nested too deeply") from None
        problem = beyond_limits(req) if self._check_limits else None
        if problem is not None:
            raise InvalidRequest(self.name, *problem)
        return req

    def _expects(self) -> str:
        """What the entry takes, said for a request that sent nothing."""
        tp = self.signature.request
        info = msgspec.inspect.type_info(tp) if tp is not Any else None
        if isinstance(info, msgspec.inspect.StructType):
            required = [f.encode_name for f in info.fields if f.required]
            fields = ", ".join(f"`{n}`" for n in required) or "none"
            return f"entry {self.name!r} expects a JSON object (required fields: {fields})"
        return f"entry {self.name!r} expects JSON ({type_name(tp)})"

    def coerce(self, req: Any) -> Any:
        """Convert an already-decoded value to the request type (InvalidRequest on failure)."""
        try:
            return convert(req, self.signature.request)
        except msgspec.ValidationError as exc:
            raise InvalidRequest.from_validation(self.name, exc) from None


def _accepts_none(tp: Any) -> bool:
    if tp is Any or tp is None or tp is type(None) or tp is object:
        return True
    return type(None) in typing.get_args(tp)


@overload
def script(fn: Callable[..., Any], /) -> Script: ...
@overload
def script(
    *, name: str | None = None, openai: str | None = None, model: str | None = None
) -> Callable[[Callable[..., Any]], Script]: ...
def script(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    openai: str | None = None,
    model: str | None = None,
) -> Script | Callable[[Callable[..., Any]], Script]:
    """Mark an entrypoint, bare (``@bls.script``) or with options.

    ``name`` overrides the function's name (the route is ``/v1/scripts/<name>``);
    ``openai="chat"`` also serves the entry at ``/v1/chat/completions``, and ``model``
    is the name ``GET /v1/models`` lists for it (default: the entry's name).
    """
    if fn is not None:
        return Script(fn)

    def wrap(f: Callable[..., Any]) -> Script:
        return Script(f, name=name, openai=openai, model=model)

    return wrap


def entries(module: Any) -> dict[str, Script]:
    """The entrypoints a module defines, by name, in definition order."""
    found: dict[str, Script] = {}
    for value in vars(module).values():
        if isinstance(value, Script) and value.fn.__module__ == module.__name__:
            if value.name in found and found[value.name] is not value:
                raise ValueError(f"two entrypoints are named {value.name!r} in {module.__name__}")
            found[value.name] = value
    return found
