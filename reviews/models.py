"""Typed results of forge operations. All are pydantic models: they cross Temporal's data converter."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel


class Ticket(BaseModel):
    """The run's ticket: a marked status comment on the triggering issue, or a marked issue of its own."""

    op_id: str
    kind: Literal["comment", "issue"]
    issue_number: int
    comment_id: int | None = None
    html_url: str
    created: bool = False


class CommentRef(BaseModel):
    """A keyed comment. `action` says what this call did: created, updated in place, or found unchanged."""

    issue_number: int
    comment_id: int
    key: str
    sha256: str
    html_url: str
    action: Literal["created", "updated", "unchanged"]


class PublishResult(BaseModel):
    """Outcome of `publish_branch`. `reconciled` is set when the outcome was settled by reading the remote."""

    branch: str
    sha: str
    status: Literal["pushed", "already_current"]
    reconciled: bool = False


class PullRef(BaseModel):
    number: int
    html_url: str
    head_ref: str
    head_sha: str
    base_ref: str
    draft: bool
    run_id: str
    created: bool = False


class ReviewInfo(BaseModel):
    id: int
    user: str
    state: str
    commit_id: str | None
    submitted_at: datetime | None


class PullState(BaseModel):
    number: int
    state: Literal["open", "closed"]
    draft: bool
    merged: bool
    merge_commit_sha: str | None
    head_ref: str
    head_sha: str
    base_ref: str
    mergeable: bool | None
    reviews: list[ReviewInfo]
    run_id: str | None
    author: str = ""


MergeStatus = Literal["merged", "already_merged", "head_moved", "not_mergeable", "merged_at_other_head"]
# GitHub's merge methods, in the order the adapter prefers them when the caller names none.
MergeMethod = Literal["merge", "squash", "rebase"]
MERGE_METHODS: tuple[MergeMethod, ...] = ("merge", "squash", "rebase")


class MergeResult(BaseModel):
    """Outcome of a merge enforcing `approved_sha`; every expected refusal is a status, not an exception.

    `merged_at_other_head`: the PR is merged, but not at the approved head (someone else merged it).
    `method`: the merge method of the merge this call sent and GitHub accepted (None otherwise).
    """

    status: MergeStatus
    pr_number: int
    approved_sha: str
    merge_commit_sha: str | None = None
    head_sha: str | None = None
    message: str = ""
    reconciled: bool = False
    method: MergeMethod | None = None


class RunFootprint(BaseModel):
    """What one run left on the forge, found by markers and naming, for the demo and for cleanup checks.

    tickets: "comment:<id>" / "issue:<number>" carrying a ticket marker whose op id belongs to the run;
    evidence_comments: ids of keyed comments whose key starts with the evidence prefix;
    branches: branch names under `durafix/<run>/`; claims: the run's claim refs still present.
    """

    run_id: str
    tickets: list[str]
    pull_requests: list[int]
    evidence_comments: list[int]
    branches: list[str]
    claims: list[str]


class ReviewLineComment(BaseModel):
    """A review's comment on a line of the diff (``line`` is None for a comment on a file or an outdated line)."""

    path: str
    line: int | None = None
    body: str


class ReviewFeedback(BaseModel):
    """A submitted review as the forge holds it: its text, the head it was made on, and its line comments."""

    review_id: int
    reviewer: str
    state: str
    body: str
    commit_id: str | None
    comments: list[ReviewLineComment] = []
