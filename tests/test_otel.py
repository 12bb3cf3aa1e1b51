"""Request traces exported as OpenTelemetry spans (bls.serve.otel)."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from bls.serve.otel import Exporter
from bls.tracing import Span, Trace


def test_a_request_becomes_one_trace_with_nested_stage_spans() -> None:
    trace = Trace("req-1", "describe")
    root = trace.open("describe", 0, "script")
    encoder = trace.open("encoder", root.id, "remote tcp://a")
    encoder.replica = "tcp://a"
    trace.close(encoder, "ok")
    worker = Span(
        id=1,
        parent=0,
        name="encoder",
        binding="worker",
        start=encoder.start,
        end=encoder.end,
        outcome="ok",
    )
    trace.adopt([worker], encoder.id)
    judge = trace.open("judge", root.id, "inline judge")
    trace.close(judge, "error", "ValueError")
    trace.status = 502
    trace.close(root, "error", "stage_error")

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    Exporter(provider)(trace)

    finished = memory.get_finished_spans()
    assert sorted(s.name for s in finished) == [
        "request describe",
        "stage encoder",
        "stage encoder",  # the caller's span and the worker's, reported back
        "stage judge",
    ]
    spans = {s.name: s for s in finished}
    request = spans["request describe"]
    assert request.parent is None
    assert request.attributes["bls.request_id"] == "req-1"
    assert request.attributes["http.response.status_code"] == 502
    trace_ids = {s.context.trace_id for s in finished}
    assert len(trace_ids) == 1
    stage_encoder = next(
        s for s in finished if s.name == "stage encoder" and not s.attributes["bls.remote"]
    )
    remote = next(s for s in finished if s.attributes["bls.remote"])
    assert stage_encoder.parent.span_id == request.context.span_id
    assert remote.parent.span_id == stage_encoder.context.span_id
    assert stage_encoder.attributes["bls.replica"] == "tcp://a"
    assert stage_encoder.start_time == int(encoder.start * 1e9)
    assert spans["stage judge"].status.status_code == StatusCode.ERROR
    assert spans["stage judge"].attributes["bls.error_kind"] == "ValueError"
