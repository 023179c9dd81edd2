"""What a run's history on the Temporal server says, read back for assertions."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
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


@dataclass(frozen=True)
class ActivitySpan:
    """One activity of a run as the server recorded it: its step, its operation ID (``op_id`` of its input, or
    ``""``), the workflow execution that scheduled it, when its last attempt started (``None``: it never started)
    and when it closed, and how: ``completed``, ``failed``, ``timed_out`` or ``canceled``."""

    step: str
    op_id: str
    workflow_id: str
    started: datetime | None
    ended: datetime
    outcome: str

    def overlaps(self, other: ActivitySpan) -> bool:
        """Whether both ran at one moment: each started before the other closed."""
        return (
            self.started is not None
            and other.started is not None
            and self.started < other.ended
            and other.started < self.ended
        )


_CLOSED = {
    "activity_task_completed_event_attributes": "completed",
    "activity_task_failed_event_attributes": "failed",
    "activity_task_timed_out_event_attributes": "timed_out",
    "activity_task_canceled_event_attributes": "canceled",
}


async def activity_spans(client: Client, workflow_id: str) -> list[ActivitySpan]:
    """Every closed activity of the run ``workflow_id``, in the order they closed: of each of its executions (from
    the first, following continue-as-new) and of every child workflow they started (a repair attempt's)."""
    latest = await client.get_workflow_handle(workflow_id).fetch_history()
    run_id: str | None = latest.events[0].workflow_execution_started_event_attributes.first_execution_run_id
    spans: list[ActivitySpan] = []
    while run_id:
        events = (await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()).events
        spans.extend(_spans_of(workflow_id, events))
        for event in events:
            if event.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
                child = event.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id
                spans.extend(await activity_spans(client, child))
        last = events[-1]
        run_id = (
            last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
            if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
            else None
        )
    return sorted(spans, key=lambda span: span.ended)


def _spans_of(workflow_id: str, events: Sequence[HistoryEvent]) -> list[ActivitySpan]:
    scheduled: dict[int, tuple[str, str]] = {}
    started: dict[int, datetime] = {}
    spans: list[ActivitySpan] = []
    for event in events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            arg = json.loads(attrs.input.payloads[0].data) if attrs.input.payloads else None
            op_id = str(arg.get("op_id", "")) if isinstance(arg, dict) else ""
            scheduled[event.event_id] = (attrs.activity_type.name, op_id)
        elif event.HasField("activity_task_started_event_attributes"):
            attrs_started = event.activity_task_started_event_attributes
            started[attrs_started.scheduled_event_id] = event.event_time.ToDatetime(tzinfo=UTC)
        elif (attributes := event.WhichOneof("attributes")) in _CLOSED:
            of = getattr(event, str(attributes)).scheduled_event_id
            step, op_id = scheduled[of]
            at = event.event_time.ToDatetime(tzinfo=UTC)
            spans.append(ActivitySpan(step, op_id, workflow_id, started.get(of), at, _CLOSED[str(attributes)]))
    return spans
