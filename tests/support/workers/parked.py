"""The worker process of the parked-runs benchmark: the real ``repair_bug`` workflow, doubles for its activities.

``python -m tests.support.workers.parked TARGET NAMESPACE STATE METRICS_ADDRESS CACHE_SIZE WORKFLOW_TASKS``
polls every durafix task queue: the orchestration queue with :class:`~pipeline.workflow.RepairBugWorkflow`
(the production worker's settings, :func:`pipeline.worker.runner.build_workers`, except the workflow cache size,
``CACHE_SIZE``, and the workflow tasks it runs at once, ``WORKFLOW_TASKS``), the other queues with the
workflow-logic tests' doubles (:func:`tests.integration.workflow.test_workflow_logic.doubles`). It prints ``ready``
once its workers are built and runs until SIGTERM (graceful shutdown) or SIGKILL. ``STATE`` is unused (the
process keeps no state); it is the argument :func:`tests.support.stepped.worker_process` passes and names
the log.

It runs in its own process so that its RSS is the worker's alone, not the benchmark's client's. It serves
Prometheus metrics on ``METRICS_ADDRESS`` (``host:port``): the SDK's own (``temporal_worker_task_slots_used``
per ``worker_type`` and task queue, ``temporal_sticky_cache_size``) and ``durafix_bench_activities_running``,
the activities this process is executing, counted by an interceptor around every activity.

The doubles share one :class:`~tests.integration.workflow.test_workflow_logic.Script` for every run, which keeps
nothing per run here: its call log forgets what it is told (so the worker's memory is the workflow's, not
the log's) and every merge answers ``merged``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, SupportsIndex

from temporalio.client import Client
from temporalio.common import MetricGauge
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    Worker,
)

from pipeline.steps import MergeStatus, TaskQueue
from pipeline.workflow import WORKFLOWS
from tests.integration.workflow.test_workflow_logic import Script, doubles
from tests.support.temporal_workers import running

RUNNING_GAUGE = "durafix_bench_activities_running"


class Forgetful(list[tuple[str, Any]]):
    """A call log that keeps nothing: a thousand parked runs' calls would otherwise be the worker's memory."""

    def append(self, item: tuple[str, Any]) -> None:
        del item


class AlwaysMerged(list[MergeStatus]):
    """The forge's answer to every merge, however many runs ask."""

    def pop(self, index: SupportsIndex = -1) -> MergeStatus:
        del index
        return MergeStatus.MERGED


class RunningActivities(Interceptor):
    """Counts the activities this process is executing into a gauge (one count for every queue)."""

    def __init__(self, gauge: MetricGauge) -> None:
        self.gauge = gauge
        self.running = 0

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Counting(next, self)


class _Counting(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, counter: RunningActivities) -> None:
        super().__init__(next)
        self.counter = counter

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        self.counter.running += 1
        self.counter.gauge.set(self.counter.running)
        try:
            return await super().execute_activity(input)
        finally:
            self.counter.running -= 1
            self.counter.gauge.set(self.counter.running)


def double_workers(
    client: Client, interceptors: Sequence[Interceptor] = (), graceful_shutdown_timeout: timedelta = timedelta()
) -> list[Worker]:
    """A worker on every activity queue, 8 tasks at once, serving the workflow-logic tests' doubles of one
    :class:`~tests.integration.workflow.test_workflow_logic.Script` that keeps nothing per run (:class:`Forgetful`,
    :class:`AlwaysMerged`); ``interceptors`` and ``graceful_shutdown_timeout`` as :class:`Worker` takes them."""
    script = Script(calls=Forgetful(), merge_answers=AlwaysMerged())
    return [
        Worker(
            client,
            task_queue=queue.value,
            activities=activities,
            max_concurrent_activities=8,
            graceful_shutdown_timeout=graceful_shutdown_timeout,
            interceptors=interceptors,
        )
        for queue, activities in doubles(script).items()
    ]


def build_workers(client: Client, runtime: Runtime, cache_size: int, workflow_tasks: int) -> list[Worker]:
    """One worker per task queue, with :func:`pipeline.worker.runner.build_workers`'s settings but for the cache."""
    gauge = runtime.metric_meter.create_gauge(RUNNING_GAUGE, "activities executing in this process")
    gauge.set(0)
    counting = RunningActivities(gauge)
    orchestration = Worker(
        client,
        task_queue=TaskQueue.ORCHESTRATION.value,
        workflows=list(WORKFLOWS),
        max_cached_workflows=cache_size,
        max_concurrent_workflow_tasks=workflow_tasks,
    )
    return [orchestration, *double_workers(client, [counting], graceful_shutdown_timeout=timedelta(seconds=10))]


async def serve(target: str, namespace: str, metrics_address: str, cache_size: int, workflow_tasks: int) -> None:
    runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=metrics_address)))
    client = await Client.connect(target, namespace=namespace, data_converter=pydantic_data_converter, runtime=runtime)
    workers = build_workers(client, runtime, cache_size, workflow_tasks)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with running(workers, best_effort_shutdown=True):
        print("ready", flush=True)
        # The SDK core logs its warnings to fd 1, which the parent reads only up to "ready": once the pipe is
        # full, the core's logging thread would block the worker. From here on they go to the log (fd 2).
        os.dup2(2, 1)
        await stop.wait()


if __name__ == "__main__":
    target, namespace, _state, metrics_address, cache_size, workflow_tasks = sys.argv[1:7]
    asyncio.run(serve(target, namespace, metrics_address, int(cache_size), int(workflow_tasks)))
