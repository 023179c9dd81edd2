"""What every single-queue worker process of the tests does once its activities are built: connect, serve them
from a thread pool (as the product's worker runs synchronous activities), say ``ready`` once polling, and run
until killed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from pipeline.steps import TaskQueue


async def serve_queue(
    target: str, namespace: str, queue: TaskQueue, activities: Sequence[Callable[..., object]]
) -> None:
    """Serve ``activities`` on ``queue`` of the Temporal server at ``target`` until the process is killed."""
    client = await Client.connect(target, namespace=namespace, data_converter=pydantic_data_converter)
    with ThreadPoolExecutor(max_workers=4) as executor:
        worker = Worker(client, task_queue=queue.value, activities=activities, activity_executor=executor)
        print("ready", flush=True)
        await worker.run()
