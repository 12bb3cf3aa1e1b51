"""Affinity by key, shared-nothing: calls with the same key go to the same replica, chosen
by rendezvous hashing with a bounded load, so every frontend (process or host) that sees
the same replicas picks the same one for a key without talking to the others.

``[stages.NAME]`` in ``bls.toml`` (or ``bls.Stage(..., affinity=...)``)::

    affinity = { field = "session" }               # a field of the stage's request
    affinity = { header = "X-Session-Id" }         # a header of the HTTP request
    affinity = { function = "keys.py:session_of" } # a function of the request
    affinity = { field = "session", balance = 1.25 }

Each replica's score for a key is a hash of the two; the key goes to the replica with the
highest score that is in rotation and not over ``balance`` times the mean number of
calls outstanding (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded
Loads", 2018): a hot key spills to its next choice rather than swamp one replica, and a
replica that joins or leaves moves only the keys it wins or held. A call with no key (the
field unset, the function's None) is placed as any other call, on the replica with the
fewest calls outstanding. A header keys only the calls made for an HTTP request (``bls
serve``); others have no key.
"""

from __future__ import annotations

import hashlib
import importlib
import math
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Protocol, TypeVar

import msgspec

from .messages import field_of
from .scope import NO_CONTEXT, CallContext

__all__ = ["Affinity", "Placed", "key_of", "place"]


class Affinity(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, dict=True):
    """Where a call's key comes from (one of ``field``, ``header`` and ``function``), and how far
    above the mean load its replica may be before the key spills (``balance`` ≥ 1)."""

    field: str | None = None
    header: str | None = None  # of the HTTP request the call is made for
    function: str | None = None  # "module:attr" or "file.py:attr"
    balance: Annotated[float, msgspec.Meta(ge=1.0, le=100.0)] = 1.25

    def __post_init__(self) -> None:
        if sum(source is not None for source in (self.field, self.header, self.function)) != 1:
            raise ValueError("give one of field, header or function")
        self._key: Callable[[Any], Any] | None = None
        self._header = self.header.lower().encode() if self.header is not None else b""

    def use(self, function: Callable[[Any], Any]) -> None:
        """The function ``function`` names, as whoever read it resolved it (bls.toml's
        loader: a ``file.py:attr`` relative to the file)."""
        if not callable(function):
            raise ValueError(f"function: {self.function!r} is not a function")
        self._key = function

    def key_function(self) -> Callable[[Any], Any]:
        """The function, imported at first use when nobody resolved it (``module:attr``,
        as ``bls.Stage(..., affinity=...)`` names one)."""
        if self._key is None:
            module, _, attr = (self.function or "").rpartition(":")
            self.use(getattr(importlib.import_module(module), attr))
        assert self._key is not None
        return self._key


def key_of(affinity: Affinity, req: Any, ctx: CallContext = NO_CONTEXT) -> bytes | None:
    """The key of a call (its request's field, the header of the HTTP request it is made
    for, or what the function says of its request; None: no key), as bytes: a string's
    UTF-8, bytes themselves, anything else its JSON."""
    if affinity.header is not None:
        return next((bytes(v) for k, v in ctx.headers if k == affinity._header), None)
    if affinity.function is not None:
        value = affinity.key_function()(req)
    else:
        value = field_of(req, affinity.field or "")
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes):
        return value
    return msgspec.json.encode(value)


class Placed(Protocol):
    """A replica as placing sees it: its name (the same in every frontend) and its load."""

    @property
    def address(self) -> str: ...

    @property
    def load(self) -> int: ...


P = TypeVar("P", bound=Placed)


def place(key: bytes, replicas: Sequence[P], balance: float, outstanding: int) -> P | None:
    """The replica for ``key`` among ``replicas`` (those that may take the call): the
    highest score whose load is under ``balance`` times the mean, counting this call
    (``outstanding``: the calls on all the stage's replicas now)."""
    if not replicas:
        return None
    capacity = math.ceil(balance * (outstanding + 1) / len(replicas))
    digest = hashlib.blake2b(key, digest_size=16).digest()
    ranked = sorted(replicas, key=lambda r: _score(digest, r.address), reverse=True)
    for replica in ranked:
        if replica.load < capacity:
            return replica
    return ranked[0]  # (cannot happen: some replica is at or under the mean)


def _score(digest: bytes, address: str) -> bytes:
    return hashlib.blake2b(digest + address.encode(), digest_size=8).digest()
