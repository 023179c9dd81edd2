"""Traces across a run: one trace from a webhook delivery through the workflow to every activity it started.

Contracts:

- Every Temporal client durafix makes (:func:`pipeline.temporal_connection.connect`: the worker, the receiver, the CLI)
  carries :func:`interceptors`, ``temporalio.contrib.opentelemetry``'s ``TracingInterceptor``. On a client it
  puts the current span's context in the headers of a start, a signal, a query or an Update; a worker built
  on that client takes the same interceptor (the SDK applies a client's worker interceptors to its workers),
  so the workflow's own spans (``RunWorkflow``, ``StartActivity``, ``HandleUpdate`` ...) and each activity's
  ``RunActivity`` span continue the caller's trace. The interceptor only adds headers: the commands the
  workflow issues are the same with and without it (tests/replay replays with it), and without a span to
  carry no header is added at all.
- durafix's own spans (a delivery here; setup commands, browser runs, model calls in the capability
  packages, through the plain OpenTelemetry API) are children of whatever span is current, so a setup
  command's span sits inside the provision activity's.
- Export is off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set:
  then :func:`export_traces` installs the OpenTelemetry SDK, exporting spans in batches over OTLP/HTTP
  (protobuf) to that endpoint, the service named by ``OTEL_SERVICE_NAME`` or the process's role. Off, the API
  is a no-op: no span is recorded and no header sent. The standard ``OTEL_*`` variables (headers, timeout,
  sampler) apply as the SDK reads them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from temporalio.contrib.opentelemetry import TracingInterceptor

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
TRACER_NAME = "durafix.pipeline"
# Set once per process: the SDK refuses a second global provider anyway, and says so in a warning.
_installed: list[str] = []


def interceptors() -> list[TracingInterceptor]:
    """The interceptors of every client (and so of every worker built on it)."""
    return [TracingInterceptor()]


def export_enabled() -> bool:
    """Whether an OTLP endpoint is configured for this process."""
    return any(os.environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def export_traces(service: str) -> bool:
    """Install the SDK's tracer provider exporting over OTLP/HTTP when :func:`export_enabled`, as ``service``
    (unless ``OTEL_SERVICE_NAME`` names it); once per process. Whether spans are exported. The provider flushes
    what it holds when the process exits normally."""
    if _installed:
        return True
    if not export_enabled():
        return False
    # Imported here: a process that exports nothing never loads the SDK or the exporter.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME", "").strip() or service
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _installed.append(name)
    return True


@contextmanager
def delivery_span(event: str, delivery: str, action: object) -> Iterator[None]:
    """The span of one verified webhook delivery: the root of the run's trace when the delivery starts it.
    ``event`` and ``action`` come from a signed delivery; they are cut short all the same."""
    attributes = {
        "github.event": event[:64],
        "github.delivery": delivery[:64],
        "github.action": action[:64] if isinstance(action, str) else "",
    }
    with trace.get_tracer(TRACER_NAME).start_as_current_span(
        "webhook delivery", kind=trace.SpanKind.SERVER, attributes=attributes
    ):
        yield
