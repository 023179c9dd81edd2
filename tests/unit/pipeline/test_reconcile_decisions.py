"""The reconciler's decisions from a run's state and the forge's truth (pure: no forge, no Temporal)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

from pipeline.ops.reconcile_decisions import Decision, RunTruth, Skip, decide_run, deciding_reviewers, unpinnable
from pipeline.state import ApprovalRequest, Budgets, CandidateFact, Phase, PublishFact, RunState
from reviews.issues import IssueInfo, LabelAdded
from reviews.models import PullState, ReviewInfo
from reviews.permissions import RepoPermission
from tests.support.artifacts import artifact_ref

WF = "repair:acme/shop#1"
HEAD = "a" * 40
OLD = "b" * 40
BOT = "durafix-bot"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def state(phase: Phase = Phase.AWAITING_REVIEW, candidates: list[CandidateFact] | None = None) -> RunState:
    return RunState(
        workflow_id=WF,
        run_id="r",
        repository="acme/shop",
        issue_number=1,
        base_branch="main",
        phase=phase,
        budgets=Budgets(repair_attempts_max=3, model_token_budget=1000),
        candidates=candidates or [],
        publish=PublishFact(branch="durafix/x/fix", commit=HEAD, pr_number=2),
        pending_approval=ApprovalRequest(pr_number=2, head_sha=HEAD, evidence_digest="e", requested_at=NOW)
        if phase == Phase.AWAITING_REVIEW
        else None,
    )


def candidate(commit: str, review_id: str | None = None) -> CandidateFact:
    ref = artifact_ref("p", key="k", media_type="x")
    return CandidateFact(
        attempt=1, op_id="o", patch_ref=ref, summary="", commit_timestamp=0, commit=commit, review_id=review_id
    )


def issue(state_: str = "open", labels: tuple[str, ...] = ("durafix",)) -> IssueInfo:
    return IssueInfo(number=1, title="t", body="b", author="alice", state=state_, labels=list(labels))


def rev(rid: int, user: str, st: str, commit: str = HEAD) -> ReviewInfo:
    return ReviewInfo(id=rid, user=user, state=st, commit_id=commit, submitted_at=NOW)


def pr(
    *reviews: ReviewInfo, head: str = HEAD, state_: Literal["open", "closed"] = "open", merged: bool = False
) -> PullState:
    return PullState(
        number=2,
        state=state_,
        draft=False,
        merged=merged,
        merge_commit_sha=None,
        head_ref="durafix/x/fix",
        head_sha=head,
        base_ref="main",
        mergeable=True,
        reviews=list(reviews),
        run_id=WF,
        author=BOT,
    )


def decide(st: RunState, p: PullState | None, **permissions: RepoPermission) -> list[Decision | Skip]:
    truth = RunTruth(issue=issue(), bot=BOT, pr=p, permissions=permissions)
    return decide_run(st, truth, trigger_label="durafix", approver_permission="write")


def kinds(out: list[Decision | Skip]) -> list[str]:
    return [d.kind for d in out if isinstance(d, Decision)]


def test_a_standing_request_for_changes_wins_over_an_approval() -> None:
    p = pr(rev(1, "w1", "APPROVED"), rev(2, "w2", "CHANGES_REQUESTED"))
    out = decide(state(), p, w1="write", w2="write")
    assert kinds(out) == ["changes_requested"]
    [d] = [d for d in out if isinstance(d, Decision)]
    assert d.rejection is not None and d.rejection.review_id == "2" and d.rejection.head_sha == HEAD


def test_a_request_for_changes_the_run_revised_on_is_not_sent_again_and_the_approval_is() -> None:
    p = pr(rev(1, "w1", "APPROVED"), rev(2, "w2", "CHANGES_REQUESTED"))
    out = decide(state(candidates=[candidate(OLD), candidate(HEAD, review_id="2")]), p, w1="write", w2="write")
    assert kinds(out) == ["approve"]


def test_a_later_dismissal_or_request_for_changes_replaces_a_reviewers_approval() -> None:
    p = pr(rev(1, "w1", "APPROVED"), rev(3, "w1", "DISMISSED"))
    assert kinds(decide(state(), p, w1="write")) == []


def test_an_approval_of_another_head_is_left_alone() -> None:
    assert kinds(decide(state(), pr(rev(1, "w1", "APPROVED", commit=OLD)), w1="write")) == []
    assert deciding_reviewers(state(), pr(rev(1, "w1", "APPROVED", commit=OLD)), BOT) == []


def test_a_head_the_run_pushed_is_not_a_moved_head_but_anyone_elses_is() -> None:
    own = state(candidates=[candidate(OLD)])
    assert kinds(decide(own, pr(head=OLD))) == []
    out = decide(state(), pr(head="c" * 40))
    assert kinds(out) == ["head_moved"]


def test_a_closed_issue_does_not_cancel_a_run_that_is_merging() -> None:
    truth = RunTruth(issue=issue("closed"), bot=BOT)
    assert kinds(decide_run(state(Phase.MERGE), truth, trigger_label="durafix", approver_permission="write")) == []
    assert kinds(decide_run(state(Phase.REPAIR), truth, trigger_label="durafix", approver_permission="write")) == [
        "cancel"
    ]


def test_a_run_an_operator_started_on_an_unlabelled_issue_is_not_cancelled_for_the_label() -> None:
    truth = RunTruth(issue=issue(labels=()), bot=BOT)
    by_label = decide_run(state(Phase.REPAIR), truth, trigger_label="durafix", approver_permission="write")
    assert kinds(by_label) == ["cancel"]
    by_operator = decide_run(
        state(Phase.REPAIR), truth, trigger_label="durafix", approver_permission="write", started_by_label=False
    )
    assert kinds(by_operator) == []
    closed = RunTruth(issue=issue("closed", labels=()), bot=BOT)
    assert kinds(
        decide_run(
            state(Phase.REPAIR), closed, trigger_label="durafix", approver_permission="write", started_by_label=False
        )
    ) == ["cancel"]


def test_a_pr_not_authored_by_the_bot_decides_nothing() -> None:
    p = pr(rev(1, "w1", "APPROVED")).model_copy(update={"author": "mallory"})
    out = decide(state(), p, w1="write")
    assert kinds(out) == [] and any("not by durafix-bot" in s.reason for s in out if isinstance(s, Skip))


# ---- a lost trigger's text (unpinnable) ------------------------------------------------------------------


def updated(at: datetime | None) -> IssueInfo:
    return issue().model_copy(update={"updated_at": at})


def test_a_report_unchanged_since_its_label_is_pinned_whoever_wrote_it() -> None:
    added = LabelAdded(actor="triager", at=NOW)
    assert unpinnable(updated(NOW), added, "none", "triage", "durafix") is None


def test_a_report_changed_after_its_label_by_an_author_below_the_trigger_permission_is_not_pinned() -> None:
    added = LabelAdded(actor="triager", at=NOW)
    why = unpinnable(updated(NOW + timedelta(seconds=5)), added, "read", "triage", "durafix")
    assert why is not None and "after 'durafix' was added" in why and "alice, read" in why


def test_without_label_events_only_a_report_every_possible_editor_may_trigger_on_is_pinned() -> None:
    # The author holds triage and editing anyone's issue takes triage: whoever edited could have triggered.
    assert unpinnable(updated(NOW + timedelta(seconds=5)), None, "triage", "triage", "durafix") is None
    # At write, a triager could have edited it and is below: without events nothing says the text is older.
    why = unpinnable(updated(NOW + timedelta(seconds=5)), None, "write", "write", "durafix")
    assert why is not None and "keeps no events" in why
    # With events showing nothing changed after the label, it is pinned at write too.
    assert unpinnable(updated(NOW), LabelAdded(actor="m", at=NOW), "write", "write", "durafix") is None
