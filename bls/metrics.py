"""Prometheus metrics for ``bls serve`` (``GET /metrics``), through ``prometheus-client``.

Each :class:`Metrics` has its own registry, so several frontends in one process (tests)
never share counters.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .tracing import Span

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Request latency spans sub-millisecond no-op scripts to minutes-long generations.
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """Request, stage and cancellation counters and latencies."""

    def __init__(self) -> None:
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}
        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            "bls_requests",
            "HTTP requests to script entries, by entry and status code",
            ["entry", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "bls_request_duration_seconds",
            "Time from request to the last byte of the response, by entry",
            ["entry"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self.inflight = Gauge(
            "bls_requests_in_flight", "Requests accepted and not yet answered", registry=registry
        )
        self.stage_calls = Counter(
            "bls_stage_calls", "Stage calls made by scripts, by stage", ["stage"], registry=registry
        )
        self.stage_errors = Counter(
            "bls_stage_errors",
            "Stage calls that failed, by stage and error kind",
            ["stage", "kind"],
            registry=registry,
        )
        self.stage_latency = Histogram(
            "bls_stage_duration_seconds",
            "Stage call duration (a stream: first request to last item), by stage",
            ["stage"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self.cancellations = Counter(
            "bls_cancellations",
            "Requests cancelled before they finished, by reason (disconnect, deadline, shutdown)",
            ["reason"],
            registry=registry,
        )

    def watch_caches(self, bindings: Mapping[str, Any]) -> None:
        """Export the hits, misses, evictions and size of the stages' result caches."""
        self.registry.register(_CacheCollector(bindings))

    def request(self, entry: str, status: int, seconds: float) -> None:
        key = (entry, status)
        children = self._children.get(key)
        if children is None:  # label lookups cost more than the updates: keep them
            children = (self.requests.labels(entry, str(status)), self.latency.labels(entry))
            self._children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def span(self, span: Span) -> None:
        """Count a finished stage span (the request's root span is not a stage call)."""
        if span.parent == 0 or span.remote:
            return
        self.stage_calls.labels(span.name).inc()
        self.stage_latency.labels(span.name).observe(span.end - span.start)
        if span.outcome != "ok":
            self.stage_errors.labels(span.name, span.kind or span.outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _CacheCollector:
    """Reads the cache counters at scrape time (the cache keeps them as plain ints)."""

    def __init__(self, bindings: Mapping[str, Any]) -> None:
        self.bindings = bindings

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from .cache import CachedBinding

        hits = CounterMetricFamily("bls_cache_hits", "Cache hits, by stage", labels=["stage"])
        misses = CounterMetricFamily(
            "bls_cache_misses", "Cache misses (worker calls), by stage", labels=["stage"]
        )
        evictions = CounterMetricFamily(
            "bls_cache_evictions", "Entries evicted to stay under capacity", labels=["stage"]
        )
        size = GaugeMetricFamily("bls_cache_bytes", "Bytes held by the cache", labels=["stage"])
        entries = GaugeMetricFamily("bls_cache_entries", "Entries in the cache", labels=["stage"])
        for name, binding in self.bindings.items():
            if isinstance(binding, CachedBinding):
                stats = binding.stats
                hits.add_metric([name], stats.hits)
                misses.add_metric([name], stats.misses)
                evictions.add_metric([name], stats.evictions)
                size.add_metric([name], stats.bytes)
                entries.add_metric([name], stats.entries)
        yield from (hits, misses, evictions, size, entries)
