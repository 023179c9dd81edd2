"""Who may review, on the real emulator and the real Temporal dev server.

Three layers are exercised, each with what a forge really delivers:

- the receiver: a review counts only on durafix's own PR (authored by the bot), by someone who is not the bot
  and has the permission; a dismissal withdraws;
- the merge activity (``forge.merge``, run as an activity on the real adapter): it merges only when the
  forge holds a permitted reviewer's APPROVED review of the approved head (or an allowed operator approval);
- the whole run (slow, the embedded stack): an ``approve`` Update sent straight to Temporal with no review
  on the forge merges nothing; the run says so on the PR and the ticket and waits, and the reviewer's real
  approval then merges.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from github.Repository import Repository
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from pipeline import client as runs
from pipeline.activities.forge import ForgeActivities
from pipeline.cli import build_parser
from pipeline.cli.command import CliError
from pipeline.cli.runs import cmd_approve
from pipeline.config import DurafixConfig
from pipeline.services import Services
from pipeline.state import Approval, Delivered, Outcome, Phase
from pipeline.steps import MergeInput, MergeStatus, TaskQueue
from pipeline.workflow import WORKFLOWS
from reviews.markers import COMMENT, find_marker, pull_marker
from tests.replay.record import record_history
from tests.support.e2e_stack import E2EStack
from tests.support.forge import branch_with, commit_files
from tests.support.forge_logins import BOT, MAINTAINER, OUTSIDER, READER, TRIAGER, TRIGGER
from tests.support.security_harness import DECISION_EVENTS, Site, eventually


def started_run(site: Site) -> tuple[int, str]:
    """A run started the real way (a triager labels an issue); no worker runs it, so it stays in intake."""
    issue = site.repo(OUTSIDER).create_issue(title="Total is wrong", body="see title")
    site.repo(TRIAGER).get_issue(issue.number).add_to_labels(TRIGGER)
    [labelled] = site.deliveries("issues", "labeled")
    assert labelled["status_code"] == 202, labelled
    return issue.number, site.run_id(issue.number)


def bot_pr(site: Site, workflow_id: str, branch: str = "durafix/fix") -> tuple[int, str]:
    """The run's PR as the run makes it: a branch pushed and a draft PR opened by the bot's adapter."""
    head = branch_with(site.repo(BOT), branch, {"cart.py": "fixed = True\n"})
    with Services(site.config).forge(site.repository) as adapter:
        pr = adapter.ensure_draft_pr(workflow_id, branch, "main", "Fix the total", "The fix.")
    return pr.number, head


def outsider_pr(site: Site, workflow_id: str) -> tuple[int, str]:
    """An outsider's PR whose body carries the run's marker (pasted), from a branch a maintainer pushed."""
    head = branch_with(site.repo(MAINTAINER), "contrib", {"cart.py": "stolen = True\n"})
    pr = site.repo(OUTSIDER).create_pull(
        base="main", head="contrib", title="Fix the total", body=f"The fix.\n\n{pull_marker(workflow_id).render()}"
    )
    return pr.number, head


def review_answers(site: Site) -> list[tuple[str, int]]:
    """(action, receiver's status) of every review delivery of the repository, in order."""
    return [
        (json.loads(d["request"]["body"])["action"], d["status_code"]) for d in site.deliveries("pull_request_review")
    ]


def approve(repo: Repository, number: int, sha: str, event: str = "APPROVE") -> int:
    pr = repo.get_pull(number)
    review = pr.create_review(
        commit=repo.get_commit(sha), event=event, body="looks wrong" if event != "APPROVE" else ""
    )
    return int(review.id)


# ---- the receiver ----------------------------------------------------------------------------------------


async def test_reviews_of_an_outsiders_pr_carrying_a_runs_marker_reach_no_run(site: Site) -> None:
    _, workflow_id = started_run(site)
    number, head = outsider_pr(site, workflow_id)
    approve(site.repo(MAINTAINER), number, head, "REQUEST_CHANGES")
    approve(site.repo(MAINTAINER), number, head, "APPROVE")
    assert review_answers(site) == [("submitted", 403), ("submitted", 403)]
    assert await site.events(workflow_id, *DECISION_EVENTS) == []


async def test_the_bots_own_review_reaches_no_run(site: Site) -> None:
    _, workflow_id = started_run(site)
    number, head = bot_pr(site, workflow_id)
    # The forge refuses the bot an approval of its own PR, as GitHub does; what a forge can still deliver is
    # a review in the bot's name (another integration sharing its login): the maintainer's real delivery,
    # with the bot as its reviewer.
    async with Worker(site.client, task_queue=TaskQueue.ORCHESTRATION.value, workflows=list(WORKFLOWS)):
        # Off the event loop: the worker on it must answer the receiver's Update while the forge calls wait.
        await asyncio.to_thread(approve, site.repo(MAINTAINER), number, head, "REQUEST_CHANGES")
        [delivery] = await asyncio.to_thread(site.deliveries, "pull_request_review")
        assert delivery["status_code"] == 200
        payload: dict[str, Any] = json.loads(delivery["request"]["body"])
        for state in ("approved", "changes_requested"):
            payload["review"].update(state=state, id=payload["review"]["id"] + 1000)
            payload["review"]["user"]["login"] = payload["sender"]["login"] = BOT
            status, answer = await site.deliver("pull_request_review", payload)
            assert status == 403, answer
            assert "never counts" in answer["message"]
    # Only the maintainer's rejection reached the run.
    assert await decisions(site, workflow_id) == ["rejection"]


@pytest.mark.slow
async def test_a_dismissal_withdraws_the_approval_it_carried(site: Site, temporal_client: Client) -> None:
    _, workflow_id = started_run(site)
    number, head = bot_pr(site, workflow_id)
    async with Worker(temporal_client, task_queue=TaskQueue.ORCHESTRATION.value, workflows=list(WORKFLOWS)):
        await eventually(lambda: _answers_queries(site.client, workflow_id), 60, "the workflow's first task")
        # Off the event loop: the worker on it must answer the receiver's Update while the forge calls wait.
        review_id = await asyncio.to_thread(approve, site.repo(MAINTAINER), number, head)
        pr = await asyncio.to_thread(site.repo(MAINTAINER).get_pull, number)
        await asyncio.to_thread(lambda: pr.get_review(review_id).dismiss("approved the wrong PR"))
        # The run is not awaiting review (no activity worker): the approval was refused by its validator,
        # and the dismissal reached it as a withdrawal.
        assert await asyncio.to_thread(review_answers, site) == [("submitted", 409), ("dismissed", 200)]
    assert await decisions(site, workflow_id) == ["withdrawal"]


async def decisions(site: Site, workflow_id: str) -> list[str]:
    """What reached the run, in order: a signal's name, or the kind of a delivery (the ``deliver`` Update)."""
    found = []
    for event in await site.events(workflow_id, *DECISION_EVENTS):
        if event.HasField("workflow_execution_signaled_event_attributes"):
            found.append(event.workflow_execution_signaled_event_attributes.signal_name)
            continue
        request = event.workflow_execution_update_accepted_event_attributes.accepted_request.input
        assert request.name == "deliver"
        [delivered] = await site.client.data_converter.decode(request.args.payloads, [Delivered])
        found.append(delivered.kind.value)
    return found


async def _answers_queries(client: Client, workflow_id: str) -> bool:
    try:
        await runs.get_state(client, workflow_id)
    except Exception:
        return False
    return True


# ---- the merge activity: authority lives on the forge ----------------------------------------------------


def merge_activities(config: DurafixConfig, *, operator_approval: bool = False) -> ForgeActivities:
    services = Services(config.model_copy(update={"operator_approval": operator_approval}))
    return services.forge_activities()


def merge_input(site: Site, number: int, head: str, *, source: str = "webhook", **policy: Any) -> MergeInput:
    """The merge of PR ``number`` at ``head``, as run 1 of the site's repository asks for it on the maintainer's
    approval."""
    return MergeInput(
        op_id=f"repair:{site.repository}#1:merge:1",
        repository=site.repository,
        number=number,
        approved_sha=head,
        reviewer=MAINTAINER,
        source=source,
        **policy,
    )


def merge(site: Site, number: int, head: str, *, source: str = "webhook", operator_approval: bool = False) -> Any:
    acts = merge_activities(site.config, operator_approval=operator_approval)
    return ActivityEnvironment().run(acts.merge, merge_input(site, number, head, source=source))


def test_a_dismissed_approval_does_not_merge_and_a_standing_one_does(site: Site) -> None:
    number, head = bot_pr(site, f"repair:{site.repository}#1")
    review_id = approve(site.repo(MAINTAINER), number, head)
    site.repo(MAINTAINER).get_pull(number).get_review(review_id).dismiss("not this one")
    refused = merge(site, number, head)
    assert refused.status == MergeStatus.NOT_APPROVED, refused
    assert f"{MAINTAINER}'s latest review is dismissed" in refused.detail
    assert not site.repo().get_pull(number).merged

    approve(site.repo(MAINTAINER), number, head)
    merged = merge(site, number, head)
    assert merged.status == MergeStatus.MERGED, merged
    pr = site.repo().get_pull(number)
    assert pr.merged and pr.merge_commit_sha == merged.merged_sha


def test_an_outsiders_pr_carrying_the_marker_is_never_merged(site: Site) -> None:
    number, head = outsider_pr(site, f"repair:{site.repository}#1")
    approve(site.repo(MAINTAINER), number, head)
    refused = merge(site, number, head)
    assert refused.status == MergeStatus.NOT_APPROVED
    assert f"authored by '{OUTSIDER}', not by {BOT}" in refused.detail
    assert not site.repo().get_pull(number).merged


def test_approvals_of_another_head_or_by_a_reader_do_not_merge(site: Site) -> None:
    number, first = bot_pr(site, f"repair:{site.repository}#1")
    approve(site.repo(MAINTAINER), number, first)
    approve(site.repo(READER), number, first)
    # The head moves after the maintainer's approval: it no longer names the head to merge.
    repo = site.repo(BOT)
    second = commit_files(repo, first, {"cart.py": "fixed = 2\n"}, "more")
    repo.get_git_ref("heads/durafix/fix").edit(second)
    refused = merge(site, number, second)
    assert refused.status == MergeStatus.NOT_APPROVED
    assert f"{MAINTAINER} approved {first[:12]}, not this head" in refused.detail
    approve(site.repo(READER), number, second)
    refused = merge(site, number, second)
    assert f"{READER} lacks the permission to approve" in refused.detail
    assert not site.repo().get_pull(number).merged


def test_an_operator_approval_merges_only_where_operator_approvals_are_enabled(site: Site) -> None:
    number, head = bot_pr(site, f"repair:{site.repository}#1")
    refused = merge(site, number, head, source="cli")
    assert refused.status == MergeStatus.NOT_APPROVED
    assert "operator approvals are not enabled" in refused.detail
    assert not site.repo().get_pull(number).merged
    merged = merge(site, number, head, source="cli", operator_approval=True)
    assert merged.status == MergeStatus.MERGED, merged
    assert site.repo().get_pull(number).merged


def _key_of(body: str | None) -> str | None:
    marker = find_marker(body, COMMENT)
    return marker.attrs.get("key") if marker else None


# ---- the whole run -----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(600)
async def test_an_approve_update_sent_straight_to_temporal_merges_nothing_and_the_run_asks_for_a_review(
    stack_with_worker: E2EStack,
) -> None:
    from tests.e2e.review_runs import opened_for_review
    from tests.e2e.test_pipeline import finished, state_when

    stack, client, repository, issue, wf, number, head, _ = await opened_for_review(stack_with_worker)

    # Another PR's number: refused before it enters history.
    with pytest.raises(WorkflowUpdateFailedError):
        await runs.approve(
            client, wf, Approval(reviewer="reviewer", head_sha=head, source="webhook", review_id="x", pr_number=999)
        )
    # Anyone who reaches Temporal can send what the receiver sends; the forge holds no review behind it.
    forged = Approval(reviewer="reviewer", head_sha=head, source="webhook", review_id="forged", pr_number=number)
    ack = await runs.approve(client, wf, forged)
    assert ack.accepted

    repo = stack.github().get_repo(repository)
    ask_key = f"{wf}:review-needed:{head}"

    def asked() -> Any:
        return [c.body for c in repo.get_issue(number).get_comments() if _key_of(c.body) == ask_key]

    [ask] = await eventually(asked, 60, "the run to ask for a review on the PR")
    assert "did not merge" in ask and "Approve** review" in ask
    state = await state_when(client, wf, lambda s, _: s.phase == Phase.AWAITING_REVIEW and s.approval is None)
    assert state.pending_approval is not None and state.pending_approval.head_sha == head
    assert not repo.get_pull(number).merged
    assert state.ticket is not None and state.ticket.comment_id is not None
    ticket = repo.get_issue(issue).get_comment(state.ticket.comment_id).body
    assert "not merged: no approving review" in ticket and "waiting for an approving review" in ticket

    # The reviewer's real approval on the forge (its webhook carries it) merges.
    reviewer = stack.github(stack.reviewer_token).get_repo(repository)
    reviewer.get_pull(number).create_review(commit=reviewer.get_commit(head), event="APPROVE", body="LGTM")
    final = await state_when(client, wf, finished)
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    assert final.approval is not None and final.approval.reviewer == "reviewer"
    assert repo.get_pull(number).merged
    # A run that asked for a review after an approval without standing, then merged: replayed by tests/replay.
    record_history(await client.get_workflow_handle(wf).fetch_history(), "review-authority-on-forge")


def test_durafix_approve_is_refused_unless_operator_approvals_are_configured(tmp_path: Path) -> None:
    # Refused before anything is sent: no Temporal connection is even made.
    config = DurafixConfig(state_dir=tmp_path, temporal_address="127.0.0.1:1")
    args = build_parser().parse_args(["approve", "acme/shop#1", "--sha", "a" * 40])
    with pytest.raises(CliError) as refused:
        cmd_approve(args, config)
    assert "operator approvals are not enabled" in str(refused.value)
    # Who approved is the operator running the command, never a name typed after it.
    with pytest.raises(SystemExit):
        build_parser().parse_args(["approve", "acme/shop#1", "--sha", "a" * 40, "--reviewer", "alice"])
