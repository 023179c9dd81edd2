"""Whether the forge itself approves a head: the authority a merge is checked against.

An `approve` Update can be sent by anything that reaches Temporal, so the merge does not take the run's word
for an approval: it reads the PR's reviews again and looks for one that GitHub would count. The rules, as
GitHub applies them to a required review:

- each reviewer's **latest** review that decides anything (`APPROVED`, `CHANGES_REQUESTED`, `DISMISSED`;
  `COMMENTED` decides nothing) is their standing; an approval later dismissed, or followed by a request
  for changes, no longer approves;
- it approves the head only when its `commit_id` is that head (a review stays on the PR after later pushes);
- the PR must be durafix's own (authored by the bot), and the bot's own reviews and the PR author's never count;
- the reviewer must hold at least the required permission on the repository, read from the forge now.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from reviews.models import PullState, ReviewInfo

DECIDING = ("APPROVED", "CHANGES_REQUESTED", "DISMISSED")


@dataclass(frozen=True)
class ForgeApproval:
    """The outcome of the check: who approves ``head_sha`` (None: nobody), and why each other review did not."""

    head_sha: str
    approved_by: str | None
    reasons: tuple[str, ...]

    @property
    def detail(self) -> str:
        if self.approved_by is not None:
            return f"approved on the forge by {self.approved_by}"
        why = "; ".join(self.reasons) or "no review on the pull request"
        return f"no approving review of {self.head_sha[:12]} on the forge ({why})"


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
    permitted: Callable[[str], bool],
) -> ForgeApproval:
    """Who (if anyone) approves ``head_sha`` of ``pr`` on the forge under the rules above. ``permitted``
    reads a reviewer's permission (it is called only for reviews that would otherwise count, and may raise
    the adapter's errors: an unanswered read must not become an approval)."""
    if pr.author != bot_login:
        return ForgeApproval(head_sha, None, (f"PR #{pr.number} is authored by {pr.author!r}, not by {bot_login}",))
    reasons: list[str] = []
    for login, review in sorted(standing_reviews(pr.reviews).items()):
        state = review.state.upper()
        if login in (bot_login, pr.author):
            reasons.append(f"{login}'s own review does not count")
        elif state != "APPROVED":
            reasons.append(f"{login}'s latest review is {state.lower().replace('_', ' ')}")
        elif review.commit_id != head_sha:
            reasons.append(f"{login} approved {str(review.commit_id)[:12]}, not this head")
        elif not permitted(login):
            reasons.append(f"{login} lacks the permission to approve")
        else:
            return ForgeApproval(head_sha, login, tuple(reasons))
    return ForgeApproval(head_sha, None, tuple(reasons))
