"""Polling a run's state: :func:`pipeline.client.polled_states` skips reads that fail and ends at its deadline."""

from __future__ import annotations

import time
from typing import cast

import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from pipeline import client as runs
from pipeline.state import Budgets, RunState

WF = "repair:acme/shop#1"


def state() -> RunState:
    budgets = Budgets(repair_attempts_max=3, model_token_budget=1000)
    return RunState(
        workflow_id=WF, run_id="r", repository="acme/shop", issue_number=1, base_branch="main", budgets=budgets
    )


async def test_reads_that_fail_are_skipped_and_each_read_is_yielded_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[tuple[WorkflowExecutionStatus | None, RunState] | None] = [
        None,  # the run does not exist yet
        (WorkflowExecutionStatus.RUNNING, state()),
        None,  # no worker answered the query
        (WorkflowExecutionStatus.COMPLETED, state()),
    ]

    async def status_and_state(client: Client, workflow_id: str) -> tuple[WorkflowExecutionStatus | None, RunState]:
        assert workflow_id == WF
        read = reads.pop(0)
        if read is None:
            raise RuntimeError("not there yet")
        return read

    monkeypatch.setattr(runs, "status_and_state", status_and_state)
    seen: list[WorkflowExecutionStatus | None] = []
    async for status, _ in runs.polled_states(cast(Client, None), WF, time.monotonic() + 30, interval_s=0.01):
        seen.append(status)
        if status != WorkflowExecutionStatus.RUNNING:
            break
    assert seen == [WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.COMPLETED] and reads == []


async def test_the_iteration_ends_at_the_deadline_without_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    async def status_and_state(client: Client, workflow_id: str) -> tuple[WorkflowExecutionStatus | None, RunState]:
        raise RuntimeError("never there")

    monkeypatch.setattr(runs, "status_and_state", status_and_state)
    started = time.monotonic()
    seen = [read async for read in runs.polled_states(cast(Client, None), WF, started + 0.2, interval_s=0.01)]
    assert seen == [] and 0.2 <= time.monotonic() - started < 5
