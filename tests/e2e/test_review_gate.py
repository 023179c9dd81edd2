"""The review gate end to end: a head of the run's PR that the run did not push is verified before anyone is
asked to review it, and a head that fails is never offered nor merged.

The pushes are a maintainer's, made with real git over the forge's smart HTTP to the run's branch. A push seen
while the run awaits review reaches the run as the receiver's ``head_moved`` from the push's ``synchronize``
webhook, by ``pipeline.client.head_moved`` sent by the test (what the reconciler sends), or by an approval naming
the pushed head; a push whose webhook was missed (the hook paused meanwhile) is found by the merge of the
approved head (the forge answers 409). What is asserted is read back from the forge: branch heads, ``main``, the PR's
comments, the ticket, one PR.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from github.Repository import Repository
from temporalio.client import Client

from pipeline import client as runs
from pipeline.ids import branch_for
from pipeline.state import HeadPush, RunState
from tests.e2e.review_runs import OpenedRun
from tests.e2e.test_pipeline import file_on_main, finished, state_when
from tests.support.e2e_stack import E2EStack, footprint

pytestmark = [pytest.mark.slow, pytest.mark.browser]

# A test the maintainer's push adds: it fails on any cart, so the pushed head's tests fail.
BREAKING_TEST = """import unittest


class MaintainerTest(unittest.TestCase):
    def test_the_maintainer_broke_this(self) -> None:
        self.assertEqual(1, 2)
"""
# A change the maintainer's push adds that keeps the tests passing and the fix in place.
NOTES = "Cart totals are the sum of each line's unit price times its quantity.\n"


def push_breaking_test(stack: E2EStack, repository: str, wf: str) -> str:
    """As the repository's owner, push :data:`BREAKING_TEST` onto the run's branch; the new head."""
    return stack.push_files(
        repository, {"tests/test_maintainer.py": BREAKING_TEST}, "Add a maintainer's test", branch=branch_for(wf)
    )


def file_on_branch(stack: E2EStack, repository: str, branch: str, path: str) -> str:
    """A file of ``branch`` as a git clone over the forge's smart HTTP sees it."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            ["git", "clone", "-q", "--depth", "1", "-b", branch, stack.config.clone_url(repository), tmp],
            check=True,
            capture_output=True,
        )
        return (Path(tmp) / path).read_text()


def comments_of(repo: Repository, number: int) -> list[str]:
    return [c.body for c in repo.get_issue(number).get_comments()]


async def review_of(client: Client, wf: str, head: str) -> RunState:
    """The run's state once it asks for a review of ``head`` (or has ended)."""
    return await state_when(
        client,
        wf,
        lambda st, status: (
            (st.pending_approval is not None and st.pending_approval.head_sha == head) or finished(st, status)
        ),
    )


def assert_failed_head_said_and_not_merged(
    stack: E2EStack, repository: str, issue: int, number: int, main_before: str, head: str, final: RunState
) -> None:
    """The failing ``head`` is said on the PR and the ticket, never offered, never merged."""
    assert final.outcome == "needs-human-triage", final.outcome_detail
    assert head[:12] in final.outcome_detail and "failed verification" in final.outcome_detail
    assert [(p.head_sha, p.status.value) for p in final.head_pushes] == [(head, "failed")]
    owner = stack.github().get_repo(repository)
    assert owner.get_branch("main").commit.sha == main_before
    pr = owner.get_pull(number)
    assert not pr.merged and pr.head.sha == head
    bodies = comments_of(owner, number)
    assert any(f"`{head}` did not pass" in b and "tests failed" in b for b in bodies), bodies
    assert not any(f"durafix evidence for `{head}`" in b for b in bodies)
    ticket = [c.body for c in owner.get_issue(issue).get_comments() if "durafix" in c.body]
    assert len(ticket) == 1 and "failed verification" in ticket[0] and head[:12] in ticket[0], ticket


