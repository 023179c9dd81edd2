"""What a run's history on the Temporal server says, read back for assertions."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from datetime import UTC

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus

from pipeline import client as runs
from pipeline.inputs import RepairInput


async def started_input(client: Client, workflow_id: str) -> RepairInput:
    """The input the run was started with, decoded from its first event."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    attrs = history.events[0].workflow_execution_started_event_attributes
    [inp] = await client.data_converter.decode(attrs.input.payloads, [RepairInput])
    assert isinstance(inp, RepairInput)
    return inp


async def activity_attempts(client: Client, workflow_id: str) -> list[tuple[str, int]]:
    """Each activity the run started, as (its type, the attempt it ended on), in the order scheduled. The server
    records one started event per activity, carrying the last attempt's number: an attempt above 1 was retried."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    scheduled: dict[int, str] = {}
    attempts: list[tuple[str, int]] = []
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        elif event.HasField("activity_task_started_event_attributes"):
            started = event.activity_task_started_event_attributes
            attempts.append((scheduled[started.scheduled_event_id], started.attempt))
    return attempts


@dataclass(frozen=True)
class Completions:
    """When the run started, and when each activity or child workflow completed, by (type, the how-manieth of
    that type: 1 for the first), in seconds since the epoch by the server's clock."""

    started: float
    done: dict[tuple[str, int], float]


async def completions(client: Client, workflow_id: str) -> Completions:
    """The run's :class:`Completions`, read from its history (a repair attempt's end is its child workflow's)."""
    started = float("nan")
    scheduled: dict[int, str] = {}
    count: dict[str, int] = {}
    done: dict[tuple[str, int], float] = {}

    def completed(name: str, at: float) -> None:
        count[name] = count.get(name, 0) + 1
        done[(name, count[name])] = at

    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        at = event.event_time.ToDatetime(tzinfo=UTC).timestamp()
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED and math.isnan(started):
            started = at
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            completed(scheduled[event.activity_task_completed_event_attributes.scheduled_event_id], at)
        elif event.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED:
            completed(event.child_workflow_execution_completed_event_attributes.workflow_type.name, at)
    return Completions(started=started, done=done)


async def cancel_and_wait(client: Client, workflow_id: str, timeout_s: float) -> None:
    """Cancel the run and wait (at most ``timeout_s``) until it closed, its cleanup done."""
    await runs.cancel(client, workflow_id)
    handle = client.get_workflow_handle(workflow_id)
    deadline = time.monotonic() + timeout_s
    while (await handle.describe()).status == WorkflowExecutionStatus.RUNNING and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
