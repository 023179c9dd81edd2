"""The forge queue's activities.

Every mutation here is an *ensure* or a conditional write of the adapter (see ``docs/forge-adapter.md``):
a retry first reads GitHub's state and only writes what is missing. That is what makes retrying after an
ambiguous outcome a reconciliation rather than a blind re-send. Forge errors map to failure classes through
the shared table: transient (honouring ``retry-after``), ambiguous, conflict (policy: a human decides),
permanent. Every activity that writes first checks the run's tombstone (``pipeline.activities.forge_fence``):
an attempt that wakes after the run's cleanup writes nothing and fails as ``Policy``; reads are not fenced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from temporalio import activity

from environments.workspace import Workspace, WorkspaceManager
from evidence.interface import ArtifactRef, ArtifactStore
from pipeline import steps
from pipeline.activities.classify import classified
from pipeline.activities.forge_fence import ensure_run_open
from pipeline.activities.heartbeat import Heartbeat
from pipeline.activities.workspace import rebuild
from pipeline.failures import FailureClass
from pipeline.steps import (
    BranchHead,
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
    ReadBranchInput,
    ReadPullInput,
    ReadReportInput,
    ReadReviewInput,
    ReportInfo,
    RequestReviewInput,
    ReviewComment,
    ReviewRead,
    TicketResult,
    UpdateTicketInput,
)
from reviews.approval_policy import ApprovalPolicy, stricter
from reviews.approvals import forge_approval, reviewer_refusal
from reviews.git_credentials import GitCredentials
from reviews.interface import ForgePort
from reviews.models import PullState, Ticket

ForgeFor = Callable[[str], ForgePort]
"""The adapter for a repository (``OWNER/REPO``); a PyGithub client is not thread-safe, so one per thread."""


class ForgeActivities:
    def __init__(
        self,
        forge_for: ForgeFor,
        clone_url: Callable[[str], str],
        store: ArtifactStore,
        workspaces: WorkspaceManager,
        git_token: GitCredentials,
        *,
        approval_policy: ApprovalPolicy | None = None,
        operator_approval: bool = False,
    ) -> None:
        self.forge_for = forge_for
        self.clone_url = clone_url
        self.store = store
        self.workspaces = workspaces
        self.git_token = git_token
        # This worker's configured policy: the merge applies the stricter of it and the run's own (a run's input
        # is whatever its starter sent, so it may loosen nothing), and it alone for a run that carries none
        # (started before policies were carried).
        self.approval_policy = approval_policy or ApprovalPolicy()
        # Whether an operator's approval (``durafix approve``) merges without a review on the forge.
        self.operator_approval = operator_approval

    def all(self) -> Sequence[Callable[..., object]]:
        return [
            self.read_report,
            self.ensure_ticket,
            self.update_ticket,
            self.publish_branch,
            self.ensure_draft_pr,
            self.ensure_comment,
            self.read_pr,
            self.read_branch,
            self.read_review,
            self.request_review,
            self.merge,
        ]

    @activity.defn(name=steps.READ_REPORT.name)
    def read_report(self, inp: ReadReportInput) -> ReportInfo:
        """Read-only: the issue's text and the base branch's current head (the run's target revision)."""
        with classified():
            forge = self.forge_for(inp.repository)
            issue = forge.read_issue(inp.issue_number)
            base = forge.get_branch_sha(inp.base_branch)
        if base is None:
            raise FailureClass.PERMANENT.error(f"base branch {inp.base_branch!r} does not exist in {inp.repository}")
        return ReportInfo(
            title=issue.title,
            body=issue.body,
            author=issue.author,
            base_revision=base,
            clone_url=self.clone_url(inp.repository),
        )

    @activity.defn(name=steps.ENSURE_TICKET.name)
    def ensure_ticket(self, inp: EnsureTicketInput) -> TicketResult:
        """One status comment per operation ID (claim ref + marker; see ``reviews.tickets``). Fenced."""
        with classified():
            ensure_run_open(self.store, f"to ensure the ticket {inp.op_id}")
            ticket = self.forge_for(inp.repository).ensure_ticket(inp.op_id, inp.issue_number, inp.title, inp.body)
        return TicketResult(issue_number=ticket.issue_number, comment_id=ticket.comment_id, url=ticket.html_url)

    @activity.defn(name=steps.UPDATE_TICKET.name)
    def update_ticket(self, inp: UpdateTicketInput) -> None:
        """Edit the status comment in place; idempotent. Fenced, except the run's closing update (``closing``),
        which the run sends after its own cleanup (``pipeline.activities.forge_fence``)."""
        ticket = Ticket(
            op_id=inp.op_id,
            kind="comment" if inp.comment_id is not None else "issue",
            issue_number=inp.issue_number,
            comment_id=inp.comment_id,
            html_url="",
        )
        with classified():
            if not inp.closing:
                ensure_run_open(self.store, f"to update the ticket {inp.op_id}")
            self.forge_for(inp.repository).update_ticket(ticket, inp.body)

    @activity.defn(name=steps.PUBLISH_BRANCH.name)
    def publish_branch(self, inp: PublishBranchInput) -> PublishResult:
        """Rebuild the candidate commit (deterministic: same SHA as verified) and push it conditionally. Fenced
        before the rebuild and again before the push (the rebuild can take a while)."""
        with classified():
            ensure_run_open(self.store, f"to rebuild the candidate of {inp.op_id}", inp.run_id)
            if inp.parent_commit is not None:
                # A revision is stacked on the head under review, which is on the forge already.
                self.workspaces.mirrors.ensure(
                    inp.clone_url, inp.parent_commit, token=self.git_token.token_for(inp.clone_url)
                )
            ws = self._rebuild_candidate(inp.run_id, inp.op_id, inp.clone_url, inp.base_revision, inp.patch_ref)
            try:
                commit = self.workspaces.commit(ws, inp.message, inp.commit_timestamp, parent=inp.parent_commit)
                if commit != inp.expected_commit:
                    raise FailureClass.PERMANENT.error(
                        f"rebuilt candidate {commit} differs from the verified commit {inp.expected_commit}"
                    )
                ensure_run_open(self.store, f"to push {inp.branch} for {inp.op_id}", inp.run_id)
                with Heartbeat(f"pushing {commit[:12]} to {inp.branch}"):
                    result = self.forge_for(inp.repository).publish_branch(
                        inp.branch, commit, inp.expected_old, ws.path
                    )
            finally:
                self.workspaces.remove(ws)
        return PublishResult(commit=result.sha, pushed=result.status == "pushed")

    def _rebuild_candidate(
        self, run_id: str, op_id: str, clone_url: str, base: str, patch_ref: ArtifactRef
    ) -> Workspace:
        patch = self.store.read_bytes(patch_ref).decode()
        return rebuild(self.workspaces, self.git_token, run_id, op_id, clone_url, base, patch)

    @activity.defn(name=steps.ENSURE_DRAFT_PR.name)
    def ensure_draft_pr(self, inp: EnsureDraftPrInput) -> PullInfo:
        """One open draft PR per head branch, carrying the run's marker (see ``reviews.pulls``). Fenced: the
        adapter finds only an *open* PR, so after the run's PR was merged a late attempt would open another."""
        with classified():
            ensure_run_open(self.store, f"to open the PR of {inp.op_id}", inp.run_id)
            pr = self.forge_for(inp.repository).ensure_draft_pr(inp.run_id, inp.branch, inp.base, inp.title, inp.body)
        return PullInfo(
            number=pr.number, url=pr.html_url, head_sha=pr.head_sha, state="open", draft=pr.draft, merged=False
        )

    @activity.defn(name=steps.ENSURE_COMMENT.name)
    def ensure_comment(self, inp: EnsureCommentInput) -> CommentResult:
        """One comment per key; the same content is never posted twice (see ``reviews.comments``). Fenced."""
        with classified():
            ensure_run_open(self.store, f"to comment {inp.key}")
            ref = self.forge_for(inp.repository).ensure_comment(inp.number, inp.key, inp.body)
        return CommentResult(comment_id=ref.comment_id, created=ref.action == "created")

    @activity.defn(name=steps.READ_PR.name)
    def read_pr(self, inp: ReadPullInput) -> PullInfo:
        with classified():
            pr = self.forge_for(inp.repository).get_pr(inp.number)
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

    @activity.defn(name=steps.READ_BRANCH.name)
    def read_branch(self, inp: ReadBranchInput) -> BranchHead:
        """Read-only: the branch's head now (the base branch, before merging)."""
        with classified():
            return BranchHead(sha=self.forge_for(inp.repository).get_branch_sha(inp.branch))

    @activity.defn(name=steps.READ_REVIEW.name)
    def read_review(self, inp: ReadReviewInput) -> ReviewRead:
        """Read-only: the review and its line comments as the forge holds them now (``reviews.feedback``)."""
        with classified():
            review = self.forge_for(inp.repository).read_review(inp.number, inp.review_id)
        return ReviewRead(
            review_id=review.review_id,
            reviewer=review.reviewer,
            state=review.state,
            body=review.body,
            commit_id=review.commit_id,
            comments=[ReviewComment(path=c.path, line=c.line, body=c.body) for c in review.comments],
        )

    @activity.defn(name=steps.REQUEST_REVIEW.name)
    def request_review(self, inp: RequestReviewInput) -> None:
        """Ask ``reviewers`` to review the PR (again); idempotent on the forge (``reviews.feedback``). Fenced."""
        with classified():
            ensure_run_open(self.store, f"to request a review of PR #{inp.number}")
            self.forge_for(inp.repository).request_review(inp.number, inp.reviewers)

    @activity.defn(name=steps.MERGE.name)
    def merge(self, inp: MergeInput) -> MergeOutcome:
        """Merge only at the approved head, and only on an approval with authority: the PR's reviews are read
        again and the APPROVED reviews of that head by ``required_approvals`` distinct reviewers the approval
        policy admits must stand on the forge (``reviews.approvals``; the policy is the stricter of the run's and
        this worker's configured one, ``reviews.approval_policy.stricter``), unless the approval is an
        operator's and this worker allows those. Otherwise nothing is merged (``NOT_APPROVED``, its detail
        saying how many of how many approvals stand). A draft is first
        marked ready for review (GitHub refuses to merge drafts); both steps are idempotent, and an ambiguous
        merge is reconciled by reading the PR. A PR whose head is no longer the approved one is ``HEAD_MOVED``
        at once (the forge's merge would say so too, but only after the draft was made ready). Fenced: a run
        cleaned up merges nothing."""
        with classified():
            ensure_run_open(self.store, f"to merge PR #{inp.number} for {inp.op_id}")
            forge = self.forge_for(inp.repository)
            state = forge.get_pr(inp.number)
            if not state.merged:
                refusal = self._without_authority(forge, state, inp)
                if refusal is not None:
                    activity.logger.info("not merging PR #%s: %s", inp.number, refusal)
                    return MergeOutcome(status=MergeStatus.NOT_APPROVED, detail=refusal)
            if not state.merged and state.head_sha != inp.approved_sha:
                # Said before anything is written: a draft whose head moved is never marked ready (the forge
                # would then refuse the merge as a draft, hiding that the head moved).
                return MergeOutcome(
                    status=MergeStatus.HEAD_MOVED,
                    detail=f"the PR head is {state.head_sha}, not the approved {inp.approved_sha}",
                )
            if state.draft and not state.merged:
                forge.mark_ready_for_review(inp.number)
            result = forge.merge(inp.number, inp.approved_sha)
        status = {
            "merged": MergeStatus.MERGED,
            "already_merged": MergeStatus.ALREADY_MERGED,
            "head_moved": MergeStatus.HEAD_MOVED,
            "not_mergeable": MergeStatus.NOT_MERGEABLE,
        }.get(result.status)
        if status is None:
            raise FailureClass.POLICY.error(
                f"the PR was merged at {result.head_sha}, not at the approved {inp.approved_sha}"
            )
        return MergeOutcome(status=status, merged_sha=result.merge_commit_sha, detail=result.message)

    def _without_authority(self, forge: ForgePort, pr: PullState, inp: MergeInput) -> str | None:
        """None when the approval in ``inp`` may merge ``pr``; otherwise why not."""
        # Approvals read from a review on the forge (a webhook's, or the reconciler's reading of the PR) are
        # checked against the forge's reviews; any other source is an operator's word.
        if inp.source not in ("webhook", "reconciler"):
            if self.operator_approval:
                return None
            return (
                f"an approval by {inp.reviewer} from {inp.source} has no review behind it, and operator approvals "
                "are not enabled (DURAFIX_OPERATOR_APPROVAL)"
            )
        configured = self.approval_policy
        policy = configured if inp.approval_policy is None else stricter(inp.approval_policy, configured)
        check = forge_approval(
            pr,
            inp.approved_sha,
            bot_login=forge.login(),
            policy=policy,
            refusal=lambda login: reviewer_refusal(forge, policy, login),
            now=datetime.now(UTC),
        )
        return None if check.approved else check.detail
