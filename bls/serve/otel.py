"""Exporting request traces through OpenTelemetry (the optional ``otel`` extra).

``bls serve`` exports when the standard variable ``OTEL_TRACES_EXPORTER`` names an
exporter: ``console`` (in the SDK), or ``otlp`` (needs the
``opentelemetry-exporter-otlp-proto-http`` package; ``OTEL_EXPORTER_OTLP_ENDPOINT`` and
the other standard variables configure it). Each finished request becomes one trace: a
root span for the request and a child span per stage call, nested as they ran, remote
workers' spans included, with their real start and end times.
"""

from __future__ import annotations

import os
from typing import Any

from ..config import ConfigError
from ..tracing import Trace

__all__ = ["Exporter", "from_environment"]


class Exporter:
    """Turns finished :class:`~bls.tracing.Trace` objects into OpenTelemetry spans."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("bls")

    def __call__(self, trace: Trace) -> None:
        from opentelemetry import trace as otel
        from opentelemetry.trace import Status, StatusCode

        made: dict[int, Any] = {}
        for span in trace.spans:  # parents are always recorded before their children
            parent = made.get(span.parent)
            context = otel.set_span_in_context(parent) if parent is not None else None
            root = span.parent == 0
            attributes: dict[str, Any] = {
                "bls.stage" if not root else "bls.entry": span.name,
                "bls.binding": span.binding,
                "bls.outcome": span.outcome,
                "bls.remote": span.remote,
            }
            if root:
                attributes["bls.request_id"] = trace.id
                attributes["http.response.status_code"] = trace.status
            if span.replica:
                attributes["bls.replica"] = span.replica
            if span.bytes_out or span.bytes_in:
                attributes["bls.bytes_out"] = span.bytes_out
                attributes["bls.bytes_in"] = span.bytes_in
            if span.streaming:
                attributes["bls.items"] = span.items
            if span.kind:
                attributes["bls.error_kind"] = span.kind
            otel_span = self.tracer.start_span(
                f"request {span.name}" if root else f"stage {span.name}",
                context=context,
                start_time=int(span.start * 1e9),
                attributes=attributes,
            )
            if span.outcome != "ok":
                otel_span.set_status(Status(StatusCode.ERROR, span.kind or span.outcome))
            otel_span.end(end_time=int((span.end or span.start) * 1e9))
            made[span.id] = otel_span

    def close(self) -> None:
        """Flush what is still queued (at shutdown)."""
        self.provider.shutdown()


def from_environment() -> Exporter | None:
    """An exporter as ``OTEL_TRACES_EXPORTER`` asks, or None when it asks for none.

    Raises ConfigError naming the missing package when the exporter cannot be made.
    """
    name = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if name in ("", "none"):
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={name} needs the OpenTelemetry SDK: "
            "pip install -e '.[otel]' (in a checkout of bls-pipelines)"
        ) from None
    exporter: Any
    if name == "console":
        exporter = ConsoleSpanExporter()
    elif name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ConfigError(
                "OTEL_TRACES_EXPORTER=otlp needs opentelemetry-exporter-otlp-proto-http"
            ) from None
        exporter = OTLPSpanExporter()
    else:
        raise ConfigError(f"OTEL_TRACES_EXPORTER={name}: bls knows 'console' and 'otlp'")
    service = os.environ.get("OTEL_SERVICE_NAME", "bls")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Exporter(provider)
