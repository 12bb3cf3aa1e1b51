"""Prometheus metrics for ``bls serve`` (``GET /metrics``), through ``prometheus-client``.

The frontend runs on one event loop, so the counts are plain integers and lists updated
without locks on the request path (prometheus-client's own metric objects take a lock on
every update, which cost more than the rest of a small request's bookkeeping); a
collector turns them into Prometheus families when ``/metrics`` is scraped. Each
:class:`Metrics` has its own registry, so several frontends in one process never share
counts.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..bindings import Binding
from ..counts import cache_families
from ..tracing import Span
from .metrics_share import SharedMetrics

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Latencies span sub-millisecond no-op scripts to minutes-long generations.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _Histogram:
    """Bucket counts, sum and count of one labelled series (and, for a request series,
    its count by status code)."""

    __slots__ = ("buckets", "count", "statuses", "sum")

    def __init__(self) -> None:
        self.buckets = [0] * (len(BUCKETS) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0
        self.statuses: dict[int, int] = {}

    def observe(self, value: float) -> None:
        self.buckets[bisect.bisect_left(BUCKETS, value)] += 1
        self.sum += value
        self.count += 1

    def family_samples(self) -> tuple[list[tuple[str, float]], float]:
        cumulative: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*BUCKETS, float("inf")), self.buckets, strict=True):
            running += n
            cumulative.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return cumulative, self.sum


class Metrics:
    """Request, stage and cancellation counts and latencies of one frontend."""

    def __init__(
        self, inflight: Callable[[], int] = lambda: 0, queued: Callable[[], int] = lambda: 0
    ) -> None:
        # By entry: latencies, and counts by status. By stage: latencies (and so counts).
        self.latency: dict[str, _Histogram] = {}
        self.stage_errors: dict[tuple[str, str], int] = {}
        self.stage_latency: dict[str, _Histogram] = {}
        self.cancellations: dict[str, int] = {}
        self.version_calls: dict[tuple[str, str, str], int] = {}  # stage, version, outcome
        self.version_seconds: dict[tuple[str, str], float] = {}
        self._inflight = inflight
        self._queued = queued
        self._bindings: Mapping[str, Binding] = {}
        self._runs: Any = None  # a .runs.Runs: its live runs and outcomes
        self._records: Any = None  # a bls.record_writer.RecordWriter: its counts
        self.shared: SharedMetrics | None = None  # one of several processes' (--processes)
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def request(self, entry: str, status: int, seconds: float) -> None:
        hist = self.latency.get(entry)
        if hist is None:
            hist = self.latency[entry] = _Histogram()
        statuses = hist.statuses
        statuses[status] = statuses.get(status, 0) + 1
        hist.observe(seconds)

    def cancelled(self, reason: str) -> None:
        """A request cancelled before it finished: ``disconnect``, ``deadline``, ``shutdown``."""
        self.cancellations[reason] = self.cancellations.get(reason, 0) + 1

    def span(self, span: Span) -> None:
        """Count a finished stage span (the request's root span is not a stage call)."""
        if span.parent == 0 or span.remote or span.attempt:  # (an attempt: its call counts)
            return
        name = span.name
        hist = self.stage_latency.get(name)
        if hist is None:
            hist = self.stage_latency[name] = _Histogram()
        hist.observe(span.end - span.start)
        if span.outcome != "ok":
            key = (name, span.kind or span.outcome)
            self.stage_errors[key] = self.stage_errors.get(key, 0) + 1
        if span.version:  # a stage split between versions: each counted on its own
            outcome = span.outcome if span.outcome != "error" else span.kind or "error"
            counted = (name, span.version, outcome)
            self.version_calls[counted] = self.version_calls.get(counted, 0) + 1
            timed = (name, span.version)
            self.version_seconds[timed] = self.version_seconds.get(timed, 0.0) + (
                span.end - span.start
            )

    def watch_bindings(self, bindings: Mapping[str, Binding]) -> None:
        """Also export what each stage counts (its policy, its cache: Binding.counts())."""
        self._bindings = bindings

    def watch_runs(self, runs: Any) -> None:
        """Also export the background runs (:class:`.runs.Runs`): those running here, and
        how many ended here, by status."""
        self._runs = runs

    def watch_records(self, records: Any) -> None:
        """Also export what ``bls serve --record`` did with the requests' records
        (:class:`bls.record_writer.RecordWriter`'s counts)."""
        self._records = records

    def render(self) -> bytes:
        """The Prometheus text: this process's; with siblings (``bls serve --processes``,
        :attr:`shared`), all of theirs merged in."""
        own = generate_latest(self.registry)
        return own if self.shared is None else self.shared.merged(own)

    def render_own(self) -> bytes:
        return generate_latest(self.registry)

    # -- the collector prometheus-client calls at scrape time ------------------------------

    def describe(self) -> list[Any]:
        return []  # families are only known at scrape time

    def collect(self) -> Iterator[Any]:
        requests = CounterMetricFamily(
            "bls_requests",
            "HTTP requests to script entries, by entry and status code",
            labels=["entry", "status"],
        )
        for entry, hist in self.latency.items():
            for status, n in hist.statuses.items():
                requests.add_metric([entry, str(status)], n)
        yield requests
        yield _histograms(
            "bls_request_duration_seconds",
            "Time from request to the last byte of the response, by entry",
            "entry",
            self.latency,
        )
        yield GaugeMetricFamily(
            "bls_requests_in_flight",
            "Requests accepted and not yet answered",
            value=self._inflight(),
        )
        yield GaugeMetricFamily(
            "bls_requests_queued",
            "Requests waiting for a slot ([admission] max_queued)",
            value=self._queued(),
        )
        if self._runs is not None:
            yield from _runs(self._runs)
        if self._records is not None:
            yield from _records(self._records)
        yield _counter(
            "bls_stage_calls",
            "Stage calls made by scripts, by stage",
            ["stage"],
            {(k,): hist.count for k, hist in self.stage_latency.items()},
        )
        yield _counter(
            "bls_stage_errors",
            "Stage calls that failed, by stage and error kind",
            ["stage", "kind"],
            self.stage_errors,
        )
        yield _histograms(
            "bls_stage_duration_seconds",
            "Stage call duration (a stream: first request to last item), by stage",
            "stage",
            self.stage_latency,
        )
        yield _counter(
            "bls_cancellations",
            "Requests cancelled before they finished, by reason (disconnect, deadline, shutdown)",
            ["reason"],
            {(k,): v for k, v in self.cancellations.items()},
        )
        if self.version_calls:
            yield _counter(
                "bls_stage_version_calls",
                "Calls of a stage split between versions, by version and outcome",
                ["stage", "version", "outcome"],
                self.version_calls,
            )
            yield _counter(
                "bls_stage_version_seconds",
                "Time those calls took, by version (divided by the calls: the mean)",
                ["stage", "version"],
                self.version_seconds,
            )
        yield from _caches(self._bindings)
        yield from _traffic(self._bindings)


def _counter(
    name: str, doc: str, labels: list[str], counts: Mapping[Any, float]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for values, n in counts.items():
        family.add_metric(list(values), n)
    return family


def _histograms(
    name: str, doc: str, label: str, series: Mapping[str, _Histogram]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=[label])
    for value, hist in series.items():
        buckets, total = hist.family_samples()
        family.add_metric([value], buckets, total)
    return family


def _runs(runs: Any) -> Iterator[Any]:
    """The background runs (a :class:`.runs.Runs`): running here, ended here, and what
    their store takes."""
    yield GaugeMetricFamily(
        "bls_runs_in_flight",
        "Background runs running in this frontend",
        value=len(runs.live),
    )
    yield _counter(
        "bls_runs_ended",
        "Background runs this frontend ended, by status",
        ["status"],
        {(k,): n for k, n in runs.outcomes.items()},
    )
    if runs.used_bytes is not None:
        yield GaugeMetricFamily(
            "bls_runs_store_bytes",
            "What the SQLite runs store takes on disk, read every 5 s ([runs] max_bytes)",
            value=runs.used_bytes,
        )


def _records(records: Any) -> Iterator[Any]:
    """The requests' records (``bls serve --record``) by what became of them."""
    outcomes = ("written", "dropped", "failed", "lost")
    yield _counter(
        "bls_records",
        "Requests' records (--record): written; dropped, the writer not keeping up; failed, "
        "the disk refusing them or a value no encoder takes; lost with a writer that died",
        ["outcome"],
        {(outcome,): getattr(records, outcome) for outcome in outcomes},
    )
    yield _counter(
        "bls_records_incomplete",
        "Records written that left out a value (Record.unrecorded): not replayed",
        [],
        {(): records.incomplete},
    )


def _caches(bindings: Mapping[str, Binding]) -> Iterator[Any]:
    """What each stage's result cache did and holds (bls/cache.py)."""
    return cache_families({n: c for n, b in bindings.items() if (c := b.counts().cache)})


def _traffic(bindings: Mapping[str, Binding]) -> Iterator[Any]:
    """What each stage's traffic policy did (bls/policy.py), by version ("" for a stage
    without versions: Prometheus reads an empty label as none)."""
    counts = {
        (name, version): traffic
        for name, binding in bindings.items()
        for version, traffic in binding.counts().traffic.items()
    }
    if not counts:
        return
    for field, doc in (
        ("hedges", "Extra copies of calls sent by hedging, by stage"),
        ("hedges_won", "Calls a hedged copy answered first, by stage"),
        ("hedges_cancelled", "Hedged copies cancelled when another answered first, by stage"),
        ("retries", "Calls retried after a failure, by stage"),
        ("retries_denied", "Retries not made because the retry budget was spent, by stage"),
        ("ejections", "Replicas taken out of rotation (failing or lagging), by stage"),
    ):
        yield _counter(
            f"bls_stage_{field}",
            doc,
            ["stage", "version"],
            {key: getattr(t, field) for key, t in counts.items()},
        )
