"""The Prometheus metrics of `bls serve`: what each counter counts."""

from __future__ import annotations

from bls.serve.metrics import Metrics
from bls.tracing import Trace


def _value(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    prefix = f"{name}{{{want}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{prefix!r} is not in the metrics:\n{text}")


def test_requests_stage_calls_errors_and_cancellations_are_counted() -> None:
    inflight = [2]
    metrics = Metrics(lambda: inflight[0])
    trace = Trace("r1", "describe", metrics.span)
    root = trace.open("describe", 0, "script")
    for outcome, kind in (("ok", ""), ("error", "ValueError"), ("cancelled", "")):
        span = trace.open("encoder", root.id, "inline x")
        trace.close(span, outcome, kind)
    remote = trace.open("encoder", root.id, "worker")  # a worker-reported span
    remote.remote = True
    trace.close(remote, "ok")
    trace.close(root, "ok")  # the request itself is no stage call
    metrics.request("describe", 200, 0.003)
    metrics.request("describe", 499, 0.2)
    metrics.cancelled("disconnect")

    text = metrics.render().decode()
    assert _value(text, "bls_requests_total", entry="describe", status="200") == 1
    assert _value(text, "bls_requests_total", entry="describe", status="499") == 1
    assert _value(text, "bls_request_duration_seconds_count", entry="describe") == 2
    assert _value(text, "bls_stage_calls_total", stage="encoder") == 3
    assert _value(text, "bls_stage_errors_total", stage="encoder", kind="ValueError") == 1
    assert _value(text, "bls_stage_errors_total", stage="encoder", kind="cancelled") == 1
    assert _value(text, "bls_cancellations_total", reason="disconnect") == 1
    assert _value(text, "bls_requests_in_flight") == 2
    assert "describe" not in [
        line.split('stage="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("bls_stage_calls_total{")
    ]


def test_latency_buckets_are_cumulative() -> None:
    metrics = Metrics()
    for seconds in (0.0004, 0.003, 0.003, 7.0):
        metrics.request("e", 200, seconds)
    text = metrics.render().decode()
    assert _value(text, "bls_request_duration_seconds_bucket", entry="e", le="0.0005") == 1
    assert _value(text, "bls_request_duration_seconds_bucket", entry="e", le="0.005") == 3
    assert _value(text, "bls_request_duration_seconds_bucket", entry="e", le="+Inf") == 4
    assert abs(_value(text, "bls_request_duration_seconds_sum", entry="e") - 7.0064) < 1e-9


def test_two_frontends_never_share_counts() -> None:
    a, b = Metrics(), Metrics()
    a.request("e", 200, 0.01)
    assert "bls_requests_total{" not in b.render().decode()
