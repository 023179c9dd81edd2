"""A run awaiting review, as the review-gate, revision and approval tests begin: opened on the stack's worker
and asking a reviewer to approve its first head."""

from __future__ import annotations

from typing import NamedTuple

import pytest
from temporalio.client import Client

from pipeline.state import RunState
from tests.e2e.test_pipeline import awaiting_review, state_when
from tests.support.e2e_stack import E2EStack


class OpenedRun(NamedTuple):
    """A run of ``stack`` for ``issue`` of ``repository`` (workflow ``wf``) awaiting review of ``head`` on PR
    ``number``; ``state`` is its state when it first asked for that review."""

    stack: E2EStack
    client: Client
    repository: str
    issue: int
    wf: str
    number: int
    head: str
    state: RunState


async def opened_for_review(stack: E2EStack) -> OpenedRun:
    """Open a run on ``stack`` and wait until it asks for a review; fails the test if it ends instead."""
    client, repository, issue, wf = await stack.open_run()
    state = await state_when(client, wf, awaiting_review)
    assert state.pending_approval is not None, state.outcome_detail
    pending = state.pending_approval
    return OpenedRun(stack, client, repository, issue, wf, pending.pr_number, pending.head_sha, state)


@pytest.fixture
async def opened(stack_with_worker: E2EStack) -> OpenedRun:
    """A run on the module's stack (with its worker) awaiting review of its first head."""
    return await opened_for_review(stack_with_worker)
