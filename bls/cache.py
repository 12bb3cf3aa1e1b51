"""The result cache a binding can put in front of any unary stage (the embedding cache).

    [stages.encoder]
    inline = "bls.models.encoder:VisionEncoder"
    cache = { capacity_mb = 512 }

The script does not change: a hit returns the stored result without calling the worker.
Keys are a content hash (BLAKE2b) of the encoded request — arrays and tensors by dtype,
shape and bytes — together with the stage's identity: its name, binding and options, so
two encoders with other models or preprocessing never share entries. Never object
identity.

- Byte-bounded LRU: ``capacity_mb`` caps the encoded size of the stored results; the least
  recently used go first. A result larger than the whole cache is not stored.
- Single flight: concurrent identical misses call the worker once; the others wait for that
  result (or its error). If the caller computing it is cancelled, a waiter takes over.
- Partial hits: with ``items = "images"`` (a list field of the request) and
  ``results = "embeddings"`` (the response's list field, one result per item), each item is
  cached on its own; a request computes only its missing items, in one call, and gets the
  full list back in order.

Results are shared between callers: treat them as read-only.

A script that wants to know whether its calls hit the cache (to report it, or to measure
what the cache saves) wraps them in :func:`cache_report`::

    with bls.cache_report() as report:
        emb = await encoder(EncodeRequest(image=image))
    report.hits, report.misses  # items served from the cache, and computed
"""

from __future__ import annotations

import collections
import contextvars
import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.abc
import msgspec

from .bindings import Binding, Wrapper
from .counts import CacheStats, StageCounts
from .errors import ErrorKind, InvalidRequest, StageError
from .messages import convert
from .scope import NO_CONTEXT, CallContext

__all__ = [
    "CacheOptions",
    "CacheReport",
    "CacheStats",
    "CachedBinding",
    "cache_report",
    "content_key",
]


def content_key(req: Any) -> bytes:
    """An affinity key for a cached stage (``affinity = { function =
    "bls.cache:content_key" }``, :mod:`bls.affinity`): the content hash of the request as
    the script sends it (its arrays and tensors by dtype, shape and bytes, as the cache
    hashes them), so that every frontend sends one image to the one replica whose cache
    (``bls worker --cache``) holds it."""
    return hashlib.blake2b(_encoder.encode(req), digest_size=20).digest()


class CacheOptions(msgspec.Struct, forbid_unknown_fields=True):
    """``cache = { ... }`` in a ``[stages.NAME]`` table."""

    capacity_mb: float = 256.0
    items: str | None = None
    results: str | None = None


class CacheReport(msgspec.Struct):
    """What the cached stage calls inside a :func:`cache_report` block found: per item
    (one per call; one per list item with ``items = ...``)."""

    hits: int = 0  # served from the cache, or from an identical call already running
    misses: int = 0  # computed by the worker


_report: contextvars.ContextVar[CacheReport | None] = contextvars.ContextVar(
    "bls_cache_report", default=None
)


@contextmanager
def cache_report() -> Iterator[CacheReport]:
    """Count the cache hits and misses of the stage calls made inside the block (in this
    task and the tasks it starts there, e.g. ``bls.gather``). Calls to stages without a
    cache count nothing."""
    report = CacheReport()
    token = _report.set(report)
    try:
        yield report
    finally:
        _report.reset(token)


def _hook(obj: Any) -> Any:
    """Arrays and tensors as (dtype, shape, bytes): equal contents, equal keys."""
    kind = type(obj).__module__
    if kind.startswith("torch"):
        obj = obj.detach().cpu().contiguous().numpy()
        kind = "numpy"
    if kind == "numpy" and hasattr(obj, "tobytes"):
        return (str(obj.dtype), list(obj.shape), obj.tobytes())
    raise TypeError(f"cannot hash a value of type {type(obj).__qualname__} for the cache")


_encoder = msgspec.msgpack.Encoder(enc_hook=_hook, order="deterministic")


def _size(value: Any) -> int:
    try:
        return len(_encoder.encode(value))
    except TypeError:
        return 1024  # unknown shape: count it as something


class _Flight:
    """One key being computed; waiters wait on ``done``."""

    __slots__ = ("done", "error", "ok", "value")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.ok = False
        self.value: Any = None
        self.error: BaseException | None = None


def _get(obj: Any, field: str) -> Any:
    return obj[field] if isinstance(obj, dict) else getattr(obj, field)


def _with(obj: Any, field: str, value: Any) -> Any:
    if isinstance(obj, dict):
        return {**obj, field: value}
    return msgspec.structs.replace(obj, **{field: value})


