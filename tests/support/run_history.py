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
