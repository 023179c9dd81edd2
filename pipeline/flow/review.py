"""The review gate: ask for a review of the head under review, wait for a decision, and act on it (verify a
moved head, revise on a request for changes, reject, or merge on an approval that still stands)."""

from __future__ import annotations

from datetime import timedelta
from typing import NoReturn

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pipeline import steps
    from pipeline.flow.context import RunContext
    from pipeline.flow.moved import MovedHeads
    from pipeline.flow.revise import Revisions
    from pipeline.ids import op_id
    from pipeline.patches import (
        BASE_MOVED_PATCH,
        MOVED_HEAD_PATCH,
        REVIEW_CONTINUE_AS_NEW_PATCH,
        REVIEW_ON_FORGE_PATCH,
        REVIEW_TICKET_PATCH,
        REVISIONS_PATCH,
    )
    from pipeline.state import Approval, ApprovalRequest, HeadPush, Outcome, Phase, PublishFact
    from pipeline.steps import EnsureCommentInput, MergeInput, MergeOutcome, MergeStatus, PullInfo, ReadPullInput

# How a phase that may end the run says so: the outcome and its detail; None means the run goes on.
Ending = tuple[Outcome, str]

# The review wait's own bound on one execution's history, well inside Temporal's (51,200 events, 50 MB) and
# below the point where the server suggests continuing as new (about 4,096 events or 4 MiB by default): a wait
# of weeks, with hundreds of pushes and deliveries, continues as new at whichever comes first.
REVIEW_HISTORY_EVENTS = 2_000
REVIEW_HISTORY_BYTES = 2 * 1024 * 1024


