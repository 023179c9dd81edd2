"""`ForgePort`: what the workflow's activities need from a forge, with no PyGithub type in sight."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from reviews.issues import IssueInfo
from reviews.models import (
    CommentRef,
    MergeMethod,
    MergeResult,
    PublishResult,
    PullRef,
    PullState,
    ReviewFeedback,
    RunFootprint,
    Ticket,
)
from reviews.permissions import RepoPermission, RepoRole


class ForgePort(Protocol):
    """Forge operations with stated contracts; see each implementation's docstring and docs/forge-adapter.md.

    Every mutation is safe to call again with the same arguments after any failure: it first reads
    GitHub's state and only writes what is missing, conditionally. Failures raise the classes of
    `reviews.errors`; expected refusals of a merge are `MergeResult` statuses.
    """

    def read_issue(self, number: int) -> IssueInfo: ...

    def ensure_ticket(self, op_id: str, issue_number: int | None, title: str, body: str) -> Ticket: ...

    def update_ticket(self, ticket: Ticket, body: str) -> Ticket: ...

    def find_ticket(self, op_id: str) -> Ticket | None: ...

    def publish_branch(
        self, branch: str, commit_sha: str, expected_old: str | None, local_repo: Path
    ) -> PublishResult: ...

    def get_branch_sha(self, branch: str) -> str | None: ...

    def ensure_draft_pr(self, run_id: str, branch: str, base: str, title: str, body: str) -> PullRef: ...

    def ensure_comment(self, number: int, key: str, body: str) -> CommentRef: ...

    def mark_ready_for_review(self, pr_number: int) -> None: ...

    def get_pr(self, number: int) -> PullState: ...

    def get_permission(self, login: str) -> RepoPermission: ...

    def get_role(self, login: str) -> RepoRole: ...

    def is_team_member(self, team: str, login: str) -> bool: ...

    def read_review(self, pr_number: int, review_id: int) -> ReviewFeedback: ...

    def request_review(self, pr_number: int, logins: list[str]) -> None: ...

    def login(self) -> str: ...

    def merge(self, pr_number: int, approved_sha: str, method: MergeMethod | None = None) -> MergeResult: ...

    def add_labels(self, number: int, labels: list[str]) -> None: ...

    def footprint(self, run_id: str, issue_number: int | None) -> RunFootprint: ...
