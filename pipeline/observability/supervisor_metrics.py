"""The supervisor's ``/metrics`` on ``DURAFIX_METRICS_PORT`` (see :mod:`.endpoint` for the whole arrangement).

- ``durafix_worker_polling``: 1 while a child of this supervisor polls its queues, 0 otherwise (all children
  dead, or a crash loop backing off);
- ``durafix_worker_process_deaths_total``: worker children that died while the supervisor was not stopping;
- everything the polling child serves (its durafix metrics and the SDK's), scraped at each request.
"""

from __future__ import annotations

from collections.abc import Callable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge

from pipeline.observability.endpoint import LOOPBACK, Scraped, close, serve


class SupervisorMetrics:
    """``polling()``: whether a child polls; ``child_port()``: the polling child's loopback metrics port (None
    when there is none, or it said none)."""

    def __init__(self, polling: Callable[[], bool], child_port: Callable[[], int | None]) -> None:
        self.registry = CollectorRegistry()
        self.polling = Gauge(
            "durafix_worker_polling", "1 while a worker process of this supervisor polls", registry=self.registry
        )
        self.polling.set_function(lambda: 1.0 if polling() else 0.0)
        self.deaths = Counter(
            "durafix_worker_process_deaths", "Worker processes that died unasked", registry=self.registry
        )

        def child_url() -> str | None:
            port = child_port()
            return None if port is None else f"http://{LOOPBACK}:{port}/metrics"

        self.registry.register(Scraped(child_url))
        self.server: WSGIServer | None = None

    def serve(self, port: int) -> None:
        self.server = serve(self.registry, port)

    def close(self) -> None:
        close(self.server)
        self.server = None
