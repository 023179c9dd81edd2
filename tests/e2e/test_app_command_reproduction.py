"""A command reproduction with ``app: true``, end to end on the embedded stack: the sample cart app onboarded on
the GitHub emulator, a report whose ``durafix-repro`` block reads the cart API from the running app. The base is
provisioned and the command runs in the app's environment (it reads the buggy total), the scripted model's fix is
verified and the reproduction replayed against the candidate's app (the right total), the reviewer approves on
the forge and the fix is merged: one ticket, one PR, and nothing of the run left running."""

from __future__ import annotations

import pytest

from environments.command_repro import SandboxReproduction
from evidence.interface import ArtifactRef
from infra.cli.demo import issue_text
from pipeline.services import Services
from pipeline.state import Outcome
from tests.e2e.test_pipeline import awaiting_review, file_on_main, finished, state_when
from tests.support.cart_reproductions import CART_API_TOTAL, reported
from tests.support.e2e_stack import E2EStack, one_of_each, owned_processes, run_workspaces

pytestmark = [pytest.mark.slow]

REPRODUCTION = reported(CART_API_TOTAL + "runs: 2\n")


def record(stack: E2EStack, log_ref: ArtifactRef) -> SandboxReproduction:
    """A reproduction's stored record (``<label>-reproduction.json``)."""
    return SandboxReproduction.model_validate_json(Services(stack.config).store.read_bytes(log_ref))


async def test_a_command_reproduction_against_the_running_app_is_repaired_and_merged(
    stack_with_worker: E2EStack,
) -> None:
    stack = stack_with_worker
    title, body = issue_text()
    prose = body.split("```durafix-repro")[0]
    client, repository, issue, wf = await stack.open_run(title=title, body=prose + REPRODUCTION)

    state = await state_when(client, wf, awaiting_review)
    assert state.pending_approval is not None, state.outcome_detail
    assert state.reproduction_kind == "command" and state.reproduction_app
    # Provisioned as a browser run is (an app, its environment torn down after), reproduced by a command.
    assert state.environment is not None and state.environment.last_status == "torn-down", state.environment
    assert state.reproduction is not None and state.reproduction.status == "reproduced", state.reproduction
    assert state.reproduction.log_ref is not None
    assert state.reproduction.log_ref.name == "reproduce-base-reproduction.json"
    base = record(stack, state.reproduction.log_ref)
    assert [r.steps[0].stdout for r in base.runs] == ["2375\n", "2375\n"]
    [candidate] = state.candidates
    assert candidate.replay is not None and candidate.replay.status == "not_reproduced", candidate.replay
    assert candidate.replay.log_ref is not None
    assert [r.steps[0].stdout for r in record(stack, candidate.replay.log_ref).runs] == ["4000\n", "4000\n"]

    stack.approve_on_forge(repository, state.pending_approval.pr_number, state.pending_approval.head_sha)
    final = await state_when(client, wf, finished)
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    assert "line_total(item) for item in items" in file_on_main(stack, repository, "cart.py")
    one_of_each(stack, repository, wf, issue, final)
    ticket = stack.github().get_repo(repository).get_issue(issue)
    assert final.ticket is not None and final.ticket.comment_id is not None
    said = ticket.get_comment(final.ticket.comment_id).body
    assert "(a command reproduction, run in the sandbox against the app): `reproduced`" in said, said
    assert owned_processes(wf) == []
    assert run_workspaces(stack, wf) == []