class ReviewGate:
    """The review wait and the merge (see the module docstring). ``head`` is the head under review."""

    def __init__(self, ctx: RunContext, moved: MovedHeads, revisions: Revisions) -> None:
        self.ctx = ctx
        self.moved = moved
        self.revisions = revisions
        self.head = ""
        self.renewals = 0
        # Whether the wait continues as new when the server suggests it (REVIEW_CONTINUE_AS_NEW_PATCH), and
        # how many times the run has.
        self.carries = False
        self.continued = 0

    @property
    def publish(self) -> PublishFact:
        publish = self.ctx.state.publish
        assert publish is not None and publish.pr_number is not None and publish.evidence_digest is not None
        return publish

    @property
    def pr_number(self) -> int:
        number = self.ctx.state.publish.pr_number if self.ctx.state.publish else None
        assert number is not None
        return number

    async def run(self) -> Ending:
        """Rounds of the review wait until one ends the run, continuing as new between rounds when the server
        suggests it. A run continued as new starts here, with the head and counters it carried."""
        carry = self.ctx.input.resume
        self.head = carry.head if carry is not None else self.publish.commit
        self.renewals = carry.renewals if carry is not None else 0
        self.continued = carry.continued if carry is not None else 0
        self.ctx.decisions.gate = self.ctx.patched(MOVED_HEAD_PATCH)
        self.carries = self.ctx.patched(REVIEW_CONTINUE_AS_NEW_PATCH)
        while True:
            if self._suggested():
                await self._continue_as_new()
            ending = await self._round()
            if ending is not None:
                return ending

    def _suggested(self) -> bool:
        """Whether the wait continues as new now: the server suggests it, or this execution's history passed
        the wait's own bound (:data:`REVIEW_HISTORY_EVENTS`, :data:`REVIEW_HISTORY_BYTES`)."""
        return self.carries and self.ctx.history_beyond(REVIEW_HISTORY_EVENTS, REVIEW_HISTORY_BYTES)

    async def _continue_as_new(self) -> NoReturn:
        """Continue the run as new with exactly the state it needs, once every handler in flight has finished
        (an Update answered in this execution is recorded in the state carried)."""
        await workflow.wait_condition(workflow.all_handlers_finished)
        carry = self.ctx.carry(self.head, self.renewals, self.continued + 1)
        workflow.continue_as_new(self.ctx.input.model_copy(update={"resume": carry}))

    async def _round(self) -> Ending | None:
        """One wait for a decision and what follows it; None: wait again."""
        held = self.ctx.decisions
        if not await self._verify_moved_heads():
            return None
        await self._ask()
        if not await self._wait():
            return Outcome.REJECTED, "no review before the review deadline"
        if held.gate and held.moved_head is not None and held.rejection is None:
            return None  # the moved head is verified before anything else is decided about the PR
        if held.approval is None and held.rejection is None and held.revision_request is None:
            return None  # woken to continue as new: nothing is decided yet
        if held.rejection is None and held.revision_request is not None:
            request, held.revision_request = held.revision_request, None
            if self.ctx.patched(REVISIONS_PATCH):
                await self.revisions.revise(request)
                self.head = self.publish.commit
                return None
            held.rejection = request  # as runs recorded before revisions took it
        if held.rejection is not None:
            r = held.rejection
            return Outcome.REJECTED, f"rejected by {r.reviewer}" + (f": {r.reason}" if r.reason else "")
        return await self._merge()

    async def _verify_moved_heads(self) -> bool:
        """Verify the moved heads seen, the latest first; False when the run is to continue as new first (the
        moved head is carried and verified by the next execution)."""
        held = self.ctx.decisions
        while held.gate and held.moved_head is not None:
            if self._suggested():
                return False
            push, held.moved_head = held.moved_head, None
            await self.moved.gate_moved_head(push)
            self.head = self.publish.commit
        return True

    async def _ask(self) -> None:
        """Enter the review wait asking for a review of the head under review."""
        ctx = self.ctx
        publish = self.publish
        assert publish.pr_number is not None and publish.evidence_digest is not None
        ctx.enter(Phase.AWAITING_REVIEW)
        ctx.state.pending_approval = ApprovalRequest(
            pr_number=publish.pr_number,
            head_sha=self.head,
            evidence_digest=publish.evidence_digest,
            requested_at=ctx.now(),
        )
        ctx.record_state()
        if ctx.patched(REVIEW_TICKET_PATCH):
            await ctx.update_ticket(note=ctx.decisions.review_note)

    async def _wait(self) -> bool:
        """Wait for a decision (or a moved head to verify); False when the review deadline passed first."""
        held = self.ctx.decisions
        return await self.ctx.wait_for(
            lambda: (
                held.approval is not None
                or held.rejection is not None
                or held.revision_request is not None
                or (held.gate and held.moved_head is not None)
                or self._suggested()
            ),
            timeout=timedelta(seconds=self.ctx.input.policy.review_timeout_s),
        )

    async def _merge(self) -> Ending | None:
        """Merge on the approval taken, if it still stands on the PR as it is now; None: wait again."""
        ctx = self.ctx
        approval = ctx.decisions.approval
        assert approval is not None
        ctx.state.approval = approval
        ctx.state.pending_approval = None
        ctx.enter(Phase.MERGE)
        pr = await self._read_pr()
        if pr.merged:
            if pr.head_sha == approval.head_sha:
                ctx.state.merged_sha = pr.merge_commit_sha
                return Outcome.MERGED, "the PR was already merged at the approved head"
            return Outcome.AMBIGUOUS_NEEDS_HUMAN, f"the PR was merged by someone else at {pr.head_sha}"
        if pr.state != "open":
            return Outcome.REJECTED, "the PR was closed without merging"
        if approval.expires_at is not None and ctx.now() >= approval.expires_at:
            # The decision no longer stands: ask again for the same head rather than merge on it.
            ctx.clear_approval()
            when = approval.expires_at.isoformat()
            await ctx.update_ticket(
                note=f"the approval by {approval.reviewer} expired at {when}; renewed review needed"
            )
            return None
        if ctx.decisions.gate and ctx.patched(BASE_MOVED_PATCH) and await self.moved.reverify_on_moved_base():
            self.head = self.publish.commit  # a rebuilt head was pushed: it is reviewed again before any merge
            return None
        merged = await ctx.step(
            steps.MERGE,
            MergeInput(
                op_id=op_id(ctx.wf, "merge", self.renewals + 1),
                repository=ctx.input.repository,
                number=self.pr_number,
                approved_sha=approval.head_sha,
                reviewer=approval.reviewer,
                source=approval.source,
                review_id=approval.review_id,
                approval_policy=ctx.input.policy.approval_policy,
            ),
        )
        return await self._merged(merged, approval)

    async def _merged(self, merged: MergeOutcome, approval: Approval) -> Ending | None:
        """What the merge step's outcome means for the run; None: wait again."""
        if merged.status == MergeStatus.NOT_APPROVED and self.ctx.patched(REVIEW_ON_FORGE_PATCH):
            # The approval has no standing on the forge: it is dropped, and a reviewer is asked for one.
            self.ctx.clear_approval()
            await self._ask_for_review(approval, merged.detail)
            return None
        if merged.status in (MergeStatus.MERGED, MergeStatus.ALREADY_MERGED):
            self.ctx.state.merged_sha = merged.merged_sha
            return Outcome.MERGED, f"merged {approval.head_sha[:12]} approved by {approval.reviewer}"
        if merged.status == MergeStatus.NOT_MERGEABLE:
            return Outcome.AMBIGUOUS_NEEDS_HUMAN, f"the PR is not mergeable: {merged.detail}"
        await self._head_moved_after_approval()
        return None

    async def _head_moved_after_approval(self) -> None:
        """The head moved after the approval: the approval does not cover it, ask for a renewed review."""
        ctx = self.ctx
        self.renewals += 1
        current = await self._read_pr()
        if ctx.decisions.gate:
            # Verified first, with new evidence, before a renewed review of it is asked for (the approval
            # is dropped there; its reviewer is asked again).
            assert self.publish.pr_number is not None
            moved = HeadPush(pr_number=self.publish.pr_number, head_sha=current.head_sha, source="merge")
            if not self.moved.decide.note_moved_head(moved) and ctx.decisions.moved_head is None:
                ctx.clear_approval()
                ctx.decisions.review_note = (
                    f"the merge found the PR head moved; `{self.head[:12]}` is still under review"
                )
            return
        ctx.clear_approval()
        self.head = current.head_sha
        await ctx.update_ticket(note=f"the PR head moved to {self.head[:12]} after approval; renewed review needed")

    async def _read_pr(self) -> PullInfo:
        assert self.publish.pr_number is not None
        return await self.ctx.step(
            steps.READ_PR, ReadPullInput(repository=self.ctx.input.repository, number=self.publish.pr_number)
        )

    async def _ask_for_review(self, approval: Approval, why: str) -> None:
        """Say on the PR (one keyed comment per head) and on the ticket that the approval received does not
        stand on the forge, and what would: a review approving the head under review."""
        ctx = self.ctx
        head = self.head
        assert self.publish.pr_number is not None
        ask = (
            f"durafix received an approval of `{head}` ({approval.source}, by {approval.reviewer}) but did not merge: "
            f"{why}. To merge, a reviewer with permission to approve submits an **Approve** review of `{head}` "
            "on this pull request."
        )
        await ctx.step(
            steps.ENSURE_COMMENT,
            EnsureCommentInput(
                repository=ctx.input.repository,
                number=self.publish.pr_number,
                key=f"{ctx.wf}:review-needed:{head}",
                body=ask,
            ),
        )
        ctx.decisions.review_note = f"not merged: {why}; waiting for an approving review of `{head[:12]}` on the PR"
        await ctx.update_ticket(note=ctx.decisions.review_note)
