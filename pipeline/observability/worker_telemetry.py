"""A worker process's metrics, wired in a few calls from :func:`pipeline.worker.runner.run_worker`.

``WorkerTelemetry.of(config, queues)`` is ``None`` when ``DURAFIX_METRICS_PORT`` is unset: nothing is bound,
the SDK's runtime is the default one and no interceptor counts. Otherwise, in order: :attr:`runtime` is what
the worker's client connects with (the SDK's exporter on a loopback port), :meth:`interceptors` count the
activity attempts, and :meth:`serve` adds the scrape-time gauges and serves the registry (see
:mod:`.endpoint` for where).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from temporalio.client import Client
from temporalio.runtime import Runtime
from temporalio.worker import Interceptor

from environments.egress import observe_egress
from pipeline.config import DurafixConfig
from pipeline.observability.endpoint import (
    LOOPBACK,
    METRICS_LINE,
    Scraped,
    close,
    free_port,
    sdk_runtime,
    serve,
    serving_port,
)
from pipeline.observability.gauges import OpenRuns, OwnedResources
from pipeline.observability.step_metrics import MetricsInterceptor
from pipeline.observability.worker_metrics import WorkerMetrics
from pipeline.steps import TaskQueue


@dataclass
class WorkerTelemetry:
    """One worker process's metrics: the SDK runtime its client uses, durafix's registry, where it is served."""

    config: DurafixConfig
    queues: Sequence[TaskQueue]
    runtime: Runtime
    metrics: WorkerMetrics
    server: WSGIServer | None = field(default=None)
    open_runs: OpenRuns | None = field(default=None)

    @classmethod
    def of(cls, config: DurafixConfig, queues: Sequence[TaskQueue]) -> WorkerTelemetry | None:
        if config.metrics_port is None:
            return None
        sdk_port = free_port()
        telemetry = cls(config, queues, sdk_runtime(sdk_port), WorkerMetrics(config.model_prices))
        telemetry.metrics.registry.register(Scraped(lambda: f"http://{LOOPBACK}:{sdk_port}/metrics"))
        observe_egress(telemetry.metrics.egress)
        return telemetry

    def interceptors(self) -> list[Interceptor]:
        from pipeline.services import Services

        return [MetricsInterceptor(self.metrics, lambda: Services(self.config).store)]

    def serve(self, client: Client, *, supervised: bool) -> None:
        """Add the gauges this process's queues own and serve the registry: on a loopback port said on stdout
        (``supervised``: the supervisor serves it), else on ``DURAFIX_METRICS_PORT``. Call it from the worker's
        event loop, before a supervised child says ``ready``."""
        registry = self.metrics.registry
        if TaskQueue.ORCHESTRATION in self.queues:
            self.open_runs = OpenRuns(client, asyncio.get_running_loop())
            registry.register(self.open_runs)
        if TaskQueue.ENVIRONMENTS in self.queues:
            registry.register(OwnedResources(self.config))
        if supervised:
            self.server = serve(registry, 0, LOOPBACK)
            print(f"{METRICS_LINE} {serving_port(self.server)}", flush=True)
        else:
            assert self.config.metrics_port is not None
            self.server = serve(registry, self.config.metrics_port)

    def close(self) -> None:
        if self.open_runs is not None:
            self.open_runs.stop()
        close(self.server)
        self.server = None
