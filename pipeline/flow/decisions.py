"""What the workflow's handlers decide: approvals, rejections, requests for changes, withdrawals, moved heads
and webhook deliveries. The handlers in :mod:`pipeline.workflow` are one line each; their logic is here.

Validators (:meth:`Decisions.approval_refusal`) read the run's state and :class:`ReviewDecisions` only: they
never ask ``workflow.patched`` (a validator must not write to the history), and what a patch decided is a
plain field set by the run (``gate``)."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pipeline import head_gate
    from pipeline.flow.context import RunContext
    from pipeline.patches import EARLY_DECISIONS_PATCH
    from pipeline.state import (
        Approval,
        ApprovalRequest,
        Delivered,
        DeliveryKind,
        HeadPush,
        HeadPushFact,
        HeadPushStatus,
        Phase,
        Rejection,
        Withdrawal,
    )


class Decisions:
    """The handlers' logic (see the module docstring)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    # ---- approvals --------------------------------------------------------------------------------------

    def take_approval(self, approval: Approval, *, early: bool) -> tuple[bool, str]:
        """``approve``'s logic (the validator has passed it): whether it was recorded, and what was done."""
        held = self.ctx.decisions
        if held.approval is not None and held.approval.head_sha == approval.head_sha:
            return True, "approval already recorded for this head"
        pending = self.ctx.state.pending_approval
        if held.gate and pending is not None and approval.head_sha != pending.head_sha and approval.review_id:
            # The validator let through an approval of a head of this PR the run never verified: that head is
            # verified first (as if its push had been signalled), and the approval is not recorded.
            self.note_moved_head(
                HeadPush(pr_number=pending.pr_number, head_sha=approval.head_sha, source=f"approval:{approval.source}")
            )
            return False, head_gate.not_under_review_detail(approval.head_sha, pending.head_sha)
        held.approval = approval
        until = " (held until the review wait begins)" if early else ""
        return True, f"approved {approval.head_sha} by {approval.reviewer}{until}"

    def approval_refusal(self, approval: Approval, *, early: bool) -> str | None:
        """Why ``approval`` cannot be taken now, or None. With ``early``, a run still publishing takes an
        approval of its PR at the head it pushed (:meth:`early_review`), held until the review wait."""
        held = self.ctx.decisions.approval
        if held is not None and held.head_sha == approval.head_sha:
            return None
        state = self.ctx.state
        pending = state.pending_approval
        if pending is None or state.phase != Phase.AWAITING_REVIEW:
            target = self.early_review() if early else None
            if target is None:
                return f"run is not awaiting review (phase {state.phase})"
            pending = target
        if approval.pr_number is not None and approval.pr_number != pending.pr_number:
            return f"approval is of PR #{approval.pr_number}, but this run's PR is #{pending.pr_number}"
        if approval.head_sha != pending.head_sha:
            return self._other_head_refusal(approval, pending)
        return self._stale_refusal(approval, pending)

    def _other_head_refusal(self, approval: Approval, pending: ApprovalRequest) -> str | None:
        # A review on the forge (it has an ID) of a head of this PR the run did not push: that head is verified
        # first (MOVED_HEAD_PATCH). An operator's approval of a head not under review is refused, as before.
        reviewed = approval.review_id is not None and approval.pr_number == pending.pr_number
        if self.ctx.decisions.gate and reviewed and not self.is_own_head(approval.head_sha):
            return None
        return f"approval names {approval.head_sha} but the PR awaits review of {pending.head_sha}"

    def _stale_refusal(self, approval: Approval, pending: ApprovalRequest) -> str | None:
        if approval.expires_at is not None and approval.expires_at <= self.ctx.now():
            return f"approval expired at {approval.expires_at.isoformat()}"
        if approval.evidence_digest is not None and approval.evidence_digest != pending.evidence_digest:
            return f"approval names evidence {approval.evidence_digest} but the PR carries {pending.evidence_digest}"
        return None

    def early_review(self) -> ApprovalRequest | None:
        """What the review wait will ask to approve, while the run is still publishing its first candidate
        (the PR exists, its evidence comment is not posted yet); None otherwise. A revision's publishing is
        not early: the head under review until then is the old one."""
        state = self.ctx.state
        publish = state.publish
        if (
            state.phase != Phase.PUBLISH
            or self.ctx.decisions.revising
            or publish is None
            or publish.pr_number is None
            or publish.evidence_digest is None
        ):
            return None
        return ApprovalRequest(
            pr_number=publish.pr_number,
            head_sha=publish.commit,
            evidence_digest=publish.evidence_digest,
            requested_at=self.ctx.now(),
        )

    # ---- deliveries -------------------------------------------------------------------------------------

    def delivery_refusal(self, delivered: Delivered) -> str | None:
        """``deliver``'s validator: an approval the run cannot take is refused; a recorded GUID always passes."""
        if any(record.delivery == delivered.delivery for record in self.ctx.state.deliveries):
            return None
        if delivered.kind == DeliveryKind.APPROVAL and delivered.approval is not None:
            return self.approval_refusal(delivered.approval, early=True)
        return None

    def route(self, delivered: Delivered) -> str:
        """Act on ``delivered`` as the handler of its kind does (without awaiting); what was done. Runs in the
        Update's handler (never its validator), so it may ask a patch."""
        early = self.early_review() is not None and workflow.patched(EARLY_DECISIONS_PATCH)
        if delivered.kind == DeliveryKind.APPROVAL and delivered.approval is not None:
            return self.take_approval(delivered.approval, early=early)[1]
        if delivered.kind == DeliveryKind.REJECTION and delivered.rejection is not None:
            return self.take_rejection(delivered.rejection, early=early)
        if delivered.kind == DeliveryKind.WITHDRAWAL and delivered.withdrawal is not None:
            return self._take_withdrawal(delivered.withdrawal, early=early)
        if delivered.kind == DeliveryKind.REPORT_EDIT and delivered.edit is not None:
            return f"edit of {' and '.join(delivered.edit.fields)} noted"
        if delivered.kind == DeliveryKind.HEAD_PUSH and delivered.push is not None:
            return f"head push to {delivered.push.head_sha} recorded; sent as head_moved"
        return f"command {delivered.command} by {delivered.sender or 'unknown'} recorded"

    def _take_withdrawal(self, withdrawal: Withdrawal, *, early: bool) -> str:
        held = self.ctx.decisions.approval
        if held is None or held.review_id != withdrawal.review_id:
            return "withdrawal of a review the run does not hold: nothing to withdraw"
        if self.ctx.state.phase != Phase.AWAITING_REVIEW and not early:
            return f"withdrawal too late: the run is in {self.ctx.state.phase.value}"
        self.ctx.clear_approval()
        return f"approval of review {withdrawal.review_id} by {withdrawal.reviewer} withdrawn"

    def withdraw(self, withdrawal: Withdrawal) -> None:
        """A dismissed review withdraws the approval it carried, if the run has not acted on it yet. (Once the
        merge has started, the merge activity's own read of the PR's reviews no longer finds it.)"""
        approval = self.ctx.decisions.approval
        if approval is None or approval.review_id != withdrawal.review_id:
            return
        if self.ctx.state.phase == Phase.AWAITING_REVIEW:
            self.ctx.clear_approval()

    # ---- rejections -------------------------------------------------------------------------------------

    def take_rejection(self, rejection: Rejection, *, early: bool) -> str:
        """``reject``'s logic; while the run is still publishing (``early``), a rejection of its PR (a
        request for changes: of the head it pushed) is held, so the review wait acts on it first thing."""
        target = self.early_review() if early else None
        if target is not None:
            return self._hold_rejection(rejection, target)
        held = self.ctx.decisions
        before = (held.rejection, held.revision_request)
        self.reject(rejection)
        if held.rejection is not before[0]:
            return f"rejected by {rejection.reviewer}"
        if held.revision_request is not before[1]:
            return f"request for changes by {rejection.reviewer} taken"
        return f"rejection not taken in phase {self.ctx.state.phase.value}"

    def _hold_rejection(self, rejection: Rejection, target: ApprovalRequest) -> str:
        held = self.ctx.decisions
        if rejection.pr_number is not None and rejection.pr_number != target.pr_number:
            return f"rejection of PR #{rejection.pr_number}, not this run's #{target.pr_number}: ignored"
        if rejection.changes_requested:
            if rejection.head_sha is not None and rejection.head_sha != target.head_sha:
                return f"request for changes of {rejection.head_sha}, not the pushed head: ignored"
            if held.revision_request is None and held.rejection is None:
                held.revision_request = rejection
                return "request for changes held until the review wait begins"
            return "a decision is already held: ignored"
        if held.rejection is None:
            held.rejection = rejection
            return "rejection held until the review wait begins"
        return "already rejected"

    def reject(self, rejection: Rejection) -> None:
        """A rejection (reject command, closed PR), or a review requesting changes (``changes_requested``):
        the latter is held as the revision request the review wait acts on, once per wait, and only when it
        names the head under review (a late review of an earlier head says nothing about this one)."""
        state = self.ctx.state
        held = self.ctx.decisions
        pending = state.pending_approval
        if not self._about_own_pr(rejection) or held.rejection is not None:
            return  # a review of another PR is not a decision about this run
        if rejection.changes_requested:
            stale = pending is None or (rejection.head_sha is not None and rejection.head_sha != pending.head_sha)
            if state.phase == Phase.AWAITING_REVIEW and not stale and held.revision_request is None:
                held.revision_request = rejection
            return
        if state.phase == Phase.AWAITING_REVIEW or held.revising:
            held.rejection = rejection

    def _about_own_pr(self, rejection: Rejection) -> bool:
        pending = self.ctx.state.pending_approval
        publish = self.ctx.state.publish
        own_pr = pending.pr_number if pending is not None else None
        if own_pr is None and self.ctx.decisions.revising and publish is not None:
            own_pr = publish.pr_number
        return rejection.pr_number is None or (own_pr is not None and rejection.pr_number == own_pr)

    # ---- moved heads ------------------------------------------------------------------------------------

    def is_own_head(self, sha: str) -> bool:
        """Whether ``sha`` is a head the run pushed, verified, or awaits review of."""
        publish = self.ctx.state.publish
        pending = self.ctx.state.pending_approval
        return (
            (publish is not None and publish.commit == sha)
            or (pending is not None and pending.head_sha == sha)
            or any(c.commit == sha for c in self.ctx.state.candidates)
        )

    def note_moved_head(self, push: HeadPush) -> bool:
        """Record a moved head of the run's PR as a fact and make it the next head to verify; False when it is
        not news (another PR, the run's own head, a head seen before, or the run is ending)."""
        ctx = self.ctx
        publish = ctx.state.publish
        if publish is None or publish.pr_number is None or push.pr_number != publish.pr_number:
            return False
        if ctx.ending or ctx.state.outcome is not None or self.is_own_head(push.head_sha):
            return False
        seen = next((f for f in ctx.state.head_pushes if f.head_sha == push.head_sha), None)
        if seen is not None and seen.status != HeadPushStatus.SUPERSEDED:
            return False
        if seen is None:
            ctx.state.head_pushes.append(
                HeadPushFact(
                    head_sha=push.head_sha,
                    before=push.before,
                    pusher=push.pusher,
                    source=push.source,
                    seen_at=ctx.now(),
                )
            )
        else:
            seen.status, seen.detail = HeadPushStatus.PENDING, ""
        ctx.decisions.moved_head = push
        return True
