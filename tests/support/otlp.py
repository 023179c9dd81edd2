"""An OTLP/HTTP trace collector for a test: what durafix processes export (``OTEL_EXPORTER_OTLP_ENDPOINT``
pointed here) is decoded with the OpenTelemetry protobufs and kept in memory, span by span."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.support.served import QuietHandler, served


@dataclass(frozen=True)
class Span:
    """One exported span: its trace, its ID and its parent's (``""`` for a root), name, service and attributes."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    service: str
    attributes: dict[str, str]


class Collector(ThreadingHTTPServer):
    """Answers ``POST /v1/traces`` (protobuf) and keeps every span it was sent."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.received: list[Span] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def spans(self) -> list[Span]:
        with self.lock:
            return list(self.received)

    def keep(self, request: ExportTraceServiceRequest) -> None:
        spans: list[Span] = []
        for resource in request.resource_spans:
            service = next((a.value.string_value for a in resource.resource.attributes if a.key == "service.name"), "")
            for scope in resource.scope_spans:
                for span in scope.spans:
                    attributes = {a.key: _text(a.value) for a in span.attributes}
                    spans.append(
                        Span(
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            span.name,
                            service,
                            attributes,
                        )
                    )
        with self.lock:
            self.received.extend(spans)


def _text(value: object) -> str:
    which = value.WhichOneof("value")  # type: ignore[attr-defined]
    return str(getattr(value, which)) if which else ""


class _Handler(QuietHandler):
    server: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.keep(request)
        self.answer(200, ExportTraceServiceResponse().SerializeToString(), ("Content-Type", "application/x-protobuf"))


@contextmanager
def collecting() -> Iterator[Collector]:
    """A collector serving for the block."""
    with served(Collector()) as collector:
        yield collector


def exporting_to(collector: Collector, service: str) -> dict[str, str]:
    """The environment that makes a durafix process export its spans to ``collector`` at once (batches of
    a fifth of a second, not the SDK's five seconds), as ``service``."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
