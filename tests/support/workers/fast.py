"""A worker process for the scale-out benchmark: ``repair_bug`` and the workflow-logic tests' doubles on every
activity queue (each answers at once), on the Temporal server at ``argv[1]``, until SIGTERM.

The orchestration worker has the production settings that matter here (:func:`pipeline.worker.runner.build_workers`'
sticky-queue timeout); every activity queue takes 8 tasks at once, as by default.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from pipeline.steps import TaskQueue
from pipeline.worker.runner import STICKY_SCHEDULE_TO_START
from pipeline.workflow import WORKFLOWS
from tests.support.temporal_workers import running
from tests.support.workers.parked import double_workers


async def serve(address: str) -> None:
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    orchestration = Worker(
        client,
        task_queue=TaskQueue.ORCHESTRATION.value,
        workflows=list(WORKFLOWS),
        sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,
    )
    built = [orchestration, *double_workers(client)]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with running(built, best_effort_shutdown=True):
        print("ready", flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
