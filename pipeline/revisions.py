"""Revisions on review: the texts a revision is built from and says on the PR.

A permitted reviewer's ``changes_requested`` review of the head under review starts a revision (see
``pipeline.flow.revise.Revisions.revise``): a bounded repair attempt on top of that head, told what the review said (its
body and line comments, read from the forge), verified like any candidate, and pushed to the same branch as a
commit on top of the head under review. Everything here is pure (no I/O), so the workflow can call it.
"""

from __future__ import annotations

from pipeline.state import Rejection
from pipeline.steps import ReviewRead


def feedback_text(request: Rejection, review: ReviewRead | None) -> str:
    """What the reviewer asked for, as the revision's first message carries it: the review's body and each
    line comment with its place. Without a review read from the forge (a request carrying no review ID), the
    reason the request carried."""
    if review is None:
        return f"Review by {request.reviewer}:\n\n{request.reason.strip() or '(no text)'}"
    lines = [f"Review by {review.reviewer} of commit {review.commit_id or 'unknown'}:", "", review.body.strip()]
    if review.comments:
        lines += ["", "Line comments:"]
        for c in review.comments:
            where = f"{c.path}:{c.line}" if c.line is not None else c.path
            lines.append(f"- {where}: {c.body.strip()}")
    return "\n".join(lines)


def revision_commit_message(issue_number: int, workflow_id: str, revision: int, reviewer: str, summary: str) -> str:
    return (
        f"Revise the fix for #{issue_number} as {reviewer} asked (revision {revision})\n\n"
        f"{summary.strip()}\n\nRun: {workflow_id}\n"
    )


def revised_comment(revision: int, revisions_max: int, reviewer: str, old_head: str, new_head: str) -> str:
    return (
        f"durafix revised the fix as {reviewer} asked (revision {revision} of at most {revisions_max}): "
        f"`{new_head}` is pushed on top of `{old_head}`. Its evidence is in the comment for `{new_head}`; "
        f"to merge, a reviewer approves `{new_head}`."
    )


def revision_failed_comment(revision: int, revisions_max: int, reviewer: str, head: str, why: str) -> str:
    left = revisions_max - revision
    return (
        f"durafix tried to revise the fix as {reviewer} asked (revision {revision} of at most {revisions_max}) "
        f"but the revision did not pass: {why}. Nothing was pushed: `{head}` is still the head under review. "
        f"{left} revision(s) left; a reviewer may approve `{head}`, request changes again, or reject."
    )


def budget_spent_comment(revisions_max: int, reviewer: str, head: str) -> str:
    return (
        f"{reviewer} requested changes to `{head}`, but this run's revision budget ({revisions_max} revision(s)) "
        "is spent, so durafix makes no further change and ends the run as rejected. The branch and this PR "
        "are left as they are; a maintainer may change them by hand, or open a new report."
    )
