"""Revisions on review end to end: a reviewer requests changes through the forge's review API (body and line
comments), the run revises on top of the head under review, and the revised head merges.

What is asserted is read back from the forge: one branch and one PR, the revision as a second commit on top
of the first, an evidence comment per head, the reviewer asked again, and the merged tree.
"""

from __future__ import annotations

import pytest
from temporalio.client import Client

from pipeline.ids import branch_for
from pipeline.state import RunState
from tests.e2e.review_runs import OpenedRun
from tests.e2e.test_pipeline import file_on_main, finished, state_when
from tests.support.e2e_stack import footprint

pytestmark = [pytest.mark.slow, pytest.mark.browser]

COMMENT_LINE = "    # Each line counts its quantity: line_total is the unit price times the quantity.\n"


async def revised_from(client: Client, wf: str, head: str) -> RunState:
    """The run's state once it asks for a review of a head other than ``head`` (or has ended)."""
    return await state_when(
        client,
        wf,
        lambda st, status: (
            (st.pending_approval is not None and st.pending_approval.head_sha != head) or finished(st, status)
        ),
    )


@pytest.mark.timeout(900)
async def test_changes_requested_revises_the_same_branch_and_pr_and_the_revised_head_merges(
    opened: OpenedRun,
) -> None:
    stack, client, repository, issue, wf, number, first, _ = opened

    repo = stack.github(stack.reviewer_token).get_repo(repository)
    pr = repo.get_pull(number)
    pr.create_review(
        commit=repo.get_commit(first),
        event="REQUEST_CHANGES",
        body="Please say the rule of the total where it is computed.",
        comments=[{"path": "cart.py", "line": 22, "body": "a comment on this line, please"}],
    )

    state = await revised_from(client, wf, first)
    assert state.pending_approval is not None, f"{state.outcome_detail}\n{stack.deliveries_log()}"
    second = state.pending_approval.head_sha
    assert state.budgets.revisions_used == 1

    # On the forge: the same branch and PR, now at the revision, a commit on top of the first.
    owner = stack.github().get_repo(repository)
    branch = branch_for(wf)
    assert owner.get_branch(branch).commit.sha == second
    assert [p.sha for p in owner.get_commit(second).parents] == [first]
    pulls = [p for p in owner.get_pulls(state="all") if p.head.ref == branch]
    assert [p.number for p in pulls] == [number]
    assert owner.get_pull(number).head.sha == second
    bodies = [c.body for c in owner.get_issue(number).get_comments()]
    assert any(f"durafix evidence for `{first}`" in b for b in bodies)
    assert any(f"durafix evidence for `{second}`" in b for b in bodies)
    assert any("revised the fix" in b and second in b for b in bodies)
    requested, _ = owner.get_pull(number).get_review_requests()
    assert "reviewer" in [u.login for u in requested]
    # The revision's own commit holds only what the revision changed: one added line in cart.py.
    changed = [(f.filename, f.additions, f.deletions) for f in owner.get_commit(second).files]
    assert changed == [("cart.py", 1, 0)]

    stack.approve_on_forge(repository, number, second)
    final = await state_when(client, wf, finished)
    assert final.outcome == "merged", final.outcome_detail
    assert COMMENT_LINE in file_on_main(stack, repository, "cart.py")
    seen = footprint(stack, repository, wf, issue)
    assert seen.pull_requests == [number] and seen.branches == [branch], seen
    assert len(seen.tickets) == 1 and len(seen.evidence_comments) == 2, seen


@pytest.mark.timeout(1200)
async def test_the_revision_budget_ends_the_run_honestly_when_spent(opened: OpenedRun) -> None:
    stack, client, repository, _, wf, number, first, state = opened
    repo = stack.github(stack.reviewer_token).get_repo(repository)
    heads = [first]
    budget = state.budgets.revisions_max
    assert budget == 2
    for _ in range(budget):
        repo.get_pull(number).create_review(
            commit=repo.get_commit(heads[-1]), event="REQUEST_CHANGES", body="Say the rule of the total."
        )
        state = await revised_from(client, wf, heads[-1])
        assert state.pending_approval is not None, state.outcome_detail
        heads.append(state.pending_approval.head_sha)
    repo.get_pull(number).create_review(
        commit=repo.get_commit(heads[-1]), event="REQUEST_CHANGES", body="Still not what I meant."
    )
    final = await state_when(client, wf, finished)
    assert final.outcome == "rejected", final.outcome_detail
    assert f"revision budget ({budget}) was spent" in final.outcome_detail

    owner = stack.github().get_repo(repository)
    branch = branch_for(wf)
    assert owner.get_branch(branch).commit.sha == heads[-1]
    assert [[p.sha for p in owner.get_commit(h).parents] for h in heads[1:]] == [heads[:1], heads[1:2]]
    assert [p.number for p in owner.get_pulls(state="all") if p.head.ref == branch] == [number]
    bodies = [c.body for c in owner.get_issue(number).get_comments()]
    assert sum("revision budget" in b and "is spent" in b for b in bodies) == 1
    assert all(any(f"durafix evidence for `{h}`" in b for b in bodies) for h in heads)
