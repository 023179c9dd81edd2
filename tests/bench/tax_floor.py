"""Temporal's own floor under a run's steps: what one activity a step costs when the activity only waits.

:func:`waves` cuts a plain run's steps into its critical path: the spans during which some step ran, steps
that ran side by side merged into one. :func:`floor_seconds` replays that path through Temporal: ``bench_floor``
executes one activity per wave, one after another, each sleeping as long as the wave lasted, with the workflow
and the activities on two task queues of the same server (as ``repair_bug``'s steps are: its activities never
share the orchestration queue, so the server never hands one out eagerly) and their workers in this process;
its wall time is read from its history (its start to its close). Its inputs are a number and its results empty:
what it adds to the sleeps is scheduling, the workflow tasks, the handover and the history, none of durafix's
own code or payloads. So ``floor - sum(waves)`` is the least tax any run of one activity a step pays on this
server, and the rest of a run's tax is durafix's own.

The sleeps matter: a back-to-back chain of activities that do nothing gets slower after about ten steps on the
dev server (each hand-out then waits 40-50 ms, on both queues), which no run whose steps take time meets.

This module is imported into the workflow sandbox (the workflow's own module): it imports only temporalio.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

FLOOR_WORKFLOW = "bench_floor"
NOOP_ACTIVITY = "bench_noop"
WORKFLOW_QUEUE = "durafix-bench-floor"
ACTIVITY_QUEUE = "durafix-bench-floor-activities"


@activity.defn(name=NOOP_ACTIVITY)
async def noop(seconds: float) -> None:
    """Waits ``seconds`` and does nothing else: the step's time beyond the wait is Temporal's."""
    await asyncio.sleep(seconds)


@workflow.defn(name=FLOOR_WORKFLOW)
class FloorWorkflow:
    """One waiting activity per wave, in sequence, on the activities' own queue."""

    @workflow.run
    async def run(self, waits: list[float]) -> None:
        for seconds in waits:
            await workflow.execute_activity(
                NOOP_ACTIVITY, seconds, task_queue=ACTIVITY_QUEUE, start_to_close_timeout=timedelta(seconds=300)
            )


@asynccontextmanager
async def floor_workers(client: Client) -> AsyncIterator[None]:
    """The floor's two workers (the workflow's queue, the activities' queue), polling for the block."""
    async with (
        Worker(client, task_queue=WORKFLOW_QUEUE, workflows=[FloorWorkflow]),
        Worker(client, task_queue=ACTIVITY_QUEUE, activities=[noop]),
    ):
        yield


async def floor_seconds(client: Client, waits: Sequence[float]) -> float:
    """One ``bench_floor`` run of ``waits`` (seconds, one step each) on :func:`floor_workers`: its start to its
    close, in seconds, as its history records them."""
    handle = await client.start_workflow(
        FloorWorkflow.run, list(waits), id=f"bench-floor-{uuid.uuid4().hex[:12]}", task_queue=WORKFLOW_QUEUE
    )
    await handle.result()
    events = (await handle.fetch_history()).events
    return (events[-1].event_time.ToNanoseconds() - events[0].event_time.ToNanoseconds()) / 1e9


def waves(spans: Sequence[tuple[float, float]]) -> list[float]:
    """How long each group of overlapping spans (start, end) lasted, in order: a run's critical path, steps
    that ran side by side merged into one."""
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [end - start for start, end in merged]