class CachedBinding(Wrapper):
    """``inner`` (a unary binding) behind a byte-bounded, single-flight LRU cache."""

    def __init__(self, inner: Binding, options: CacheOptions, identity: dict[str, Any]) -> None:
        if (options.items is None) != (options.results is None):
            raise ValueError("cache: 'items' and 'results' go together (or neither)")
        if options.capacity_mb <= 0:
            raise ValueError("cache: capacity_mb must be positive")
        super().__init__(inner)
        self.options = options
        self.capacity = int(options.capacity_mb * 1024 * 1024)
        self.stats = CacheStats()
        self._identity = json.dumps(identity, sort_keys=True, default=str).encode()
        self._lru: collections.OrderedDict[bytes, tuple[Any, int]] = collections.OrderedDict()
        self._flights: dict[bytes, _Flight] = {}

    # -- what differs from the inner binding -------------------------------------------

    @property
    def description(self) -> str:  # type: ignore[override]
        return f"{self.inner.description}, cached"

    def _unary_only(self) -> str:
        if self.inner.signature.streaming:
            return f"stage {self.name!r}: a cache goes in front of unary stages only"
        return ""

    async def open(self, tg: anyio.abc.TaskGroup | None = None) -> None:
        await self.inner.open(tg)
        if problem := self._unary_only():
            raise OSError(problem)

    def resolve_later(self, check: Callable[[], list[str]]) -> bool:
        def checked() -> list[str]:
            problem = self._unary_only()
            return [problem] if problem else check()

        return self.inner.resolve_later(checked)

    # -- the cache --------------------------------------------------------------------

    def _key(self, *parts: Any) -> bytes:
        digest = hashlib.blake2b(self._identity, digest_size=20)
        for part in parts:
            digest.update(_encoder.encode(part))
        return digest.digest()

    def _lookup(self, key: bytes) -> tuple[bool, Any]:
        entry = self._lru.get(key)
        if entry is None:
            return False, None
        self._lru.move_to_end(key)
        return True, entry[0]

    def _store(self, key: bytes, value: Any) -> None:
        size = _size(value)
        if size > self.capacity or key in self._lru:
            return
        self._lru[key] = (value, size)
        self.stats.bytes += size
        while self.stats.bytes > self.capacity:
            _, (_, dropped) = self._lru.popitem(last=False)
            self.stats.bytes -= dropped
            self.stats.evictions += 1
        self.stats.entries = len(self._lru)

    async def call(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        return await self.invoke(req, ctx)

    def counts(self) -> StageCounts:
        return msgspec.structs.replace(self.inner.counts(), cache=self.stats)

    async def invoke(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        # The worker's own type first: a dict and a message with the same content (and
        # the defaults filled in) are the same request.
        try:
            req = convert(req, self.inner.signature.request)
        except msgspec.ValidationError as exc:
            raise InvalidRequest.from_validation(self.name, exc) from None
        field = self.options.items
        if field is None:
            (value,) = await self._resolve([self._key(req)], req, None, ctx)
            return value
        try:
            items = list(_get(req, field))
        except (AttributeError, KeyError, TypeError):
            raise self._misconfigured(f"the request has no list field {field!r}") from None
        base = _with(req, field, [])
        values = await self._resolve([self._key(base, item) for item in items], req, items, ctx)
        results_field = self.options.results
        assert results_field is not None
        try:
            return self.result({results_field: values})
        except Exception:
            raise self._misconfigured(
                f"the response cannot be rebuilt from its {results_field!r} list alone"
            ) from None

    def _misconfigured(self, why: str) -> Exception:
        return StageError(
            self.name, ErrorKind.CACHE_CONFIG, f"cache items={self.options.items!r}: {why}"
        )

    async def _resolve(
        self, keys: list[bytes], req: Any, items: list[Any] | None, ctx: CallContext
    ) -> list[Any]:
        """Values for ``keys``: hits, waits on flights, and one call for the rest."""
        missing = object()
        values: list[Any] = [missing] * len(keys)
        report = _report.get()
        computed = 0
        while True:
            mine: dict[bytes, list[int]] = {}
            theirs: list[tuple[int, _Flight]] = []
            for i, key in enumerate(keys):
                if values[i] is not missing:
                    continue
                found, value = self._lookup(key)
                if found:
                    values[i] = value
                    self.stats.hits += 1
                elif key in mine:
                    mine[key].append(i)  # the same item twice in one request
                elif key in self._flights:
                    theirs.append((i, self._flights[key]))
                else:
                    mine[key] = [i]
            if mine:
                await self._compute(mine, req, items, values, ctx)
                computed += sum(len(positions) for positions in mine.values())
            for i, flight in theirs:
                await flight.done.wait()
                if flight.ok:
                    values[i] = flight.value
                    self.stats.hits += 1
                elif flight.error is not None:
                    raise flight.error
                # else: its caller was cancelled; go round again and compute it ourselves
            if all(v is not missing for v in values):
                if report is not None:
                    report.misses += computed
                    report.hits += len(values) - computed
                return values

    async def _compute(
        self,
        mine: dict[bytes, list[int]],
        req: Any,
        items: list[Any] | None,
        values: list[Any],
        ctx: CallContext,
    ) -> None:
        flights = {key: _Flight() for key in mine}
        self._flights.update(flights)
        self.stats.misses += len(mine)
        try:
            if items is None:
                results = [await self.inner.invoke(req, ctx)]
            else:
                wanted = [items[positions[0]] for positions in mine.values()]
                assert self.options.items is not None and self.options.results is not None
                answer = await self.inner.invoke(_with(req, self.options.items, wanted), ctx)
                results = list(_get(answer, self.options.results))
                if len(results) != len(wanted):
                    raise self._misconfigured(
                        f"the worker returned {len(results)} results for {len(wanted)} items"
                    )
        except BaseException as exc:
            for flight in flights.values():
                flight.error = exc if isinstance(exc, Exception) else None
                flight.done.set()
            raise
        finally:
            for key in flights:
                self._flights.pop(key, None)
        for (key, positions), value in zip(mine.items(), results, strict=True):
            self._store(key, value)
            for i in positions:
                values[i] = value
            flight = flights[key]
            flight.ok, flight.value = True, value
            flight.done.set()
