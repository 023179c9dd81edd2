"""Temporal activities of the forge queue.

Every mutation here is an *ensure* or a conditional write of the adapter (see ``docs/forge-adapter.md``):
a retry first reads GitHub's state and only writes what is missing. That is what makes retrying after an
ambiguous outcome a reconciliation rather than a blind re-send. Failure classes map one to one:
``ForgeTransientError`` -> Transient (honouring ``retry-after``), ``ForgeAmbiguousError`` -> Ambiguous,
``ForgeConflictError`` -> Policy (a human decides), ``ForgePermanentError`` -> Permanent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from temporalio import activity

from environments.workspace import Workspace
from evidence.interface import ArtifactRef
from pipeline import failures
from pipeline.heartbeat import Heartbeat
from pipeline.services import Services
from pipeline.steps import (
    CommentResult,
    EnsureCommentInput,
    EnsureDraftPrInput,
    EnsureTicketInput,
    MergeInput,
    MergeOutcome,
    MergeStatus,
    PublishBranchInput,
    PublishResult,
    PullInfo,
    ReadPullInput,
    ReadReportInput,
    ReportInfo,
    TicketResult,
    UpdateTicketInput,
)
from reviews.errors import (
    ForgeAmbiguousError,
    ForgeConflictError,
    ForgeError,
    ForgePermanentError,
    ForgeTransientError,
)
from reviews.models import Ticket


@contextmanager
def classified() -> Iterator[None]:
    """Re-raise adapter errors as the pipeline's failure classes."""
    try:
        yield
    except ForgeTransientError as err:
        raise failures.transient(f"forge: {err}", err.retry_after_s) from err
    except ForgeAmbiguousError as err:
        raise failures.ambiguous(f"forge: {err}") from err
    except ForgeConflictError as err:
        raise failures.policy(f"forge conflict: {err}") from err
    except ForgePermanentError as err:
        raise failures.permanent(f"forge: {err}") from err
    except ForgeError as err:
        raise failures.permanent(f"forge: {err}") from err


