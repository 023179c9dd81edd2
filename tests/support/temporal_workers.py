"""The workflow's workers in the test process: one for the orchestration queue, one per activity queue, run
for the length of a block."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import Executor
from contextlib import asynccontextmanager
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from pipeline.steps import TaskQueue
from pipeline.workflow import WORKFLOWS


def pipeline_workers(
    client: Client,
    activities: Mapping[TaskQueue, Sequence[Callable[..., Any]]],
    workflows: Sequence[type] = (),
    activity_executor: Executor | None = None,
) -> list[Worker]:
    """The repair workflow (and ``workflows``) on the orchestration queue, and each queue's ``activities``."""
    workers = [Worker(client, task_queue=TaskQueue.ORCHESTRATION.value, workflows=[*WORKFLOWS, *workflows])]
    workers += [
        Worker(client, task_queue=queue.value, activities=list(acts), activity_executor=activity_executor)
        for queue, acts in activities.items()
    ]
    return workers


@asynccontextmanager
async def running(workers: Sequence[Worker], *, best_effort_shutdown: bool = False) -> AsyncIterator[None]:
    """``workers`` polling for the block; shut down, and their runs awaited, after it.

    A worker's failing shutdown fails the block (a test hears of it), unless ``best_effort_shutdown`` (the
    benchmarks and their worker processes, whose measurements are taken by then): it is passed over, and the
    other workers are still shut down and every run awaited."""
    runs = [asyncio.create_task(w.run()) for w in workers]
    try:
        yield
    finally:
        await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=best_effort_shutdown)
        await asyncio.gather(*runs, return_exceptions=True)