@contextmanager
def webhooks_paused(stack: E2EStack, repository: str) -> Iterator[None]:
    """The repository's webhooks inactive meanwhile: the forge sends no delivery to them (as GitHub does for an
    inactive hook), so a push made meanwhile is told to nobody, as when the receiver missed it."""
    gh = stack.github(stack.owner_token())
    hooks = [hook.url for hook in gh.get_repo(repository).get_hooks()]
    for url in hooks:
        gh.requester.requestJsonAndCheck("PATCH", url, input={"active": False})
    try:
        yield
    finally:
        for url in hooks:
            gh.requester.requestJsonAndCheck("PATCH", url, input={"active": True})


@pytest.mark.timeout(900)
async def test_a_breaking_push_while_awaiting_review_then_approved_is_verified_failing_and_never_merged(
    opened: OpenedRun,
) -> None:
    stack, client, repository, issue, wf, number, first, _ = opened
    main_before = stack.github().get_repo(repository).get_branch("main").commit.sha

    pushed = push_breaking_test(stack, repository, wf)
    assert pushed != first
    # The reviewer approves what the PR now shows; the run verifies that head instead of refusing in silence.
    stack.approve_on_forge(repository, number, pushed)
    final = await state_when(client, wf, finished)
    assert final.approval is None and final.merged_sha is None
    assert_failed_head_said_and_not_merged(stack, repository, issue, number, main_before, pushed, final)
    # Told by the push's own ``synchronize`` delivery, or (when the approval's delivery is handled first) by the
    # approval naming the pushed head: either way once, as one fact.
    assert final.head_pushes[0].source.startswith(("webhook:", "approval:webhook")), final.head_pushes


@pytest.mark.timeout(900)
async def test_a_push_signalled_while_awaiting_review_is_verified_and_its_approval_merges(
    opened: OpenedRun,
) -> None:
    stack, client, repository, _, wf, number, first, state = opened
    assert state.pending_approval is not None and state.publish is not None
    first_digest = state.pending_approval.evidence_digest
    pushed = stack.push_files(repository, {"NOTES.md": NOTES}, "Note how totals are made", branch=branch_for(wf))
    push = HeadPush(pr_number=number, head_sha=pushed, before=first, pusher="owner", source="webhook:test")
    await runs.head_moved(client, wf, push)
    await runs.head_moved(client, wf, push)  # the same head told twice is acted on once
    state = await review_of(client, wf, pushed)
    assert state.pending_approval is not None, state.outcome_detail
    assert state.publish is not None and state.publish.commit == pushed
    digest = state.pending_approval.evidence_digest
    assert digest == state.publish.evidence_digest and digest != first_digest
    assert [(p.head_sha, p.status.value) for p in state.head_pushes] == [(pushed, "passed")]

    owner = stack.github().get_repo(repository)
    bodies = comments_of(owner, number)
    assert sum(f"durafix evidence for `{pushed}`" in b for b in bodies) == 1
    assert any(f"`{pushed}`" in b and digest in b and "to merge, a reviewer approves" in b for b in bodies)

    stack.approve_on_forge(repository, number, pushed)
    final = await state_when(client, wf, finished)
    assert final.outcome == "merged", final.outcome_detail
    assert file_on_main(stack, repository, "NOTES.md") == NOTES


