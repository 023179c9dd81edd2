"""What a run's history on the Temporal server says, read back for assertions."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import Failure
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
    ``""``), its last attempt (``attempt``, started at ``started``; ``None``: it never started) and why the attempt
    before it failed (:func:`failure_kind`), when it closed and how: ``completed``, ``failed``, ``timed_out`` or
    ``canceled``; and when the workflow asked to cancel it (``cancel_requested``; ``None``: it never did)."""

    step: str
    op_id: str
    attempt: int
    last_failure: str
    started: datetime | None
    ended: datetime
    outcome: str
    cancel_requested: datetime | None = None


def failure_kind(failure: Failure) -> str:
    """An attempt's failure as the history records it for the next one: an application error's type, a timeout's
    ``Timeout:<kind>``, else ``""``."""
    if failure.HasField("application_failure_info"):
        return failure.application_failure_info.type
    if failure.HasField("timeout_failure_info"):
        return f"Timeout:{failure.timeout_failure_info.timeout_type}"
    return ""


async def run_histories(client: Client, workflow_id: str) -> list[list[HistoryEvent]]:
    """Every execution of the closed run ``workflow_id``: its chain continued as new, oldest first, then the
    child workflows each started (recursively), in the order started."""
    chain: list[list[HistoryEvent]] = []
    run_id: str | None = None
    while True:
        events = [e async for e in client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history_events()]
        chain.append(events)
        run_id = events[0].workflow_execution_started_event_attributes.continued_execution_run_id
        if not run_id:
            break
    chain.reverse()
    out = list(chain)
    for events in chain:
        out.extend(await _children(client, events))
    return out


async def _children(client: Client, events: Iterable[HistoryEvent]) -> list[list[HistoryEvent]]:
    out: list[list[HistoryEvent]] = []
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
            child = event.child_workflow_execution_started_event_attributes.workflow_execution
            handle = client.get_workflow_handle(child.workflow_id, run_id=child.run_id)
            history = [e async for e in handle.fetch_history_events()]
            out.append(history)
            out.extend(await _children(client, history))
    return out


_CLOSED = {
    "activity_task_completed_event_attributes": "completed",
    "activity_task_failed_event_attributes": "failed",
    "activity_task_timed_out_event_attributes": "timed_out",
    "activity_task_canceled_event_attributes": "canceled",
}


async def activity_spans(client: Client, workflow_id: str) -> list[ActivitySpan]:
    """Every closed activity of the closed run ``workflow_id`` (all of :func:`run_histories`), in the order they
    closed."""
    spans = [span for events in await run_histories(client, workflow_id) for span in _spans_of(events)]
    return sorted(spans, key=lambda span: span.ended)


def _spans_of(events: Sequence[HistoryEvent]) -> list[ActivitySpan]:
    scheduled: dict[int, tuple[str, str]] = {}
    started: dict[int, HistoryEvent] = {}
    cancel_requested: dict[int, datetime] = {}
    spans: list[ActivitySpan] = []
    for event in events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            arg = json.loads(attrs.input.payloads[0].data) if attrs.input.payloads else None
            op_id = str(arg.get("op_id", "")) if isinstance(arg, dict) else ""
            scheduled[event.event_id] = (attrs.activity_type.name, op_id)
        elif event.HasField("activity_task_started_event_attributes"):
            started[event.activity_task_started_event_attributes.scheduled_event_id] = event
        elif event.HasField("activity_task_cancel_requested_event_attributes"):
            of = event.activity_task_cancel_requested_event_attributes.scheduled_event_id
            cancel_requested[of] = event.event_time.ToDatetime(tzinfo=UTC)
        elif (attributes := event.WhichOneof("attributes")) in _CLOSED:
            of = getattr(event, str(attributes)).scheduled_event_id
            step, op_id = scheduled[of]
            start = started.get(of)
            run = start.activity_task_started_event_attributes if start is not None else None
            spans.append(
                ActivitySpan(
                    step=step,
                    op_id=op_id,
                    attempt=run.attempt if run is not None else 0,
                    last_failure=failure_kind(run.last_failure) if run is not None else "",
                    started=start.event_time.ToDatetime(tzinfo=UTC) if start is not None else None,
                    ended=event.event_time.ToDatetime(tzinfo=UTC),
                    outcome=_CLOSED[str(attributes)],
                    cancel_requested=cancel_requested.get(of),
                )
            )
    return spans
