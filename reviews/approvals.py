"""Whether the forge itself approves a head: the authority a merge is checked against.

An `approve` Update can be sent by anything that reaches Temporal, so the merge does not take the run's word
for an approval: it reads the PR's reviews again and looks for one that GitHub would count. The rules, as
GitHub applies them to a required review:

- each reviewer's **latest** review that decides anything (`APPROVED`, `CHANGES_REQUESTED`, `DISMISSED`;
  `COMMENTED` decides nothing) is their standing; an approval later dismissed, or followed by a request
  for changes, no longer approves;
- it approves the head only when its `commit_id` is that head (a review stays on the PR after later pushes);
- the PR must be durafix's own (authored by the bot), and the bot's own reviews and the PR author's never count;
- the reviewer must be one the approval policy admits (`reviews.approval_policy`: permission and allow-lists,
  read from the forge now), and the approval must still stand under the policy's expiry;
- the head is approved when the policy's `required_approvals` distinct reviewers approve it so; the detail says
  how many of how many did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from reviews.approval_policy import ApprovalPolicy
from reviews.models import PullState, ReviewInfo
from reviews.permissions import ROLE_OF_PERMISSION, RepoPermission, RepoRole

DECIDING = ("APPROVED", "CHANGES_REQUESTED", "DISMISSED")


@dataclass(frozen=True)
class ForgeApproval:
    """The outcome of the check: who approves ``head_sha`` (in login order), how many must, and why each other
    review did not count."""

    head_sha: str
    approved_by: tuple[str, ...]
    required: int
    reasons: tuple[str, ...]

    @property
    def approved(self) -> bool:
        return len(self.approved_by) >= self.required

    @property
    def counted(self) -> str:
        return f"{len(self.approved_by)} of {self.required} approvals"

    @property
    def detail(self) -> str:
        why = "; ".join(self.reasons)
        if self.approved:
            return f"approved on the forge by {', '.join(self.approved_by)} ({self.counted})"
        if not self.approved_by:
            return (
                f"no approving review of {self.head_sha[:12]} on the forge "
                f"({why or 'no review on the pull request'}; {self.counted})"
            )
        by = f"approved by {', '.join(self.approved_by)}" + (f"; {why}" if why else "")
        return f"{self.counted} of {self.head_sha[:12]} on the forge ({by})"


def standing_reviews(reviews: list[ReviewInfo]) -> dict[str, ReviewInfo]:
    """Each reviewer's latest deciding review (by submission time, then ID)."""
    latest: dict[str, ReviewInfo] = {}
    ordered = sorted(reviews, key=lambda r: (r.submitted_at is None, r.submitted_at, r.id))
    for review in ordered:
        if review.state.upper() in DECIDING:
            latest[review.user] = review
    return latest


def forge_approval(
    pr: PullState,
    head_sha: str,
    *,
    bot_login: str,
    policy: ApprovalPolicy,
    refusal: Callable[[str], str | None],
    now: datetime,
) -> ForgeApproval:
    """Who approves ``head_sha`` of ``pr`` on the forge under the rules above, counted against
    ``policy.required_approvals``. ``refusal(login)`` says why a reviewer may not approve (None: they may; see
    :func:`reviewer_refusal`): it is called only for reviews that would otherwise count, and may raise the
    adapter's errors (an unanswered read must not become an approval). ``now`` is what expiry is judged at."""
    required = policy.required_approvals
    if pr.author != bot_login:
        why = f"PR #{pr.number} is authored by {pr.author!r}, not by {bot_login}"
        return ForgeApproval(head_sha, (), required, (why,))
    reasons: list[str] = []
    approvers: list[str] = []
    for login, review in sorted(standing_reviews(pr.reviews).items()):
        state = review.state.upper()
        if login in (bot_login, pr.author):
            reasons.append(f"{login}'s own review does not count")
        elif state != "APPROVED":
            reasons.append(f"{login}'s latest review is {state.lower().replace('_', ' ')}")
        elif review.commit_id != head_sha:
            reasons.append(f"{login} approved {str(review.commit_id)[:12]}, not this head")
        elif not policy.stands(review.submitted_at, now):
            reasons.append(f"{login}'s approval expired ({policy.label} lets one stand {policy.expiry_s:g}s)")
        elif (refused := refusal(login)) is not None:
            reasons.append(f"{login} lacks the permission to approve: {refused}")
        else:
            approvers.append(login)
    return ForgeApproval(head_sha, tuple(approvers), required, tuple(reasons))


class ReviewerReads(Protocol):
    """The forge reads a policy check makes (``ForgePort`` has them)."""

    def get_permission(self, login: str) -> RepoPermission: ...

    def get_role(self, login: str) -> RepoRole: ...

    def is_team_member(self, team: str, login: str) -> bool: ...


def reviewer_refusal(forge: ReviewerReads, policy: ApprovalPolicy, login: str) -> str | None:
    """Why ``login`` may not approve under ``policy`` (None: they may), read from the forge now: their
    role (``maintain`` needs the role read, which tells it from ``write``; otherwise the permission read, whose
    ``write`` covers maintain), then their team memberships only if the allow-lists need them. Failures are the
    adapter's errors, raised: the caller fails closed."""
    if policy.min_permission == "maintain":
        role = forge.get_role(login)
    else:
        role = ROLE_OF_PERMISSION[forge.get_permission(login)]
    return policy.refusal(login, role, lambda team: forge.is_team_member(team, login))
