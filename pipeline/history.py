"""A readable digest of a run's Temporal history: what ran, what failed, and which timeout stopped it."""

from __future__ import annotations

from typing import Any

from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.client import WorkflowHistory


def _event_name(event_type: int) -> str:
    return EventType.Name(event_type).removeprefix("EVENT_TYPE_").lower()  # type: ignore[arg-type]


def summarize_history(history: WorkflowHistory) -> list[dict[str, Any]]:
    """One row per meaningful event; workflow-task bookkeeping is left out."""
    scheduled: dict[int, str] = {}
    rows: list[dict[str, Any]] = []
    for ev in history.events:
        name = _event_name(ev.event_type)
        if name.startswith("workflow_task_"):
            continue
        detail = ""
        if ev.HasField("activity_task_scheduled_event_attributes"):
            attrs = ev.activity_task_scheduled_event_attributes
            scheduled[ev.event_id] = attrs.activity_type.name
            detail = f"{attrs.activity_type.name} on {attrs.task_queue.name}"
        elif ev.HasField("activity_task_started_event_attributes"):
            attrs_s = ev.activity_task_started_event_attributes
            detail = f"{scheduled.get(attrs_s.scheduled_event_id, '?')} attempt {attrs_s.attempt}"
        elif ev.HasField("activity_task_completed_event_attributes"):
            detail = scheduled.get(ev.activity_task_completed_event_attributes.scheduled_event_id, "?")
        elif ev.HasField("activity_task_failed_event_attributes"):
            attrs_f = ev.activity_task_failed_event_attributes
            failure = attrs_f.failure
            kind = failure.application_failure_info.type if failure.HasField("application_failure_info") else ""
            detail = f"{scheduled.get(attrs_f.scheduled_event_id, '?')}: {kind} {failure.message}".strip()
        elif ev.HasField("activity_task_timed_out_event_attributes"):
            attrs_t = ev.activity_task_timed_out_event_attributes
            tinfo = attrs_t.failure.timeout_failure_info
            kind = TimeoutType.Name(tinfo.timeout_type).removeprefix("TIMEOUT_TYPE_").lower()
            detail = f"{scheduled.get(attrs_t.scheduled_event_id, '?')}: {kind} timeout"
        elif ev.HasField("workflow_execution_update_accepted_event_attributes"):
            attrs_u = ev.workflow_execution_update_accepted_event_attributes
            detail = f"{attrs_u.accepted_request.input.name} id={attrs_u.protocol_instance_id}"
        elif ev.HasField("workflow_execution_signaled_event_attributes"):
            detail = ev.workflow_execution_signaled_event_attributes.signal_name
        elif ev.HasField("timer_started_event_attributes"):
            detail = f"{ev.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()}"
        rows.append(
            {"id": ev.event_id, "time": ev.event_time.ToDatetime().isoformat(), "event": name, "detail": detail}
        )
    return rows