class ForgeActivities:
    def __init__(self, services: Services) -> None:
        self.services = services

    def all(self) -> Sequence[Callable[..., object]]:
        return [
            self.read_report,
            self.ensure_ticket,
            self.update_ticket,
            self.publish_branch,
            self.ensure_draft_pr,
            self.ensure_comment,
            self.read_pr,
            self.merge,
        ]

    @activity.defn(name="forge.read_report")
    def read_report(self, inp: ReadReportInput) -> ReportInfo:
        """Read-only: the issue's text and the base branch's current head (the run's target revision)."""
        with classified():
            forge = self.services.forge(inp.repository)
            issue = forge.read_issue(inp.issue_number)
            base = forge.get_branch_sha(inp.base_branch)
        if base is None:
            raise failures.permanent(f"base branch {inp.base_branch!r} does not exist in {inp.repository}")
        return ReportInfo(
            title=issue.title,
            body=issue.body,
            author=issue.author,
            base_revision=base,
            clone_url=self.services.config.clone_url(inp.repository),
        )

    @activity.defn(name="forge.ensure_ticket")
    def ensure_ticket(self, inp: EnsureTicketInput) -> TicketResult:
        """One status comment per operation ID (claim ref + marker; see ``reviews.tickets``)."""
        with classified():
            ticket = self.services.forge(inp.repository).ensure_ticket(inp.op_id, inp.issue_number, inp.title, inp.body)
        return TicketResult(issue_number=ticket.issue_number, comment_id=ticket.comment_id, url=ticket.html_url)

    @activity.defn(name="forge.update_ticket")
    def update_ticket(self, inp: UpdateTicketInput) -> None:
        """Edit the status comment in place; idempotent."""
        ticket = Ticket(
            op_id=inp.op_id,
            kind="comment" if inp.comment_id is not None else "issue",
            issue_number=inp.issue_number,
            comment_id=inp.comment_id,
            html_url="",
        )
        with classified():
            self.services.forge(inp.repository).update_ticket(ticket, inp.body)

    @activity.defn(name="forge.publish_branch")
    def publish_branch(self, inp: PublishBranchInput) -> PublishResult:
        """Rebuild the candidate commit (deterministic: same SHA as verified) and push it conditionally."""
        ws = self._rebuild_candidate(inp.run_id, inp.op_id, inp.clone_url, inp.base_revision, inp.patch_ref)
        try:
            commit = self.services.workspaces.commit(ws, inp.message, inp.commit_timestamp)
            if commit != inp.expected_commit:
                raise failures.permanent(
                    f"rebuilt candidate {commit} differs from the verified commit {inp.expected_commit}"
                )
            with Heartbeat(f"pushing {commit[:12]} to {inp.branch}"), classified():
                result = self.services.forge(inp.repository).publish_branch(
                    inp.branch, commit, inp.expected_old, ws.path
                )
        finally:
            self.services.workspaces.remove(ws)
        return PublishResult(commit=result.sha, pushed=result.status == "pushed")

    def _rebuild_candidate(
        self, run_id: str, op_id: str, clone_url: str, base: str, patch_ref: ArtifactRef
    ) -> Workspace:
        patch = self.services.store.read_bytes(patch_ref).decode()
        return self.services.workspaces.rebuild(
            run_id=run_id,
            op_id=op_id,
            clone_url=clone_url,
            base_revision=base,
            patch=patch,
            token=self.services.config.forge_token or None,
        )

    @activity.defn(name="forge.ensure_draft_pr")
    def ensure_draft_pr(self, inp: EnsureDraftPrInput) -> PullInfo:
        """One open draft PR per head branch, carrying the run's marker (see ``reviews.pulls``)."""
        with classified():
            forge = self.services.forge(inp.repository)
            pr = forge.ensure_draft_pr(inp.run_id, inp.branch, inp.base, inp.title, inp.body)
        return PullInfo(
            number=pr.number, url=pr.html_url, head_sha=pr.head_sha, state="open", draft=pr.draft, merged=False
        )

    @activity.defn(name="forge.ensure_comment")
    def ensure_comment(self, inp: EnsureCommentInput) -> CommentResult:
        """One comment per key; the same content is never posted twice (see ``reviews.comments``)."""
        with classified():
            ref = self.services.forge(inp.repository).ensure_comment(inp.number, inp.key, inp.body)
        return CommentResult(comment_id=ref.comment_id, created=ref.action == "created")

    @activity.defn(name="forge.read_pr")
    def read_pr(self, inp: ReadPullInput) -> PullInfo:
        with classified():
            pr = self.services.forge(inp.repository).get_pr(inp.number)
        return PullInfo(
            number=pr.number,
            url="",
            head_sha=pr.head_sha,
            state=pr.state,
            draft=pr.draft,
            merged=pr.merged,
            merge_commit_sha=pr.merge_commit_sha,
            mergeable=pr.mergeable,
        )

    @activity.defn(name="forge.merge")
    def merge(self, inp: MergeInput) -> MergeOutcome:
        """Merge only at the approved head. A draft is first marked ready for review (GitHub refuses to
        merge drafts); both steps are idempotent, and an ambiguous merge is reconciled by reading the PR."""
        with classified():
            forge = self.services.forge(inp.repository)
            state = forge.get_pr(inp.number)
            if state.draft and not state.merged and state.head_sha == inp.approved_sha:
                forge.mark_ready_for_review(inp.number)
            result = forge.merge(inp.number, inp.approved_sha)
        status = {
            "merged": MergeStatus.MERGED,
            "already_merged": MergeStatus.ALREADY_MERGED,
            "head_moved": MergeStatus.HEAD_MOVED,
            "not_mergeable": MergeStatus.NOT_MERGEABLE,
        }.get(result.status)
        if status is None:
            raise failures.policy(f"the PR was merged at {result.head_sha}, not at the approved {inp.approved_sha}")
        return MergeOutcome(status=status, merged_sha=result.merge_commit_sha, detail=result.message)
