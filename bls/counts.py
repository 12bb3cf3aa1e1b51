"""What a stage's binding counts, for ``/metrics``: what its traffic policy did
(:class:`Traffic`, per version) and what its result cache holds (:class:`CacheStats`),
answered by every kind of binding through one hook (:meth:`bls.bindings.Binding.counts`),
so that nothing has to look inside a binding for them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

__all__ = ["CacheStats", "StageCounts", "Traffic", "cache_families"]


class Traffic(msgspec.Struct):
    """What a stage's policy did, for ``/metrics``."""

    # Extra copies sent = those that won + those cancelled + those that failed.
    hedges: int = 0  # extra copies sent
    hedges_won: int = 0  # calls a copy answered first
    hedges_cancelled: int = 0  # copies cancelled when the original (or another copy) answered
    retries: int = 0
    retries_denied: int = 0  # not made: the budget was spent
    ejections: int = 0


class CacheStats(msgspec.Struct):
    """A stage's result cache: hits, misses, evictions, and what it holds now."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes: int = 0
    entries: int = 0


class StageCounts(msgspec.Struct):
    """A binding's counts: its policy's, by version ("" for a stage without versions;
    none where no policy acts), and its cache's (None without one)."""

    traffic: dict[str, Traffic] = {}
    cache: CacheStats | None = None


def cache_families(caches: Mapping[str, CacheStats]) -> Iterator[Any]:
    """The Prometheus families of stages' result caches (``bls_cache_*``, by stage):
    a frontend's (``bls serve``) and a worker's (``bls worker --cache``) alike."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    if not caches:
        return
    for field, kind, doc in (
        ("hits", CounterMetricFamily, "Cache hits, by stage"),
        ("misses", CounterMetricFamily, "Cache misses (worker calls), by stage"),
        ("evictions", CounterMetricFamily, "Entries evicted to stay under capacity"),
        ("bytes", GaugeMetricFamily, "Bytes held by the cache"),
        ("entries", GaugeMetricFamily, "Entries in the cache"),
    ):
        family = kind(f"bls_cache_{field}", doc, labels=["stage"])
        for name, stats in caches.items():
            family.add_metric([name], getattr(stats, field))
        yield family