@pytest.mark.timeout(900)
async def test_a_push_after_the_approval_is_verified_with_new_evidence_and_merges_only_when_approved(
    opened: OpenedRun,
) -> None:
    stack, client, repository, issue, wf, number, first, state = opened
    assert state.pending_approval is not None
    first_digest = state.pending_approval.evidence_digest
    owner = stack.github().get_repo(repository)
    main_before = owner.get_branch("main").commit.sha
    branch = branch_for(wf)
    # Nobody tells the run of this push (its webhook is missed): the merge of the approved head finds it moved
    # (or the reconciler does, if a pass comes first).
    with webhooks_paused(stack, repository):
        pushed = stack.push_files(repository, {"NOTES.md": NOTES}, "Note how totals are made", branch=branch)
    stack.approve_on_forge(repository, number, first)
    state = await review_of(client, wf, pushed)
    assert state.pending_approval is not None, state.outcome_detail
    digest = state.pending_approval.evidence_digest
    assert digest != first_digest and state.publish is not None and state.publish.evidence_digest == digest
    # Found by the merge, or by the receiver's reconciler reading the PR first: never by a webhook.
    assert [(p.head_sha, p.status.value) for p in state.head_pushes] == [(pushed, "passed")]
    assert state.head_pushes[0].source in ("merge", "reconciler"), state.head_pushes
    assert owner.get_branch("main").commit.sha == main_before
    bodies = comments_of(owner, number)
    assert any(f"durafix evidence for `{pushed}`" in b and digest in b for b in bodies)
    assert any(f"moved from `{first}` to `{pushed}`" in b and digest in b for b in bodies)
    requested, _ = owner.get_pull(number).get_review_requests()
    if state.head_pushes[0].source == "merge":
        # The approval reached the run before the move was found, so the approver is asked again. When the
        # reconciler found the move first, the approval of the old head arrives after it and asks for nothing.
        assert "reviewer" in [u.login for u in requested]

    stack.approve_on_forge(repository, number, pushed)
    final = await state_when(client, wf, finished)
    assert final.outcome == "merged", final.outcome_detail
    assert final.approval is not None and final.approval.head_sha == pushed
    assert file_on_main(stack, repository, "NOTES.md") == NOTES
    seen = footprint(stack, repository, wf, issue)
    assert seen.pull_requests == [number] and seen.branches == [branch], seen


@pytest.mark.timeout(900)
async def test_a_breaking_push_after_the_approval_is_never_offered(opened: OpenedRun) -> None:
    stack, client, repository, issue, wf, number, first, _ = opened
    main_before = stack.github().get_repo(repository).get_branch("main").commit.sha
    with webhooks_paused(stack, repository):
        pushed = push_breaking_test(stack, repository, wf)
    stack.approve_on_forge(repository, number, first)
    final = await state_when(client, wf, finished)
    assert_failed_head_said_and_not_merged(stack, repository, issue, number, main_before, pushed, final)
    assert final.head_pushes[0].source in ("merge", "reconciler"), final.head_pushes


@pytest.mark.timeout(900)
async def test_main_moved_during_the_wait_is_verified_again_then_merged_with_both_changes(
    opened: OpenedRun,
) -> None:
    stack, client, repository, issue, wf, number, first, _ = opened
    fixed_cart = file_on_branch(stack, repository, branch_for(wf), "cart.py")
    # Someone else's change lands on main while the run waits for its review.
    moved_main = stack.push_files(repository, {"NOTES.md": NOTES}, "Note how totals are made")
    stack.approve_on_forge(repository, number, first)
    final = await state_when(client, wf, finished)
    assert final.outcome == "merged", final.outcome_detail
    assert final.publish is not None and final.publish.verified_base == moved_main
    rebuilt = next(c for c in final.candidates if c.base_revision == moved_main)
    assert rebuilt.rebuilt_from == first and rebuilt.verification.value == "passed"

    owner = stack.github().get_repo(repository)
    assert final.merged_sha is not None and owner.get_branch("main").commit.sha == final.merged_sha
    merged = owner.get_commit(final.merged_sha)
    assert moved_main in [p.sha for p in merged.parents] and first in [p.sha for p in merged.parents]
    assert file_on_main(stack, repository, "NOTES.md") == NOTES
    assert file_on_main(stack, repository, "cart.py") == fixed_cart
    bodies = comments_of(owner, number)
    assert any(f"moved to `{moved_main}`" in b and "durafix evidence for" in b for b in bodies), bodies
    seen = footprint(stack, repository, wf, issue)
    assert seen.pull_requests == [number], seen
