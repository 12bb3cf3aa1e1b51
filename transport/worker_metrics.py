"""``bls worker --metrics-port``: how loaded a worker is, in Prometheus text, for an
autoscaler to scale its stage on (deploy/k8s/autoscaling.yaml, docs/deploy.md); and what
its result cache did, when it keeps one (``--cache``).

Served from a thread of its own (:mod:`.scrapes`), so a scrape never waits on the event
loop, nor the loop on a scrape; it only reads counters the loop keeps.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from bls.counts import cache_families

from .scrapes import ScrapeServer
from .worker_server import WorkerServer

__all__ = ["serve_metrics"]

log = logging.getLogger("bls.worker")


class _Load:
    """The collector: one worker's load, labelled with its stage."""

    def __init__(self, server: WorkerServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Any]:
        server, stage = self.server, [self.server.stage]
        gauges = (
            ("bls_worker_inflight_calls", "Calls taken and not yet answered", server.inflight),
            ("bls_worker_queued_calls", "Calls taken and not yet started", server.queued),
            ("bls_worker_max_inflight", "Calls it holds at once (--max-inflight)",
             server.max_inflight),
            ("bls_worker_max_running", "Calls it runs at once (--max-running)",
             server.max_running),
            ("bls_worker_busy_ratio", "Share of the last 10 s with a call in flight",
             busy_ratio(server)),
        )  # fmt: skip
        for name, doc, value in gauges:
            family = GaugeMetricFamily(name, doc, labels=["stage"])
            family.add_metric(stage, value)
            yield family
        busy = CounterMetricFamily(
            "bls_worker_busy_seconds", "Seconds with a call in flight", labels=["stage"]
        )
        busy.add_metric(stage, server.busy_seconds())
        yield busy
        calls = CounterMetricFamily(
            "bls_worker_calls", "Calls by how they ended", labels=["stage", "outcome"]
        )
        stats = server.stats
        for outcome in ("completed", "failed", "cancelled", "deadline", "rejected"):
            calls.add_metric([server.stage, outcome], getattr(stats, outcome))
        yield calls
        cache = server.binding.counts().cache  # (bls worker --cache)
        yield from cache_families({server.stage: cache} if cache is not None else {})


def busy_ratio(server: WorkerServer) -> float:
    """The share of the sampled window (up to 10 s) with a call in flight."""
    samples = server.busy_samples
    if len(samples) < 2:
        return 0.0
    (t0, busy0), (t1, busy1) = samples[0], samples[-1]
    return min(1.0, max(0.0, (busy1 - busy0) / (t1 - t0))) if t1 > t0 else 0.0


def serve_metrics(server: WorkerServer, host: str, port: int) -> tuple[str, Callable[[], None]]:
    """Serve ``/metrics`` on ``host:port`` (0: a free port): its URL, and what stops it."""
    registry = CollectorRegistry()
    registry.register(_Load(server))
    scrapes = ScrapeServer(lambda: generate_latest(registry), CONTENT_TYPE_LATEST, host, port)
    scrapes.start()
    url = f"http://{host}:{scrapes.port}/metrics"
    log.info("stage %r: metrics on %s", server.stage, url)
    return url, scrapes.stop
