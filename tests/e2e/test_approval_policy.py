"""The approval policy end to end: a stack whose policy (version 2) requires two approvals. The first
reviewer's approval, delivered by the forge's real webhook, reaches the run, but the merge's forge check counts
1 of 2 approvals and merges nothing; the run asks for review again, and a second permitted reviewer's approval
merges. The approvals record the policy version that admitted them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus

from infra.cli.demo import ensure_user
from pipeline.config import DurafixConfig
from pipeline.ops.forge_setup import ForgeApi, set_collaborator
from pipeline.state import Approval, Delivered, DeliveryKind, Outcome, RunState
from reviews.approval_policy import ApprovalPolicy
from tests.e2e.test_pipeline import awaiting_review, finished, state_when
from tests.support.e2e_stack import E2EStack, combined_model_script, running_e2e_stack, wait_for
from tests.support.run_history import started_input

pytestmark = [pytest.mark.slow, pytest.mark.browser]

POLICY = ApprovalPolicy(version=2, required_approvals=2)
SECOND = "second-reviewer"


@pytest.fixture(scope="module")
def two_approvals_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EStack]:
    """A stack of its own, configured (``approval_policy``) before its receiver and worker start."""
    state = tmp_path_factory.mktemp("durafix-policy")

    def configure(config: DurafixConfig) -> None:
        config.approval_policy = POLICY

    with running_e2e_stack(
        state, warm=configure, model_script=combined_model_script(state / "model-script.yaml")
    ) as stack:
        stack.spawn_worker()
        yield stack


async def accepted_approvals(client: Client, workflow_id: str) -> list[Approval]:
    """Every approval the run accepted, decoded from its history."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    found: list[Approval] = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            # A webhook's approval arrives as its delivery (``deliver``), an operator's as ``approve``.
            if request.input.name == "approve":
                found += await client.data_converter.decode(request.input.args.payloads, [Approval])
                continue
            assert request.input.name == "deliver", request.input.name
            (delivered,) = await client.data_converter.decode(request.input.args.payloads, [Delivered])
            if delivered.kind == DeliveryKind.APPROVAL and delivered.approval is not None:
                found.append(delivered.approval)
    return found


def review_needed_comments(stack: E2EStack, repository: str, pr_number: int) -> list[str]:
    pr = stack.github().get_repo(repository).get_pull(pr_number)
    return [c.body for c in pr.get_issue_comments() if "did not merge" in c.body]


async def test_the_first_of_two_required_approvals_merges_nothing_and_the_second_merges(
    two_approvals_stack: E2EStack, tmp_path: Path
) -> None:
    stack = two_approvals_stack
    client, repository, _, wf = await stack.open_run()
    second_token = ensure_user(stack.config, stack.admin_token, SECOND)
    assert set_collaborator(ForgeApi(stack.config.forge_api_url, stack.owner_token()), repository, SECOND, "push")

    state = await state_when(client, wf, awaiting_review)
    assert state.pending_approval is not None, state.outcome_detail
    assert (await started_input(client, wf)).policy.approval_policy == POLICY
    number, head = state.pending_approval.pr_number, state.pending_approval.head_sha

    stack.approve_on_forge(repository, number, head)
    asked = wait_for(lambda: review_needed_comments(stack, repository, number), 180, "the run to ask again")
    assert "1 of 2 approvals" in asked[0], asked
    assert not stack.github().get_repo(repository).get_pull(number).merged

    def asking_again(s: RunState, status: WorkflowExecutionStatus | None) -> bool:
        return (s.pending_approval is not None and s.approval is None) or finished(s, status)

    again = await state_when(client, wf, asking_again)
    assert again.pending_approval is not None and again.pending_approval.head_sha == head, again.outcome_detail

    repo = stack.github(second_token).get_repo(repository)
    repo.get_pull(number).create_review(commit=repo.get_commit(head), event="APPROVE", body="LGTM too")

    final = await state_when(client, wf, finished)
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    assert final.approval is not None
    assert (final.approval.reviewer, final.approval.policy_version) == (SECOND, POLICY.version)
    assert final.approval.expires_at is None
    approvals = await accepted_approvals(client, wf)
    assert [(a.reviewer, a.policy_version) for a in approvals] == [("reviewer", 2), (SECOND, 2)]
    merged = stack.github().get_repo(repository).get_pull(number)
    assert merged.merged and merged.merge_commit_sha == final.merged_sha
    assert len(review_needed_comments(stack, repository, number)) == 1
