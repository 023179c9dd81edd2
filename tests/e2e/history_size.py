"""Every execution of a workflow ID as the Temporal server sees it: its status, its event count and its
history's size, for the tests that bound a run's history.

The server is the judge: the runs of a workflow ID are listed through its visibility store, each one's
``describe()`` gives the event count (``history_length``) and the size the server accounts for
(``history_size_bytes``), and the fetched history is serialised again to count its bytes independently.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History
from temporalio.client import Client, WorkflowExecutionStatus

HEAVIEST = 4


@dataclass(frozen=True)
class Execution:
    """One run of a workflow ID, read from the server."""

    run_id: str
    workflow_type: str
    status: WorkflowExecutionStatus
    events: int
    # The size the server keeps for the run (what its limits judge), and the fetched history serialised here.
    server_bytes: int
    fetched_bytes: int
    # IDs of the Updates the run accepted, and the workflow IDs of the child workflows it started.
    accepted_updates: tuple[str, ...]
    children: tuple[str, ...]
    # The event types holding the most bytes: (type, events, bytes), largest first (what to shrink next).
    heaviest: tuple[tuple[str, int, int], ...]

    @property
    def bytes(self) -> int:
        """The larger of the two byte counts: a bound holds for both."""
        return max(self.server_bytes, self.fetched_bytes)

    def line(self) -> str:
        return (
            f"{self.workflow_type} run {self.run_id}: {self.status.name}, {self.events} events, "
            f"{self.server_bytes} bytes (server) / {self.fetched_bytes} bytes (fetched), "
            f"{len(self.accepted_updates)} accepted updates, {len(self.children)} child workflows; heaviest: "
            + ", ".join(f"{kind} {n} events {size} bytes" for kind, n, size in self.heaviest)
        )


async def read_execution(client: Client, workflow_id: str, run_id: str) -> Execution:
    """The run ``run_id`` of ``workflow_id`` as the server describes it and its full history."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    described = await handle.describe()
    history = await handle.fetch_history()
    updates = tuple(
        e.workflow_execution_update_accepted_event_attributes.accepted_request.meta.update_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    )
    children = tuple(
        e.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED
    )
    by_type: dict[str, tuple[int, int]] = {}
    for e in history.events:
        kind = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_")
        n, size = by_type.get(kind, (0, 0))
        by_type[kind] = (n + 1, size + e.ByteSize())
    heaviest = sorted(((k, n, size) for k, (n, size) in by_type.items()), key=lambda t: -t[2])[:HEAVIEST]
    assert described.status is not None
    return Execution(
        run_id=run_id,
        workflow_type=described.workflow_type,
        status=described.status,
        events=described.history_length,
        server_bytes=described.raw_description.workflow_execution_info.history_size_bytes,
        fetched_bytes=History(events=history.events).ByteSize(),
        accepted_updates=updates,
        children=children,
        heaviest=tuple(heaviest),
    )


async def executions(client: Client, workflow_id: str, timeout_s: float = 60) -> list[Execution]:
    """Every run of ``workflow_id``, oldest first, once the server lists them all closed (the visibility store
    is written after the run closes; the wait only bounds one that never shows)."""
    deadline = time.monotonic() + timeout_s
    while True:
        listed = [w async for w in client.list_workflows(f'WorkflowId = "{workflow_id}"')]
        if listed and all(w.status not in (None, WorkflowExecutionStatus.RUNNING) for w in listed):
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"{workflow_id}: runs not all closed in {timeout_s:.0f}s: {listed!r}")
        await asyncio.sleep(0.5)
    listed.sort(key=lambda w: w.start_time)
    return [await read_execution(client, workflow_id, w.run_id) for w in listed]


def report(title: str, runs: list[Execution]) -> str:
    """The measurement as lines, printed by the tests (and carried by their failure messages)."""
    return "\n".join([title, *(f"  {r.line()}" for r in runs)])
