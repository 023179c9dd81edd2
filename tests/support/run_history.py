"""What a run's history on the Temporal server says, read back for assertions."""

from __future__ import annotations

from temporalio.client import Client

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
