"""``durafix worker``: polls one or more task queues (one per capability) until told to stop.

Each queue can run on its own hosts: ``--queues forge,model`` on a small host, ``--queues browser`` where
Chromium is installed, ``--queues environments`` where the apps run. The workflow itself only needs the
orchestration queue. On SIGTERM/SIGINT the worker stops polling and gives running activities a grace period
(activities heartbeat, so cancellation reaches them).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker

from pipeline.client import connect
from pipeline.config import DurafixConfig
from pipeline.services import Services
from pipeline.steps import TaskQueue
from pipeline.temporal_connection import connect_options
from pipeline.workflow import RepairBugWorkflow

ALL_QUEUES = [q for q in TaskQueue]


def parse_queues(text: str) -> list[TaskQueue]:
    if text in ("", "all"):
        return ALL_QUEUES
    by_short = {q.value.removeprefix("durafix-"): q for q in TaskQueue}
    out: list[TaskQueue] = []
    for part in text.split(","):
        part = part.strip()
        if part not in by_short:
            raise ValueError(f"unknown queue {part!r}; choose from {', '.join(by_short)} or 'all'")
        out.append(by_short[part])
    return out


def activities_for(queue: TaskQueue, services: Services) -> Sequence[Callable[..., object]]:
    """The activity implementations served on ``queue`` (built lazily: a host needs only its own)."""
    if queue == TaskQueue.FORGE:
        return services.forge_activities().all()
    if queue == TaskQueue.ENVIRONMENTS:
        return [*services.environment_activities().all(), *services.agent_run_activities().all()]
    if queue == TaskQueue.BROWSER:
        return services.browser_activities().all()
    if queue == TaskQueue.MODEL:
        return services.model_activities().all()
    return []


def build_workers(
    client: Client, config: DurafixConfig, queues: Sequence[TaskQueue], executor: concurrent.futures.Executor
) -> list[Worker]:
    services = Services(config)
    if TaskQueue.BROWSER in queues and config.browser_video:
        # A host that cannot record the video asked for fails now, not on its first reproduction.
        services.browser  # noqa: B018
    workers = []
    for queue in queues:
        if queue == TaskQueue.ORCHESTRATION:
            workers.append(
                Worker(
                    client,
                    task_queue=queue.value,
                    workflows=[RepairBugWorkflow],
                    max_cached_workflows=config.max_cached_workflows,
                )
            )
            continue
        workers.append(
            Worker(
                client,
                task_queue=queue.value,
                activities=activities_for(queue, services),
                activity_executor=executor,
                max_concurrent_activities=8,
                graceful_shutdown_timeout=timedelta(seconds=10),
            )
        )
    return workers


async def run_worker(config: DurafixConfig, queues: Sequence[TaskQueue]) -> None:
    client = await connect(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    with concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="durafix-activity") as executor:
        workers = build_workers(client, config, queues, executor)
        names = ", ".join(q.value for q in queues)
        where = connect_options(config).describe()
        print(f"durafix worker polling {names} on {where}", file=sys.stderr, flush=True)
        runs = [asyncio.create_task(w.run()) for w in workers]
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([*runs, waiter], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not waiter and task.exception() is not None:
                print(f"worker failed: {task.exception()!r}", file=sys.stderr, flush=True)
        print("durafix worker shutting down", file=sys.stderr, flush=True)
        await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True)
        waiter.cancel()
