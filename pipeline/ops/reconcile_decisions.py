"""What the reconciler delivers to one run, decided from the run's state and the forge's truth (pure: no I/O).

The receiver acts on webhook deliveries, which GitHub does not retry; the reconciler compares what a run has
seen (its ``RunState``) with what the forge holds now and decides what the run missed. Every decision here is
one the receiver would have made from the lost delivery, under the same rules:

- a run's issue closed, or its trigger label removed, cancels the run (unless it is already merging or
  ending: a merge's closing keyword closes the issue, which says nothing against the run);
- on a run awaiting review of ``pending.head_sha`` on its own PR (authored by the bot):
  - the PR closed without merging rejects, naming whoever closed it, as ``pull_request`` ``closed`` does;
  - a head the run did not push (no candidate of the run has that commit) is a moved head (``head_moved``),
    and no review decides anything until the run has seen it;
  - otherwise each reviewer's standing review (``reviews.approvals.standing_reviews``) of the pending head
    by someone other than the bot and the PR's author, with at least ``approver_permission``: a request for
    changes (not yet revised on: no candidate names its review ID) is the ``reject`` signal marked
    ``changes_requested``; else the first approval is the ``approve`` Update (its ID is the review's, so the
    same review delivered by a webhook and the reconciler is recorded once). A standing request for changes
    wins over an approval: GitHub would not count the PR as approved while it stands.
- a labelled open issue without any run is a lost trigger, started when whoever added the label (the issue's
  events, or, on a forge that keeps none, the issue's author) holds at least ``trigger_permission``, and
  only on text that account could have seen (:func:`unpinnable`): the run pins the issue's text as it is
  when the reconciler starts it, so text that may have been edited after the label by someone below
  ``trigger_permission`` is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel

from pipeline.state import Approval, HeadPush, Phase, Rejection, RunState
from reviews.approvals import standing_reviews
from reviews.issues import IssueInfo, LabelAdded
from reviews.models import PullState
from reviews.permissions import RepoPermission, RepoRole, permission_at_least, role_at_least

SOURCE = "reconciler"
# Phases from which the run is merging or ending on its own: an issue closed then is the merge's doing (or
# too late to matter), and cancelling would race the run's own ending.
ENDING = (Phase.MERGE, Phase.CLEANUP, Phase.DONE)

DecisionKind = Literal["approve", "changes_requested", "reject", "head_moved", "cancel", "start"]


class Decision(BaseModel):
    """One thing to deliver to a run (``start``: a run to start), with the payload the receiver would send."""

    workflow_id: str
    kind: DecisionKind
    reason: str
    approval: Approval | None = None
    rejection: Rejection | None = None
    push: HeadPush | None = None


class Skip(BaseModel):
    """Something looked at and left alone, and why."""

    workflow_id: str
    reason: str


@dataclass(frozen=True)
class RunTruth:
    """What the forge holds for one run: its issue, the bot's login, and (for a run awaiting review) its PR, the
    permission of each reviewer whose standing review could decide (``permissions``) and who closed the PR."""

    issue: IssueInfo
    bot: str
    pr: PullState | None = None
    permissions: dict[str, RepoPermission] = field(default_factory=dict)
    policy_refusals: dict[str, str | None] = field(default_factory=dict)
    """Why the approval policy refuses each deciding reviewer (None: it admits them)."""
    closed_by: str | None = None
    """Who closed the PR (read only when it is closed without merging)."""


def deciding_reviewers(state: RunState, pr: PullState, bot: str) -> list[str]:
    """The reviewers whose permission must be read before :func:`decide_run` can decide: those whose standing
    review would count on the pending head if they held the permission (read only for them, as the webhook
    path reads only the sender's)."""
    pending = state.pending_approval
    if pending is None:
        return []
    return sorted(
        login
        for login, review in standing_reviews(pr.reviews).items()
        if login not in (bot, pr.author)
        and review.state.upper() in ("APPROVED", "CHANGES_REQUESTED")
        and review.commit_id == pending.head_sha
    )


def own_commits(state: RunState) -> set[str]:
    """Every commit the run made (its candidates', revisions included) and published."""
    commits = {c.commit for c in state.candidates if c.commit}
    if state.publish is not None:
        commits.add(state.publish.commit)
    return commits


def decide_run(
    state: RunState,
    truth: RunTruth,
    *,
    trigger_label: str,
    approver_permission: RepoPermission,
    started_by_label: bool = True,
) -> list[Decision | Skip]:
    """What to deliver to the running ``state`` given ``truth``; at most one decision (a cancel, or one
    review-side delivery), and a :class:`Skip` for every review looked at and left alone. ``started_by_label``:
    the run was started by its issue's trigger label (a webhook or a lost trigger); a run an operator started
    (``durafix start``, on an issue that may never have carried the label) is not cancelled for lacking it."""
    wf = state.workflow_id
    issue = truth.issue
    if state.outcome is not None or state.phase in ENDING:
        return [Skip(workflow_id=wf, reason=f"run is {state.phase.value}: nothing to reconcile")]
    if issue.state != "open":
        return [Decision(workflow_id=wf, kind="cancel", reason=f"issue #{issue.number} is {issue.state}")]
    if started_by_label and trigger_label not in issue.labels:
        return [
            Decision(workflow_id=wf, kind="cancel", reason=f"issue #{issue.number} no longer carries {trigger_label!r}")
        ]
    pending = state.pending_approval
    if pending is None or state.phase != Phase.AWAITING_REVIEW:
        return [Skip(workflow_id=wf, reason=f"run is {state.phase.value}, not awaiting review")]
    pr = truth.pr
    if pr is None:
        return [Skip(workflow_id=wf, reason=f"PR #{pending.pr_number} was not read")]
    if pr.author != truth.bot:
        return [Skip(workflow_id=wf, reason=f"PR #{pr.number} is authored by {pr.author!r}, not by {truth.bot}")]
    if pr.state == "closed" and not pr.merged:
        rejection = Rejection(
            reviewer=truth.closed_by or SOURCE,
            reason="the PR was closed without merging",
            source=SOURCE,
            pr_number=pr.number,
        )
        return [Decision(workflow_id=wf, kind="reject", reason=f"PR #{pr.number} is closed", rejection=rejection)]
    if pr.merged:
        return [Skip(workflow_id=wf, reason=f"PR #{pr.number} is merged: the run's own read of it decides")]
    if pr.head_sha != pending.head_sha:
        if pr.head_sha in own_commits(state):
            return [Skip(workflow_id=wf, reason=f"PR head {pr.head_sha[:12]} is the run's own push")]
        push = HeadPush(pr_number=pr.number, head_sha=pr.head_sha, before=pending.head_sha, source=SOURCE)
        reason = f"PR #{pr.number} head is {pr.head_sha[:12]}, the run awaits review of {pending.head_sha[:12]}"
        return [Decision(workflow_id=wf, kind="head_moved", reason=reason, push=push)]
    return _review_decisions(state, pr, truth, approver_permission)


def _review_decisions(
    state: RunState, pr: PullState, truth: RunTruth, required: RepoPermission
) -> list[Decision | Skip]:
    wf = state.workflow_id
    pending = state.pending_approval
    assert pending is not None
    out: list[Decision | Skip] = []
    revised_on = {c.review_id for c in state.candidates if c.review_id}
    approvals: list[Decision] = []
    changes: list[Decision] = []
    for login, review in sorted(standing_reviews(pr.reviews).items(), key=lambda kv: kv[1].id):
        state_name = review.state.upper()
        what = f"{login}'s review {review.id}"
        if login in (truth.bot, pr.author):
            out.append(Skip(workflow_id=wf, reason=f"{what} is the bot's or the PR author's own"))
            continue
        if state_name not in ("APPROVED", "CHANGES_REQUESTED"):
            out.append(Skip(workflow_id=wf, reason=f"{what} is {state_name.lower()}"))
            continue
        if review.commit_id != pending.head_sha:
            out.append(Skip(workflow_id=wf, reason=f"{what} is of {str(review.commit_id)[:12]}, not the pending head"))
            continue
        permission = truth.permissions.get(login)
        if permission is None:
            out.append(Skip(workflow_id=wf, reason=f"{login}'s permission was not read"))
            continue
        if not permission_at_least(permission, required):
            out.append(Skip(workflow_id=wf, reason=f"{login} has {permission} permission; {required} is required"))
            continue
        refused = truth.policy_refusals.get(login)
        if refused:
            out.append(Skip(workflow_id=wf, reason=refused))
            continue
        if state_name == "APPROVED":
            approval = Approval(
                reviewer=login,
                head_sha=pending.head_sha,
                source=SOURCE,
                review_id=str(review.id),
                pr_number=pr.number,
            )
            approvals.append(Decision(workflow_id=wf, kind="approve", reason=f"{what} approves", approval=approval))
        elif str(review.id) in revised_on:
            out.append(Skip(workflow_id=wf, reason=f"{what} requested changes the run already revised on"))
        else:
            rejection = Rejection(
                reviewer=login,
                reason="changes requested",
                source=SOURCE,
                pr_number=pr.number,
                changes_requested=True,
                review_id=str(review.id),
                head_sha=pending.head_sha,
            )
            changes.append(
                Decision(
                    workflow_id=wf, kind="changes_requested", reason=f"{what} requests changes", rejection=rejection
                )
            )
    if changes:
        return [changes[0], *out]
    if approvals:
        if state.approval is not None and state.approval.head_sha == pending.head_sha:
            return [Skip(workflow_id=wf, reason="the run already holds an approval of the pending head"), *out]
        return [approvals[0], *out]
    return out or [Skip(workflow_id=wf, reason=f"no deciding review of {pending.head_sha[:12]} on PR #{pr.number}")]


def may_trigger(role: RepoRole, required: RepoRole) -> bool:
    """Whether a label added by someone with ``role`` starts a run (as the receiver's check)."""
    return role_at_least(role, required)


# The least role that may edit anyone's issue (the author may always edit their own). GitHub asks for write;
# the emulator lets triage: the lower one is assumed, so no editor is left out.
EDIT_ROLE: RepoRole = "triage"


def unpinnable(
    issue: IssueInfo, added: LabelAdded | None, author_role: RepoRole, required: RepoRole, label: str
) -> str | None:
    """Why a lost trigger's run must not pin ``issue``'s current text, or None when it may.

    The webhook of the label carried the text its adder saw; the reconciler only sees the text now. It may pin
    that when every account that could have edited it since holds ``required`` (the author, and whoever holds
    :data:`EDIT_ROLE`), or when nothing about the issue changed after the label was added (``updated_at`` not
    after the ``labeled`` event; GitHub stamps whole seconds, so a change within the label's second is not
    told apart). The forge says neither who edited a report's body nor when (``updated_at`` moves on a comment
    or a label too): an issue that changed at all after its label, with an author below ``required``, is
    refused."""
    if may_trigger(author_role, required) and may_trigger(EDIT_ROLE, required):
        return None
    if added is not None and issue.updated_at is not None and issue.updated_at <= added.at:
        return None
    if added is None:
        when = f"the forge keeps no events saying when {label!r} was added"
    else:
        when = f"the issue changed at {_stamp(issue.updated_at)}, after {label!r} was added at {_stamp(added.at)}"
    return (
        f"{when}; who may have edited it since (its author {issue.author}, {author_role}, or anyone with "
        f"{EDIT_ROLE}) need not hold the {required} a trigger takes: its text now may not be what the labeller saw"
    )


def _stamp(at: datetime | None) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if at is not None else "an unknown time"
