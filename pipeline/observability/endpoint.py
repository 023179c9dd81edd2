"""Serving a worker's ``/metrics`` (``DURAFIX_METRICS_PORT``; unset: no endpoint, nothing is bound).

``durafix worker`` is a supervisor and its children (:mod:`pipeline.worker.supervisor`): the polling child, and
a warm spare that takes over within milliseconds when it dies. The port belongs to the supervisor, so a scrape
target outlives the children:

- each child builds its Temporal runtime with the SDK's Prometheus exporter on a loopback port of its own
  (:func:`sdk_runtime`) and serves one registry (:class:`ChildEndpoint`) on another loopback port: durafix's
  counters (:class:`~.worker_metrics.WorkerMetrics`), the open-runs and owned-resources gauges, and the SDK's
  metrics scraped from its exporter and re-exposed (:class:`Scraped`). It says that port on stdout before
  ``ready`` (:data:`METRICS_LINE`);
- the supervisor serves ``/metrics`` on ``DURAFIX_METRICS_PORT`` (every interface): its own
  ``durafix_worker_polling`` and ``durafix_worker_process_deaths_total``, and the polling child's registry
  scraped at each request. A spare's metrics are never served (it does nothing until promoted).

When the polling child dies its successor's counters start from zero: Prometheus's ``rate``/``increase`` read
that as a counter reset, which is what it is. An unsupervised worker (``--no-supervise``) serves its own
registry on the port directly.
"""

from __future__ import annotations

import contextlib
import socket
import urllib.request
from collections.abc import Callable, Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

METRICS_LINE = "metrics"
"""A supervised child's stdout line ``metrics <port>``: where its registry is served on the loopback."""
LOOPBACK = "127.0.0.1"
SCRAPE_TIMEOUT_S = 5.0


def free_port() -> int:
    """A loopback port nobody listens on right now (the SDK's exporter needs a number, not a socket)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


def sdk_runtime(port: int) -> Runtime:
    """A Temporal runtime whose core exports its metrics on ``LOOPBACK:port`` in Prometheus conventions:
    counters end in ``_total``, durations are seconds."""
    prometheus = PrometheusConfig(
        bind_address=f"{LOOPBACK}:{port}", counters_total_suffix=True, unit_suffix=True, durations_as_seconds=True
    )
    return Runtime(telemetry=TelemetryConfig(metrics=prometheus))


class Scraped(Collector):
    """The metric families another exporter serves at ``url()`` (None: none right now), fetched at each collect.
    An exporter that does not answer contributes nothing (its absence is what the alerts see)."""

    def __init__(self, url: Callable[[], str | None]) -> None:
        self.url = url

    def collect(self) -> Iterable[Metric]:
        where = self.url()
        if where is None:
            return []
        try:
            with urllib.request.urlopen(where, timeout=SCRAPE_TIMEOUT_S) as answer:
                text = answer.read().decode()
        except OSError:
            return []
        return list(text_string_to_metric_families(text))


def serve(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0") -> WSGIServer:
    """Serve ``registry`` at ``/metrics`` on ``addr:port`` from a daemon thread; the server is returned to be
    shut down."""
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server


def close(server: WSGIServer | None) -> None:
    if server is not None:
        with contextlib.suppress(OSError):
            server.shutdown()
            server.server_close()


def serving_port(server: WSGIServer) -> int:
    port: int = server.server_address[1]
    return port
