"""``repair_bug``: one durable workflow per bug report.

This file is the state machine and nothing else: deterministic (no I/O, clocks or randomness other than
``workflow.now()``), every external effect an activity with an operation ID ``<workflow_id>:<step>[:<n>]``.
The run's facts live in :class:`RunState`, returned by the ``state`` query.

Phases: intake -> ticket -> procedure -> provision -> reproduce -> repair/verify (bounded) -> publish ->
awaiting-review -> merge -> cleanup -> done. Each is entered where its work starts (provisioning the base
environment is ``provision``; the candidate's environment is part of ``verify``), and the sub-state of the
activity running in it is its heartbeat. Cleanup runs on every ending, cancellation included.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, CancelledError, TimeoutType
from temporalio.exceptions import TimeoutError as ActivityTimeout
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel

    from environments.interface import CleanupReport, EnvironmentHandle
    from environments.regression import ProofStatus
    from evidence.interface import ArtifactRef
    from pipeline import accounting, head_gate, messages, revisions, steps
    from pipeline.failures import (
        FailureClass,
        failure_class,
        failure_details,
        failure_kind,
        failure_message,
        worker_lost,
    )
    from pipeline.hosts import host_queue
    from pipeline.ids import branch_for, op_id
    from pipeline.inputs import ApprovalAck, RepairInput
    from pipeline.patches import (
        AGENT_RUN_TOOLS_PATCH,
        BASE_MOVED_PATCH,
        BASELINE_PATCH,
        CANCELLATION_PATCH,
        CLEANUP_TICKET_PATCH,
        COMMAND_ENGINE_PATCH,
        EARLY_DECISIONS_PATCH,
        HOST_AFFINITY_PATCH,
        HOST_WORKER_LOST_PATCH,
        LATE_COMPLETION_PATCH,
        MODEL_OUTAGE_PATCH,
        MOVED_HEAD_PATCH,
        PINNED_REPORT_PATCH,
        REVIEW_ON_FORGE_PATCH,
        REVIEW_TICKET_PATCH,
        REVISIONS_PATCH,
        RUN_RECORD_PATCH,
        STATE_MEMO_PATCH,
        STEPPED_AGENT_PATCH,
    )
    from pipeline.recorded_state import STATE_MEMO, recorded_state
    from pipeline.state import (
        Approval,
        ApprovalRequest,
        BaselineFact,
        Budgets,
        CancelMark,
        CancelStep,
        CandidateFact,
        CleanupFact,
        CleanupStatus,
        Delivered,
        DeliveryAck,
        DeliveryKind,
        DeliveryRecord,
        EnvironmentFact,
        EnvironmentState,
        HeadPush,
        HeadPushFact,
        HeadPushStatus,
        Outcome,
        Phase,
        PhaseMark,
        PublishFact,
        Rejection,
        ReportEdit,
        ReproductionFact,
        ReproductionOutcome,
        RunState,
        TicketFact,
        VerificationStatus,
        Withdrawal,
    )
    from pipeline.steps import (
        AGENT_MAX_TURNS,
        AgentCommandInput,
        AgentConcludeInput,
        AgentRecordInput,
        AgentRunInput,
        AgentToolCall,
        AgentToolResult,
        AgentToolsInput,
        AgentTurnInput,
        BaselineInput,
        BuildEvidenceInput,
        CaptureHeadInput,
        CleanupRunInput,
        DraftProcedureInput,
        EnsureCommentInput,
        EnsureDraftPrInput,
        EnsureTicketInput,
        EvidenceResult,
        MergeInput,
        MergeStatus,
        PrepareProcedureInput,
        PrepareSpecInput,
        ProcedureResult,
        ProposalResult,
        ProposePatchInput,
        ProvisionInput,
        PublishBranchInput,
        PullInfo,
        ReadBranchInput,
        ReadPullInput,
        ReadReportInput,
        ReadReviewInput,
        RebuildOnBaseInput,
        RecordRunInput,
        ReportInfo,
        ReproduceInput,
        RequestReviewInput,
        ReviewRead,
        Step,
        UpdateTicketInput,
        VerifyInput,
    )
    from repair.context import EarlierAttempt
    from repair.stepping import Segment, ToolCall, segments
    from repair.tools import RUN_REPRODUCTION, RUN_TOOLS, WORKSPACE_TOOLS

In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out")


class RunEnded(Exception):
    """Control flow: the run reached a terminal outcome before the merge."""

    def __init__(self, outcome: Outcome, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail


def _is_cancellation(err: BaseException) -> bool:
    """An activity that ended because the workflow's cancellation reached it."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, CancelledError):
            return True
        cause = cause.__cause__
    return False


@workflow.defn(name="repair_bug")
class RepairBugWorkflow:
    @workflow.init
    def __init__(self, inp: RepairInput) -> None:
        info = workflow.info()
        self._input = inp
        self._state = RunState(
            workflow_id=info.workflow_id,
            run_id=info.run_id,
            repository=inp.repository,
            issue_number=inp.issue_number,
            base_branch=inp.base_branch,
            budgets=Budgets(
                repair_attempts_max=inp.policy.max_repair_attempts,
                model_token_budget=inp.policy.model_token_budget,
                revisions_max=inp.policy.revisions_max,
            ),
        )
        self._approval: Approval | None = None
        self._rejection: Rejection | None = None
        # A review requesting changes of the head under review, not acted on yet; and whether a revision runs
        # (a reject command or a closed PR then still rejects, at the end of the revision).
        self._revision_request: Rejection | None = None
        self._revising = False
        self._report: ReportInfo | None = None
        self._spec_ref: ArtifactRef | None = None
        self._procedure_ref: ArtifactRef | None = None
        self._live_envs: dict[str, EnvironmentHandle] = {}
        # The hosts that held the run's environments, in order of first use: each cleans up its share at the end.
        self._hosts: list[str] = []
        self._cancellation_v2 = True
        self._ending = False
        # Said on the ticket until the end: the final update rewrites the same comment.
        self._closing_note = ""
        # Ticket updates from a signal handler and from the run never interleave: each body is computed
        # when its turn comes, so the last write carries the latest state. Uncontended, it never yields.
        self._ticket_lock = asyncio.Lock()
        # Said on the ticket while the run waits again for a review after an approval that did not stand.
        self._review_note = ""
        # The moved head of the run's PR to verify next (the latest seen wins: the PR has one head), and whether
        # this run gates moved heads at all (MOVED_HEAD_PATCH, decided when the review wait is first entered).
        self._moved_head: HeadPush | None = None
        self._gate = False

    # ---- queries, updates, signals ------------------------------------------------------------------

    # The handlers are registered under their method names ("state", "approve", "reject"), which recorded
    # histories and running clients use: never rename them. Clients call them by method reference.
    @workflow.query
    def state(self) -> RunState:
        """The run's state, its growing lists cut to their latest entries (:meth:`RunState.bounded`)."""
        return self._state.bounded()

    @workflow.query
    def record(self) -> RunState:
        """The run's whole state, every entry of its lists (a query: nothing of it enters history)."""
        return self._state

    @workflow.update
    async def approve(self, approval: Approval) -> ApprovalAck:
        """Record an approval. Idempotent: the same approval delivered twice is acknowledged once."""
        accepted, detail = self._take_approval(approval, early=False)
        return ApprovalAck(accepted=accepted, detail=detail)

    def _take_approval(self, approval: Approval, *, early: bool) -> tuple[bool, str]:
        """``approve``'s logic (the validator has passed it): whether it was recorded, and what was done."""
        if self._approval is not None and self._approval.head_sha == approval.head_sha:
            return True, "approval already recorded for this head"
        pending = self._state.pending_approval
        if self._gate and pending is not None and approval.head_sha != pending.head_sha and approval.review_id:
            # The validator let through an approval of a head of this PR the run never verified: that head is
            # verified first (as if its push had been signalled), and the approval is not recorded.
            self._note_moved_head(
                HeadPush(pr_number=pending.pr_number, head_sha=approval.head_sha, source=f"approval:{approval.source}")
            )
            return False, head_gate.not_under_review_detail(approval.head_sha, pending.head_sha)
        self._approval = approval
        until = " (held until the review wait begins)" if early else ""
        return True, f"approved {approval.head_sha} by {approval.reviewer}{until}"

    @approve.validator
    def _validate_approve(self, approval: Approval) -> None:
        """Refuse (before it enters history) an approval that names anything but what awaits review."""
        refusal = self._approval_refusal(approval, early=False)
        if refusal is not None:
            raise ValueError(refusal)

    def _approval_refusal(self, approval: Approval, *, early: bool) -> str | None:
        """Why ``approval`` cannot be taken now, or None. With ``early``, a run still publishing takes an
        approval of its PR at the head it pushed (:meth:`_early_review`), held until the review wait."""
        if self._approval is not None and self._approval.head_sha == approval.head_sha:
            return None
        pending = self._state.pending_approval
        if pending is None or self._state.phase != Phase.AWAITING_REVIEW:
            target = self._early_review() if early else None
            if target is None:
                return f"run is not awaiting review (phase {self._state.phase})"
            pending = target
        if approval.pr_number is not None and approval.pr_number != pending.pr_number:
            return f"approval is of PR #{approval.pr_number}, but this run's PR is #{pending.pr_number}"
        if approval.head_sha != pending.head_sha:
            # A review on the forge (it has an ID) of a head of this PR the run did not push: that head is verified
            # first (MOVED_HEAD_PATCH). An operator's approval of a head not under review is refused, as before.
            reviewed = approval.review_id is not None and approval.pr_number == pending.pr_number
            if self._gate and reviewed and not self._is_own_head(approval.head_sha):
                return None
            return f"approval names {approval.head_sha} but the PR awaits review of {pending.head_sha}"
        if approval.expires_at is not None and approval.expires_at <= workflow.now():
            return f"approval expired at {approval.expires_at.isoformat()}"
        if approval.evidence_digest is not None and approval.evidence_digest != pending.evidence_digest:
            return f"approval names evidence {approval.evidence_digest} but the PR carries {pending.evidence_digest}"
        return None

    def _early_review(self) -> ApprovalRequest | None:
        """What the review wait will ask to approve, while the run is still publishing its first candidate
        (the PR exists, its evidence comment is not posted yet); None otherwise. A revision's publishing is
        not early: the head under review until then is the old one."""
        publish = self._state.publish
        if (
            self._state.phase != Phase.PUBLISH
            or self._revising
            or publish is None
            or publish.pr_number is None
            or publish.evidence_digest is None
        ):
            return None
        return ApprovalRequest(
            pr_number=publish.pr_number,
            head_sha=publish.commit,
            evidence_digest=publish.evidence_digest,
            requested_at=workflow.now(),
        )

    @workflow.update
    async def deliver(self, delivered: Delivered) -> DeliveryAck:
        """One webhook delivery's decision, recorded once per delivery GUID with how it was handled.

        Idempotent twice over: the receiver sends it with the GUID as the Update ID (Temporal answers a
        repeat with the first outcome without running this again), and a GUID already recorded is answered
        with its record. Routes to the logic of ``approve`` / ``reject`` / ``withdraw`` / ``report_edited``;
        a decision arriving while the run is still publishing, about its PR and pushed head, is held for the
        review wait. A head push or a command is recorded only: the receiver then sends ``head_moved`` or
        cancels the run, once, because only the first sending is answered as not a duplicate."""
        for record in self._state.deliveries:
            if record.delivery == delivered.delivery:
                return DeliveryAck(first=record)
        record = DeliveryRecord(
            delivery=delivered.delivery,
            attempt=delivered.attempt,
            kind=delivered.kind,
            what=self._route(delivered),
            at=workflow.now(),
            phase=self._state.phase,
        )
        self._state.deliveries.append(record)
        if delivered.kind == DeliveryKind.REPORT_EDIT and delivered.edit is not None:
            await self.report_edited(delivered.edit)
        return DeliveryAck(first=record)

    @deliver.validator
    def _validate_deliver(self, delivered: Delivered) -> None:
        """Refuse (before it enters history) an approval the run cannot take; a recorded GUID always passes."""
        if any(record.delivery == delivered.delivery for record in self._state.deliveries):
            return
        if delivered.kind == DeliveryKind.APPROVAL and delivered.approval is not None:
            refusal = self._approval_refusal(delivered.approval, early=True)
            if refusal is not None:
                raise ValueError(refusal)

    def _route(self, delivered: Delivered) -> str:
        """Act on ``delivered`` as the handler of its kind does (without awaiting); what was done."""
        early = self._early_review() is not None and workflow.patched(EARLY_DECISIONS_PATCH)
        if delivered.kind == DeliveryKind.APPROVAL and delivered.approval is not None:
            return self._take_approval(delivered.approval, early=early)[1]
        if delivered.kind == DeliveryKind.REJECTION and delivered.rejection is not None:
            return self._take_rejection(delivered.rejection, early=early)
        if delivered.kind == DeliveryKind.WITHDRAWAL and delivered.withdrawal is not None:
            withdrawal = delivered.withdrawal
            held = self._approval
            if held is None or held.review_id != withdrawal.review_id:
                return "withdrawal of a review the run does not hold: nothing to withdraw"
            if self._state.phase != Phase.AWAITING_REVIEW and not early:
                return f"withdrawal too late: the run is in {self._state.phase.value}"
            self._approval = None
            return f"approval of review {withdrawal.review_id} by {withdrawal.reviewer} withdrawn"
        if delivered.kind == DeliveryKind.REPORT_EDIT and delivered.edit is not None:
            return f"edit of {' and '.join(delivered.edit.fields)} noted"
        if delivered.kind == DeliveryKind.HEAD_PUSH and delivered.push is not None:
            return f"head push to {delivered.push.head_sha} recorded; sent as head_moved"
        return f"command {delivered.command} by {delivered.sender or 'unknown'} recorded"

    def _take_rejection(self, rejection: Rejection, *, early: bool) -> str:
        """``reject``'s logic; while the run is still publishing (``early``), a rejection of its PR (a
        request for changes: of the head it pushed) is held, so the review wait acts on it first thing."""
        target = self._early_review() if early else None
        if target is not None:
            if rejection.pr_number is not None and rejection.pr_number != target.pr_number:
                return f"rejection of PR #{rejection.pr_number}, not this run's #{target.pr_number}: ignored"
            if rejection.changes_requested:
                if rejection.head_sha is not None and rejection.head_sha != target.head_sha:
                    return f"request for changes of {rejection.head_sha}, not the pushed head: ignored"
                if self._revision_request is None and self._rejection is None:
                    self._revision_request = rejection
                    return "request for changes held until the review wait begins"
                return "a decision is already held: ignored"
            if self._rejection is None:
                self._rejection = rejection
                return "rejection held until the review wait begins"
            return "already rejected"
        before = (self._rejection, self._revision_request)
        self.reject(rejection)
        if self._rejection is not before[0]:
            return f"rejected by {rejection.reviewer}"
        if self._revision_request is not before[1]:
            return f"request for changes by {rejection.reviewer} taken"
        return f"rejection not taken in phase {self._state.phase.value}"

    @workflow.signal
    def reject(self, rejection: Rejection) -> None:
        """A rejection (reject command, closed PR), or a review requesting changes (``changes_requested``):
        the latter is held as the revision request the review wait acts on, once per wait, and only when it
        names the head under review (a late review of an earlier head says nothing about this one)."""
        pending = self._state.pending_approval
        publish = self._state.publish
        own_pr = pending.pr_number if pending is not None else None
        if own_pr is None and self._revising and publish is not None:
            own_pr = publish.pr_number
        if rejection.pr_number is not None and (own_pr is None or rejection.pr_number != own_pr):
            return  # a review of another PR is not a decision about this run
        if self._rejection is not None:
            return
        if rejection.changes_requested:
            stale = pending is None or (rejection.head_sha is not None and rejection.head_sha != pending.head_sha)
            if self._state.phase == Phase.AWAITING_REVIEW and not stale and self._revision_request is None:
                self._revision_request = rejection
            return
        if self._state.phase == Phase.AWAITING_REVIEW or self._revising:
            self._rejection = rejection

    @workflow.signal
    def withdraw(self, withdrawal: Withdrawal) -> None:
        """A dismissed review withdraws the approval it carried, if the run has not acted on it yet. (Once the
        merge has started, the merge activity's own read of the PR's reviews no longer finds it.)"""
        approval = self._approval
        if approval is None or approval.review_id != withdrawal.review_id:
            return
        if self._state.phase == Phase.AWAITING_REVIEW:
            self._approval = None

    @workflow.signal
    def head_moved(self, push: HeadPush) -> None:
        """The run's PR head moved to ``push.head_sha`` (a push to the run's branch, told by the webhook receiver
        or the reconciler). Ignored unless it names the run's PR and a head the run neither pushed nor awaits
        review of; the same head seen twice is acted on once. The review wait verifies it before anyone is
        asked to review it (see ``_gate_moved_head``)."""
        self._note_moved_head(push)

    def _is_own_head(self, sha: str) -> bool:
        """Whether ``sha`` is a head the run pushed, verified, or awaits review of."""
        publish = self._state.publish
        pending = self._state.pending_approval
        return (
            (publish is not None and publish.commit == sha)
            or (pending is not None and pending.head_sha == sha)
            or any(c.commit == sha for c in self._state.candidates)
        )

    def _note_moved_head(self, push: HeadPush) -> bool:
        """Record a moved head of the run's PR as a fact and make it the next head to verify; False when it is
        not news (another PR, the run's own head, a head seen before, or the run is ending)."""
        publish = self._state.publish
        if publish is None or publish.pr_number is None or push.pr_number != publish.pr_number:
            return False
        if self._ending or self._state.outcome is not None or self._is_own_head(push.head_sha):
            return False
        seen = next((f for f in self._state.head_pushes if f.head_sha == push.head_sha), None)
        if seen is not None and seen.status != HeadPushStatus.SUPERSEDED:
            return False
        if seen is None:
            self._state.head_pushes.append(
                HeadPushFact(
                    head_sha=push.head_sha,
                    before=push.before,
                    pusher=push.pusher,
                    source=push.source,
                    seen_at=workflow.now(),
                )
            )
        else:
            seen.status, seen.detail = HeadPushStatus.PENDING, ""
        self._moved_head = push
        return True

    @workflow.signal
    async def report_edited(self, edit: ReportEdit) -> None:
        """The issue's title or body changed after the trigger. Noted (once per source) and said on the ticket;
        the run keeps the text pinned at its trigger."""
        if self._input.report is None or any(e.source == edit.source for e in self._state.report_edits):
            return
        self._state.report_edits.append(edit)
        if self._state.ticket is None or self._ending or self._state.outcome is not None:
            return  # the ticket, once created (or at the end), carries it
        if not workflow.patched(PINNED_REPORT_PATCH):
            return
        # Best effort: the next ticket update of the run carries the note as well.
        with contextlib.suppress(ActivityError, asyncio.CancelledError):
            await self._update_ticket(note=self._closing_note)

    # ---- the run ------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: RepairInput) -> RunState:
        # Runs started before cancellation waited for active work (and noted the evidence it kept) must
        # replay as they ran: the patch marker is recorded once, at the start of new runs.
        self._cancellation_v2 = workflow.patched(CANCELLATION_PATCH)
        self._state.budgets.deadline = workflow.now() + timedelta(seconds=inp.policy.run_deadline_s)
        outcome, detail = Outcome.NEEDS_HUMAN_TRIAGE, ""
        cancelled = False
        try:
            outcome, detail = await self._pipeline()
        except RunEnded as ended:
            outcome, detail = ended.outcome, ended.detail
        except asyncio.CancelledError:
            cancelled = True
            outcome, detail = Outcome.CANCELLED, "cancellation requested"
        except ActivityError as err:
            if _is_cancellation(err) or self._cancel_requested():
                cancelled = True
                outcome, detail = Outcome.CANCELLED, f"cancellation requested during {self._state.phase.value}"
            else:
                outcome, detail = self._step_failure(err)
        # From here on activities run to record the ending; a cancellation no longer stops them.
        self._ending = True
        if cancelled:
            await self._wind_down_cancelled()
        await self._finish(outcome, detail)
        if cancelled:
            self._cancel_step(
                CancelStep.CANCELLED if self._state.outcome == Outcome.CANCELLED else CancelStep.CLEANUP_INCOMPLETE,
                self._state.outcome_detail,
            )
        await self._store_record()
        if cancelled:
            raise asyncio.CancelledError()
        return self._state.bounded()

    async def _wind_down_cancelled(self) -> None:
        """The first steps of cancellation; cleanup and the final step follow in ``_finish``.

        Long activities are scheduled with WAIT_CANCELLATION_COMPLETED, so by the time the cancellation
        reaches this code the active work has ended: it acknowledged the cancellation through its heartbeat,
        or it finished first and its late result was dropped (``_cancel_requested``). Only then is cleanup
        allowed to start, so it never races an activity still creating resources.
        """
        self._cancel_step(CancelStep.REQUESTED)
        self._cancel_step(CancelStep.STOPPING_ACTIVE_WORK, f"stopped during {self._state.phase.value}")
        kept = ", ".join(sorted({r.name for r in self._state.evidence})) or "none yet"
        self._cancel_step(CancelStep.PRESERVING_EVIDENCE, f"{len(self._state.evidence)} artifact(s) kept")
        if self._cancellation_v2:
            self._closing_note = f"cancelled; evidence kept in the store: {kept}"
            try:
                await self._update_ticket(note=self._closing_note)
            except ActivityError as err:
                self._state.outcome_detail = f"ticket note failed: {failure_message(err)}"

    def _step_failure(self, err: ActivityError) -> tuple[Outcome, str]:
        """The ending of a run a step failed under: what failed, and whether it says anything about the
        report. Our own machinery failing (a transport error, the engine, a timeout) is said to be that, never
        a verdict on the report."""
        kind = failure_class(err)
        what = f"{failure_kind(err)}: {failure_message(err)}"
        phase = self._state.phase.value
        if kind == FailureClass.AMBIGUOUS:
            return Outcome.AMBIGUOUS_NEEDS_HUMAN, f"step failed ({what})"
        if kind is None or kind.retryable:
            return Outcome.NEEDS_HUMAN_TRIAGE, (
                f"durafix itself failed during {phase} after its retries ({what}); this says nothing about the "
                "report: an operator must look (`durafix history`) and can then retry"
            )
        return Outcome.NEEDS_HUMAN_TRIAGE, f"step failed during {phase} ({what})"

    def _cancel_requested(self) -> bool:
        """Whether a cancellation request has reached the run (before its ending began).

        Deterministic: the request is an event in the history. Checked after every activity, so a result
        that arrives after the request (the activity finished before it learned of the cancellation) is
        never acted on; runs recorded before this check keep replaying as they ran.
        """
        return (
            not self._ending and workflow.cancellation_reason() is not None and workflow.patched(LATE_COMPLETION_PATCH)
        )

    def _cancel_step(self, step: CancelStep, detail: str = "") -> None:
        self._state.cancellation.append(CancelMark(step=step, at=workflow.now(), detail=detail))

    async def _pipeline(self) -> tuple[Outcome, str]:
        inp = self._input
        wf = self._state.workflow_id

        self._enter(Phase.INTAKE)
        report = await self._step(
            steps.READ_REPORT,
            ReadReportInput(repository=inp.repository, issue_number=inp.issue_number, base_branch=inp.base_branch),
        )
        pinned = inp.report
        if pinned is not None and workflow.patched(PINNED_REPORT_PATCH):
            changed = [name for name in ("title", "body") if getattr(report, name) != getattr(pinned, name)]
            if changed and not any(e.source == "intake" for e in self._state.report_edits):
                self._state.report_edits.append(
                    ReportEdit(editor="", fields=changed, at=workflow.now(), source="intake")
                )
            report = report.model_copy(update={"title": pinned.title, "body": pinned.body})
        self._report = report
        self._state.target_revision = report.base_revision

        self._enter(Phase.TICKET)
        ticket_op = op_id(wf, "ticket")
        ticket = await self._step(
            steps.ENSURE_TICKET,
            EnsureTicketInput(
                op_id=ticket_op,
                repository=inp.repository,
                issue_number=inp.issue_number,
                title=report.title,
                body=messages.ticket_body(self._state),
            ),
        )
        self._state.ticket = TicketFact(
            op_id=ticket_op, issue_number=ticket.issue_number, comment_id=ticket.comment_id, url=ticket.url
        )

        self._enter(Phase.PROCEDURE)
        procedure = await self._step(
            steps.PREPARE_PROCEDURE,
            PrepareProcedureInput(run_id=wf, report_body=report.body),
        )
        if procedure.procedure_ref is None and procedure.missing:
            procedure = await self._draft_procedure(report)
        if procedure.procedure_ref is None:
            raise RunEnded(Outcome.NEEDS_HUMAN_TRIAGE, f"no usable reproduction procedure: {procedure.error}")
        self._procedure_ref = procedure.procedure_ref
        self._record(procedure.procedure_ref)

        self._enter(Phase.PROVISION)
        spec_ref = await self._step(
            steps.PREPARE_SPEC,
            PrepareSpecInput(
                run_id=wf,
                op_id=op_id(wf, "spec"),
                repository=inp.repository,
                clone_url=report.clone_url,
                base_revision=report.base_revision,
            ),
        )
        self._spec_ref = spec_ref
        self._record(spec_ref)

        # The base environment is provisioned in PROVISION and the procedure runs in REPRODUCE (both again if
        # the environment dies under the reproduction).
        base = await self._reproduce_on(report.base_revision, None, "base", Phase.PROVISION, Phase.REPRODUCE)
        self._state.reproduction = base
        if base.status != ReproductionOutcome.REPRODUCED:
            raise RunEnded(
                Outcome.NEEDS_HUMAN_TRIAGE,
                f"the report did not reproduce on {report.base_revision[:12]}: {base.status} ({base.detail})",
            )
        await self._update_ticket()

        if workflow.patched(BASELINE_PATCH):
            self._enter(Phase.BASELINE)
            await self._baseline(report)

        candidate = await self._repair_loop(report)

        self._enter(Phase.PUBLISH)
        await self._publish(report, candidate)
        await self._update_ticket()

        return await self._review_and_merge()

    async def _baseline(self, report: ReportInfo) -> None:
        """The recipe's tests on the base: a run whose tests cannot run, or fail before any change, ends in
        triage before the model is asked for anything (a fix could not be judged against them)."""
        wf = self._state.workflow_id
        assert self._spec_ref is not None
        baseline_op = op_id(wf, "baseline")
        result = await self._step(
            steps.RUN_BASELINE, BaselineInput(run_id=wf, op_id=baseline_op, spec_ref=self._spec_ref)
        )
        self._record(result.test_output_ref)
        self._state.baseline = BaselineFact(op_id=baseline_op, **result.model_dump())
        base = report.base_revision[:12]
        if not result.runnable:
            raise RunEnded(
                Outcome.NEEDS_HUMAN_TRIAGE,
                f"the recipe's tests cannot run on the base revision {base}: {result.summary}; "
                "fix `setup`/`test` in durafix.yaml",
            )
        if result.passed or result.cases_ref is not None:
            # With per-test results a failing base is no obstacle: a candidate must only fail no other test.
            return
        raise RunEnded(
            Outcome.NEEDS_HUMAN_TRIAGE,
            f"the recipe's tests already fail on the base revision {base} ({result.summary}); a fix is judged "
            "against a passing baseline, or per test with a `test_report` (JUnit XML) named in durafix.yaml",
        )

    async def _draft_procedure(self, report: ReportInfo) -> ProcedureResult:
        """The report has no procedure block: ask the model to draft one from its prose."""
        wf = self._state.workflow_id
        try:
            drafted = await self._model_step(
                steps.DRAFT_PROCEDURE,
                DraftProcedureInput(
                    run_id=wf, op_id=op_id(wf, "draft-procedure"), issue_title=report.title, issue_body=report.body
                ),
            )
        except ActivityError as err:
            self._count_tokens(err)
            if failure_class(err) not in (FailureClass.PROCEDURE_INVALID, FailureClass.PERMANENT, FailureClass.BUDGET):
                raise
            return ProcedureResult(procedure_ref=None, error=failure_message(err))
        self._state.budgets.model_prompt_tokens += drafted.prompt_tokens
        self._state.budgets.model_completion_tokens += drafted.completion_tokens
        return drafted

    # ---- repair -------------------------------------------------------------------------------------

    async def _repair_loop(self, report: ReportInfo) -> CandidateFact:
        wf = self._state.workflow_id
        budgets = self._state.budgets
        # Each refused attempt: its patch summary and why (the next attempt's first message says both).
        failures: list[EarlierAttempt] = []
        assert self._spec_ref is not None
        stepped = workflow.patched(STEPPED_AGENT_PATCH)
        command = self._input.policy.engine == "command" and workflow.patched(COMMAND_ENGINE_PATCH)
        for attempt in range(1, budgets.repair_attempts_max + 1):
            spent = budgets.model_prompt_tokens + budgets.model_completion_tokens
            if spent >= budgets.model_token_budget:
                raise RunEnded(
                    Outcome.REPAIR_BUDGET_EXHAUSTED,
                    f"model token budget spent ({spent} >= {budgets.model_token_budget})",
                )
            self._enter(Phase.REPAIR)
            budgets.repair_attempts_used = attempt
            repair_op = op_id(wf, "repair", attempt)
            try:
                if command:
                    proposal = await self._command_attempt(
                        report, attempt, repair_op, [f.line() for f in failures], budgets.model_token_budget - spent
                    )
                elif stepped:
                    proposal = await self._stepped_attempt(
                        report, attempt, repair_op, list(failures), budgets.model_token_budget - spent
                    )
                else:
                    proposal = await self._step(
                        steps.PROPOSE_PATCH,
                        ProposePatchInput(
                            run_id=wf,
                            op_id=repair_op,
                            attempt=attempt,
                            spec_ref=self._spec_ref,
                            issue_title=report.title,
                            issue_body=report.body,
                            previous_failures=[f.line() for f in failures],
                            token_budget=budgets.model_token_budget - spent,
                        ),
                    )
            except ActivityError as err:
                kind = failure_class(err)
                self._count_tokens(err)
                if kind == FailureClass.BUDGET:
                    raise RunEnded(Outcome.REPAIR_BUDGET_EXHAUSTED, failure_message(err)) from err
                if kind not in (FailureClass.NO_PATCH, FailureClass.PERMANENT):
                    raise
                if kind == FailureClass.NO_PATCH:
                    accounting.count_no_patch(budgets, err)
                failures.append(EarlierAttempt(attempt=attempt, reason=f"no usable patch ({failure_message(err)})"))
                continue
            if not stepped:  # the stepped attempt charged its tokens turn by turn
                budgets.model_prompt_tokens += proposal.prompt_tokens
                budgets.model_completion_tokens += proposal.completion_tokens
            self._record(proposal.patch_ref)
            candidate = CandidateFact(
                attempt=attempt,
                op_id=repair_op,
                patch_ref=proposal.patch_ref,
                summary=proposal.summary,
                commit_timestamp=int(workflow.now().timestamp()),
            )
            self._state.candidates.append(candidate)
            self._enter(Phase.VERIFY)
            failure = await self._verify(report, candidate)
            if failure is None:
                candidate.verification = VerificationStatus.PASSED
                return candidate
            candidate.verification = VerificationStatus.FAILED
            candidate.failure = failure
            failures.append(EarlierAttempt(attempt=attempt, summary=candidate.summary, reason=failure))
        raise RunEnded(
            Outcome.REPAIR_BUDGET_EXHAUSTED,
            f"{budgets.repair_attempts_max} repair attempt(s) failed verification: "
            + "; ".join(f.line() for f in failures),
        )

    async def _command_attempt(
        self, report: ReportInfo, attempt: int, repair_op: str, failures: list[str], token_budget: int
    ) -> ProposalResult:
        """One repair attempt by the external agent CLI: one ``model.agent_command`` activity, whose proposal
        passed the same patch policy as the built-in engine's and goes through the same verification. Its
        tokens are charged here (a failure's by the caller, from the failure's details), as the stepped
        attempt charges its turns, so the caller charges nothing more for a run that took this branch. What the
        CLI printed is stored (redacted) and recorded in the run's evidence, whether the attempt failed or not."""
        assert self._spec_ref is not None
        try:
            proposal = await self._step(
                steps.AGENT_COMMAND,
                AgentCommandInput(
                    run_id=self._state.workflow_id,
                    op_id=repair_op,
                    attempt=attempt,
                    spec_ref=self._spec_ref,
                    issue_title=report.title,
                    issue_body=report.body,
                    previous_failures=failures,
                    token_budget=token_budget,
                ),
            )
        except ActivityError as err:
            if (log_ref := _detail_ref(err, "log_ref")) is not None:
                self._record(log_ref)
            raise
        accounting.charge_proposal(self._state.budgets, attempt, proposal)
        if proposal.log_ref is not None:
            self._record(proposal.log_ref)
        return proposal

    async def _stepped_attempt(
        self,
        report: ReportInfo,
        attempt: int,
        repair_op: str,
        failures: list[EarlierAttempt],
        token_budget: int,
        *,
        start_patch: ArtifactRef | None = None,
        revision: int = 0,
        review_feedback: str = "",
    ) -> ProposalResult:
        """One repair attempt as recorded steps: model turn, tool batch, ..., then the conclusion.

        The transcript and the patch so far travel between the steps as stored references, so each
        completed step is in the history and is never run again: a worker lost mid-step costs only that step
        (a model turn re-sends its one request; a tool batch re-runs on base + the patch before it). Tokens
        are charged to the run after every turn (a failed turn's through its failure, by the caller). The
        run ends ``repair-budget-exhausted`` when the attempt uses all its turns, as the engine's loop did;
        a step's failure propagates as the ``ActivityError`` the caller judges. A revision starts from
        ``start_patch`` (the patch under review) and opens with what the review asked for."""
        wf = self._state.workflow_id
        budgets = self._state.budgets
        assert self._spec_ref is not None
        transcript: ArtifactRef | None = None
        patch: ArtifactRef | None = start_patch
        prompt = completion = 0
        model = ""
        summary: str | None = None
        turn = 0
        tools = [*WORKSPACE_TOOLS, *RUN_TOOLS] if workflow.patched(AGENT_RUN_TOOLS_PATCH) else None
        while summary is None:
            if turn >= AGENT_MAX_TURNS:
                raise RunEnded(
                    Outcome.REPAIR_BUDGET_EXHAUSTED,
                    f"attempt {attempt}: the model used all {AGENT_MAX_TURNS} turns without finishing",
                )
            turn += 1
            answer = await self._model_step(
                steps.AGENT_TURN,
                AgentTurnInput(
                    run_id=wf,
                    op_id=f"{repair_op}:turn-{turn}",
                    attempt=attempt,
                    turn=turn,
                    issue_title=report.title,
                    issue_body=report.body,
                    previous_failures=[f.line() for f in failures],
                    transcript_ref=transcript,
                    token_budget=token_budget - prompt - completion,
                    tools=tools,
                    patch_ref=patch,
                    compact_above_chars=self._input.policy.agent_compact_chars if tools is not None else None,
                    revision=revision,
                    review_feedback=review_feedback,
                    spec_ref=self._spec_ref,
                    reproduction=self._state.reproduction,
                    baseline_summary=self._state.baseline.summary if self._state.baseline else None,
                    earlier_attempts=failures,
                ),
                attempt,
            )
            prompt += answer.prompt_tokens
            completion += answer.completion_tokens
            accounting.charge_turn(budgets, attempt, turn, answer)
            model = answer.model
            transcript = answer.transcript_ref
            if not answer.calls:
                summary = answer.summary or "(the model gave no summary)"
                break
            transcript, patch, summary = await self._agent_calls(
                report, attempt, turn, repair_op, answer.calls, transcript, patch, split=tools is not None
            )
        return await self._step(
            steps.AGENT_CONCLUDE,
            AgentConcludeInput(
                run_id=wf,
                op_id=repair_op,
                attempt=attempt,
                spec_ref=self._spec_ref,
                patch_ref=patch,
                transcript_ref=transcript,
                summary=summary,
                prompt_tokens=prompt,
                completion_tokens=completion,
                model=model,
            ),
        )

    async def _agent_calls(
        self,
        report: ReportInfo,
        attempt: int,
        turn: int,
        repair_op: str,
        calls: list[AgentToolCall],
        transcript: ArtifactRef,
        patch: ArtifactRef | None,
        *,
        split: bool,
    ) -> tuple[ArtifactRef, ArtifactRef | None, str | None]:
        """Carry out one turn's calls in order, each segment where it runs (:func:`repair.stepping.segments`):
        workspace tools as one ``model.agent_tools`` batch, ``run_tests``/``run`` as ``env.agent_run`` in the
        sandbox, ``run_reproduction`` as the run's own reproduction on base + the patch so far. Each segment
        is a recorded step that sees every edit before it; the transcript, the patch and the summary after.
        Without ``split`` (no run tool offered: runs recorded before) every call goes to one batch, as then."""
        wf = self._state.workflow_id
        assert self._spec_ref is not None
        summary: str | None = None
        tool_calls = [ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in calls]
        cut = segments(tool_calls) if split else [Segment(None, tool_calls)]
        for k, segment in enumerate(cut, 1):
            part = [AgentToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in segment.calls]
            # One segment keeps the operation ID of the whole batch, as before the run tools existed.
            suffix = "" if len(cut) == 1 else f"-{k}"
            if segment.run is None:
                ran = await self._step(
                    steps.AGENT_TOOLS,
                    AgentToolsInput(
                        run_id=wf,
                        op_id=f"{repair_op}:tools-{turn}{suffix}",
                        attempt=attempt,
                        turn=turn,
                        spec_ref=self._spec_ref,
                        transcript_ref=transcript,
                        patch_ref=patch,
                        calls=part,
                    ),
                )
                accounting.count_tools(self._state.budgets, attempt, ran)
                transcript, patch = ran.transcript_ref, ran.patch_ref
                summary = ran.summary if ran.summary is not None else summary
            elif segment.run == RUN_REPRODUCTION:
                content = await self._agent_reproduction(report, attempt, turn, k, patch)
                transcript = await self._step(
                    steps.AGENT_RECORD,
                    AgentRecordInput(
                        run_id=wf,
                        attempt=attempt,
                        turn=turn,
                        transcript_ref=transcript,
                        results=[AgentToolResult(id=part[0].id, content=content)],
                    ),
                )
            else:
                done = await self._step(
                    steps.AGENT_RUN,
                    AgentRunInput(
                        run_id=wf,
                        op_id=f"{repair_op}:run-{turn}-{k}",
                        attempt=attempt,
                        turn=turn,
                        spec_ref=self._spec_ref,
                        transcript_ref=transcript,
                        patch_ref=patch,
                        call=part[0],
                    ),
                )
                transcript = done.transcript_ref
                accounting.count_invalid(self._state.budgets, attempt, int(done.refused))
                if done.output_ref is not None:
                    self._record(done.output_ref)
        return transcript, patch, summary

    async def _agent_reproduction(
        self, report: ReportInfo, attempt: int, turn: int, k: int, patch: ArtifactRef | None
    ) -> str:
        """The report's procedure on the app built from base + ``patch``, told as a tool result. An app that
        keeps dying is a finding for the model here, not the end of the run."""
        label = f"agent-{attempt}-{turn}-{k}"
        try:
            fact = await self._reproduce_on(report.base_revision, patch, label, Phase.REPAIR, Phase.REPAIR)
        except RunEnded as ended:
            return f"error: the reproduction could not run: {ended.detail}"
        self._enter(Phase.REPAIR)
        shown = {
            ReproductionOutcome.REPRODUCED: "the bug still shows on your workspace",
            ReproductionOutcome.NOT_REPRODUCED: "the bug no longer shows on your workspace",
        }.get(fact.status, f"the reproduction ended {fact.status}")
        return f"{shown}: {fact.detail}" if fact.detail else shown

    async def _verify(self, report: ReportInfo, candidate: CandidateFact) -> str | None:
        """Verify a candidate on a fresh workspace: tests, then the reproduction replayed. None means passed."""
        wf = self._state.workflow_id
        assert self._spec_ref is not None
        verified = await self._step(
            steps.VERIFY_CANDIDATE,
            VerifyInput(
                run_id=wf,
                op_id=op_id(wf, "revision-verify", candidate.revision)
                if candidate.revision
                else f"{op_id(wf, 'head-verify')}:{candidate.pushed_head}"
                if candidate.pushed_head
                else f"{op_id(wf, 'base-verify')}:{candidate.base_revision}"
                if candidate.base_revision
                else op_id(wf, "verify", candidate.attempt),
                spec_ref=self._spec_ref,
                patch_ref=candidate.patch_ref,
                message=self._commit_message(report, candidate),
                commit_timestamp=candidate.commit_timestamp,
                baseline_cases_ref=self._state.baseline.cases_ref if self._state.baseline else None,
                parent_commit=candidate.parent_commit,
                base_revision=candidate.base_revision,
            ),
        )
        head_tree = candidate.tree
        # A pushed head is verified as base + its whole change, which must rebuild the head's own tree; the
        # candidate is then that head (the commit made on the workspace is the verification's, not the PR's).
        candidate.commit = candidate.pushed_head or verified.commit
        candidate.tree = verified.tree
        candidate.tests_passed = verified.tests_passed
        candidate.test_summary = verified.test_summary
        candidate.test_output_ref = verified.test_output_ref
        candidate.bundle_ref = verified.bundle_ref
        self._record(verified.test_output_ref)
        self._record(verified.bundle_ref)
        candidate.regression = verified.regression
        for ref in verified.regression.refs if verified.regression else []:
            self._record(ref)
        if candidate.pushed_head and verified.tree != head_tree:
            return f"the verified tree {verified.tree} is not the tree {head_tree} of {candidate.pushed_head}"
        if not verified.tests_passed:
            return f"tests failed: {verified.test_summary}"
        proof = verified.regression
        if self._input.policy.require_regression_test and (proof is None or proof.status != ProofStatus.PROVEN):
            said = proof.summary if proof else "no regression proof was run"
            return (
                f"no regression test: {said}; the policy asks for a test that fails on the base and passes with the fix"
            )
        label = (
            f"revision-{candidate.revision}"
            if candidate.revision
            else f"head-{candidate.pushed_head[:12]}"
            if candidate.pushed_head
            else f"base-{candidate.base_revision[:12]}"
            if candidate.base_revision
            else f"candidate-{candidate.attempt}"
        )
        replay = await self._reproduce_on(
            candidate.commit, candidate.patch_ref, label, Phase.VERIFY, Phase.VERIFY, base=candidate.base_revision
        )
        candidate.replay = replay
        if replay.status == ReproductionOutcome.REPRODUCED:
            return "the bug still reproduces on the candidate"
        if replay.status != ReproductionOutcome.NOT_REPRODUCED:
            return f"replay on the candidate was {replay.status}: {replay.detail}"
        return None

    # ---- environments and reproduction --------------------------------------------------------------

    async def _reproduce_on(
        self,
        revision: str,
        patch_ref: ArtifactRef | None,
        label: str,
        provisioning: Phase,
        reproducing: Phase,
        base: str | None = None,
    ) -> ReproductionFact:
        """Provision (in phase ``provisioning``) ``patch_ref`` on ``base`` (default: the run's base), reproduce
        (in ``reproducing``), tear down. An environment found dead is provisioned anew, once."""
        wf = self._state.workflow_id
        assert self._spec_ref is not None and self._procedure_ref is not None
        last_detail = ""
        for env_attempt in (1, 2):
            env_op = op_id(wf, f"env-{label}", env_attempt)
            self._enter(provisioning)
            try:
                handle = await self._step(
                    steps.PROVISION,
                    ProvisionInput(
                        run_id=wf,
                        op_id=env_op,
                        spec_ref=self._spec_ref,
                        patch_ref=patch_ref,
                        provider=self._input.environment_provider,
                        base_revision=base,
                    ),
                )
            except ActivityError as err:
                if failure_class(err) != FailureClass.NOT_READY:
                    raise
                # The app at this revision never became ready: a finding about the revision, not a crash.
                log_ref = _detail_ref(err, "log_ref")
                if log_ref is not None:
                    self._record(log_ref)
                return ReproductionFact(
                    op_id=env_op,
                    revision=revision,
                    status=ReproductionOutcome.APP_NOT_READY,
                    procedure_ref=self._procedure_ref,
                    detail=failure_message(err),
                    log_ref=log_ref,
                )
            self._live_envs[handle.env_id] = handle
            self._state.environment = EnvironmentFact(
                env_id=handle.env_id,
                provider=handle.provider,
                op_id=handle.op_id,
                revision=revision,
                spec_ref=self._spec_ref,
                base_url=handle.base_url,
                last_status=EnvironmentState.READY,
                sandbox=handle.sandbox,
                host=handle.host,
            )
            repro_op = op_id(wf, f"reproduce-{label}", env_attempt)
            self._enter(reproducing)
            host = self._host_of(handle)
            try:
                result = await self._step(
                    steps.REPRODUCE,
                    ReproduceInput(
                        run_id=wf,
                        op_id=repro_op,
                        revision=revision,
                        procedure_ref=self._procedure_ref,
                        environment=handle,
                        spec_ref=self._spec_ref,
                    ),
                    host=host,
                )
            except ActivityError as err:
                if host and _host_unreachable(err):
                    # The host is gone or cut off: a teardown there would only wait for it too. What it holds is
                    # its share of the run's cleanup at the end.
                    last_detail = f"host {host} holding the environment did not take the reproduction"
                    self._state.environment.last_status = EnvironmentState.GONE
                    continue
                if failure_class(err) != FailureClass.ENVIRONMENT_GONE:
                    raise
                last_detail = failure_message(err)
                self._state.environment.last_status = EnvironmentState.GONE
                await self._teardown(handle)
                continue
            await self._teardown(handle)
            self._state.budgets.reproduction_runs += result.runs
            for ref in result.artifacts:
                self._record(ref)
            return ReproductionFact(
                op_id=repro_op,
                revision=revision,
                status=ReproductionOutcome.of(result.status),
                procedure_ref=self._procedure_ref,
                trace_refs=result.trace_refs,
                screenshot_refs=result.screenshot_refs,
                video_refs=result.video_refs,
                log_ref=result.log_ref,
                detail=result.detail,
            )
        raise RunEnded(Outcome.NEEDS_HUMAN_TRIAGE, f"environment for {label} kept dying: {last_detail}")

    async def _teardown(self, handle: EnvironmentHandle) -> None:
        host = self._host_of(handle)
        try:
            await self._step(steps.TEARDOWN, handle, host=host)
        except ActivityError as err:
            if not (host and _host_unreachable(err)):
                raise
            # The host is gone or cut off: what it holds is its share of the run's cleanup (on its queue) at the end.
            workflow.logger.warning("host %s did not take the teardown of %s", host, handle.env_id)
            return
        self._live_envs.pop(handle.env_id, None)
        if self._state.environment is not None and self._state.environment.env_id == handle.env_id:
            self._state.environment.last_status = EnvironmentState.TORN_DOWN

    def _host_of(self, handle: EnvironmentHandle) -> str:
        """The host the steps reaching ``handle`` must run on (``""``: any; see :mod:`pipeline.hosts`)."""
        if not handle.host or not workflow.patched(HOST_AFFINITY_PATCH):
            return ""
        if handle.host not in self._hosts:
            self._hosts.append(handle.host)
        return handle.host

    async def _cleanup_hosts(self, report: CleanupReport) -> list[str]:
        """Each host that held an environment of the run removes what it holds (added to ``report``); returns
        the hosts that did not take their cleanup in time, whose share remains."""
        unreachable = []
        for host in self._hosts:
            try:
                part = await self._step(steps.CLEANUP_RUN, CleanupRunInput(run_id=self._state.workflow_id), host=host)
            except ActivityError as err:
                if not _host_unreachable(err):
                    raise
                unreachable.append(host)
                continue
            # The general cleanup may have run on this very host: what both report is said once.
            seen = {(r.kind, r.resource_id) for r in report.remaining}
            report.removed.extend(part.removed)
            report.remaining.extend(r for r in part.remaining if (r.kind, r.resource_id) not in seen)
            report.errors.extend(e for e in part.errors if e not in report.errors)
        return unreachable

    # ---- publish, review, merge ---------------------------------------------------------------------

    def _evidence_input(self, report: ReportInfo, candidate: CandidateFact) -> BuildEvidenceInput:
        """What the evidence of a verified ``candidate`` (a repair's or a revision's) is built from."""
        wf = self._state.workflow_id
        inp = self._input
        assert candidate.commit is not None and self._procedure_ref is not None and self._spec_ref is not None
        base = self._state.reproduction
        replay = candidate.replay
        assert base is not None and replay is not None and candidate.test_output_ref is not None
        baseline = self._state.baseline
        return BuildEvidenceInput(
            run_id=wf,
            repository=inp.repository,
            issue_number=inp.issue_number,
            base_revision=candidate.base_revision or report.base_revision,
            candidate_commit=candidate.commit,
            procedure_ref=self._procedure_ref,
            base_reproduction=[
                *base.trace_refs,
                *base.screenshot_refs,
                *base.video_refs,
                *([base.log_ref] if base.log_ref else []),
            ],
            candidate_reproduction=[
                *replay.trace_refs,
                *replay.screenshot_refs,
                *replay.video_refs,
                *([replay.log_ref] if replay.log_ref else []),
            ],
            base_status=base.status,
            candidate_status=replay.status,
            patch_ref=candidate.patch_ref,
            test_output_ref=candidate.test_output_ref,
            tests_passed=bool(candidate.tests_passed),
            spec_ref=self._spec_ref,
            test_summary=candidate.test_summary or "",
            baseline_passed=baseline.passed if baseline else None,
            baseline_summary=baseline.summary if baseline else "",
            baseline_output_ref=baseline.test_output_ref if baseline else None,
            regression=candidate.regression,
        )

    async def _publish(self, report: ReportInfo, candidate: CandidateFact) -> None:
        wf = self._state.workflow_id
        assert candidate.commit is not None
        evidence = await self._build_evidence(report, candidate)
        branch = branch_for(wf)
        self._state.publish = PublishFact(
            branch=branch,
            commit=candidate.commit,
            manifest_ref=evidence.manifest_ref,
            report_ref=evidence.report_ref,
            report_url=evidence.report_url,
            evidence_digest=evidence.digest,
        )
        await self._push(report, candidate, op_id(wf, "push"), branch, None)
        pr = await self._ensure_pr(report, candidate, op_id(wf, "pr"), branch)
        self._state.publish.pr_number = pr.number
        self._state.publish.pr_url = pr.url
        self._state.publish.evidence_comment_id = await self._evidence_comment(pr.number, candidate, evidence)

    async def _build_evidence(self, report: ReportInfo, candidate: CandidateFact) -> EvidenceResult:
        evidence = await self._step(steps.BUILD_EVIDENCE, self._evidence_input(report, candidate))
        self._record(evidence.manifest_ref)
        self._record(evidence.report_ref)
        return evidence

    async def _push(
        self, report: ReportInfo, candidate: CandidateFact, push_op: str, branch: str, old_head: str | None
    ) -> None:
        """Push the verified ``candidate`` to ``branch``: a new branch (``old_head`` None), or a commit on top
        of ``old_head``, which is then the push's lease."""
        assert candidate.commit is not None
        await self._step(
            steps.PUBLISH_BRANCH,
            PublishBranchInput(
                op_id=push_op,
                run_id=self._state.workflow_id,
                repository=self._input.repository,
                clone_url=report.clone_url,
                branch=branch,
                base_revision=report.base_revision,
                patch_ref=candidate.patch_ref,
                expected_commit=candidate.commit,
                message=self._commit_message(report, candidate),
                commit_timestamp=candidate.commit_timestamp,
                expected_old=old_head,
                parent_commit=old_head,
            ),
        )

    async def _ensure_pr(self, report: ReportInfo, repaired: CandidateFact, pr_op: str, branch: str) -> PullInfo:
        """The run's draft PR, its description written from the repair's candidate ``repaired``."""
        inp = self._input
        return await self._step(
            steps.ENSURE_DRAFT_PR,
            EnsureDraftPrInput(
                op_id=pr_op,
                run_id=self._state.workflow_id,
                repository=inp.repository,
                branch=branch,
                base=inp.base_branch,
                title=messages.pr_title(report.title, inp.issue_number),
                body=messages.pr_body(self._state, repaired, inp.policy.closing_keyword),
            ),
        )

    async def _evidence_comment(self, number: int, candidate: CandidateFact, evidence: EvidenceResult) -> int:
        """The PR's evidence comment for ``candidate``'s commit (keyed by it); its ID."""
        comment = await self._step(
            steps.ENSURE_COMMENT,
            EnsureCommentInput(
                repository=self._input.repository,
                number=number,
                key=f"{self._state.workflow_id}:evidence:{candidate.commit}",
                body=messages.evidence_comment(self._state, candidate, evidence),
            ),
        )
        return comment.comment_id

    async def _review_and_merge(self) -> tuple[Outcome, str]:
        wf = self._state.workflow_id
        publish = self._state.publish
        assert publish is not None and publish.pr_number is not None and publish.evidence_digest is not None
        head = publish.commit
        renewals = 0
        self._gate = workflow.patched(MOVED_HEAD_PATCH)
        while True:
            while self._gate and self._moved_head is not None:
                push, self._moved_head = self._moved_head, None
                await self._gate_moved_head(push)
                head = publish.commit
            self._enter(Phase.AWAITING_REVIEW)
            self._state.pending_approval = ApprovalRequest(
                pr_number=publish.pr_number,
                head_sha=head,
                evidence_digest=publish.evidence_digest,
                requested_at=workflow.now(),
            )
            self._record_state()
            if workflow.patched(REVIEW_TICKET_PATCH):
                await self._update_ticket(note=self._review_note)
            try:
                await workflow.wait_condition(
                    lambda: (
                        self._approval is not None
                        or self._rejection is not None
                        or self._revision_request is not None
                        or (self._gate and self._moved_head is not None)
                    ),
                    timeout=timedelta(seconds=self._input.policy.review_timeout_s),
                )
            except TimeoutError:
                return Outcome.REJECTED, "no review before the review deadline"
            if self._gate and self._moved_head is not None and self._rejection is None:
                continue  # the moved head is verified before anything else is decided about the PR
            if self._rejection is None and self._revision_request is not None:
                request, self._revision_request = self._revision_request, None
                if workflow.patched(REVISIONS_PATCH):
                    await self._revise(request)
                    head = publish.commit
                    continue
                self._rejection = request  # as runs recorded before revisions took it
            if self._rejection is not None:
                r = self._rejection
                return Outcome.REJECTED, f"rejected by {r.reviewer}" + (f": {r.reason}" if r.reason else "")
            approval = self._approval
            assert approval is not None
            self._state.approval = approval
            self._state.pending_approval = None

            self._enter(Phase.MERGE)
            pr = await self._step(
                steps.READ_PR,
                ReadPullInput(repository=self._input.repository, number=publish.pr_number),
            )
            if pr.merged:
                if pr.head_sha == approval.head_sha:
                    self._state.merged_sha = pr.merge_commit_sha
                    return Outcome.MERGED, "the PR was already merged at the approved head"
                return Outcome.AMBIGUOUS_NEEDS_HUMAN, f"the PR was merged by someone else at {pr.head_sha}"
            if pr.state != "open":
                return Outcome.REJECTED, "the PR was closed without merging"
            if approval.expires_at is not None and workflow.now() >= approval.expires_at:
                # The decision no longer stands: ask again for the same head rather than merge on it.
                self._approval = None
                self._state.approval = None
                when = approval.expires_at.isoformat()
                await self._update_ticket(
                    note=f"the approval by {approval.reviewer} expired at {when}; renewed review needed"
                )
                continue
            if self._gate and workflow.patched(BASE_MOVED_PATCH) and await self._reverify_on_moved_base():
                head = publish.commit  # a rebuilt head was pushed: it is reviewed again before any merge
                continue
            merge_result = await self._step(
                steps.MERGE,
                MergeInput(
                    op_id=op_id(wf, "merge", renewals + 1),
                    repository=self._input.repository,
                    number=publish.pr_number,
                    approved_sha=approval.head_sha,
                    reviewer=approval.reviewer,
                    source=approval.source,
                    review_id=approval.review_id,
                    approval_policy=self._input.policy.approval_policy,
                ),
            )
            if merge_result.status == MergeStatus.NOT_APPROVED and workflow.patched(REVIEW_ON_FORGE_PATCH):
                # The approval has no standing on the forge: it is dropped, and a reviewer is asked for one.
                self._approval = None
                self._state.approval = None
                await self._ask_for_review(publish.pr_number, head, approval, merge_result.detail)
                continue
            if merge_result.status in (MergeStatus.MERGED, MergeStatus.ALREADY_MERGED):
                self._state.merged_sha = merge_result.merged_sha
                return Outcome.MERGED, f"merged {approval.head_sha[:12]} approved by {approval.reviewer}"
            if merge_result.status == MergeStatus.NOT_MERGEABLE:
                return Outcome.AMBIGUOUS_NEEDS_HUMAN, f"the PR is not mergeable: {merge_result.detail}"
            # The head moved after the approval: the approval does not cover it, ask for a renewed review.
            renewals += 1
            current = await self._step(
                steps.READ_PR,
                ReadPullInput(repository=self._input.repository, number=publish.pr_number),
            )
            if self._gate:
                # Verified first, with new evidence, before a renewed review of it is asked for (the approval
                # is dropped there; its reviewer is asked again).
                moved = HeadPush(pr_number=publish.pr_number, head_sha=current.head_sha, source="merge")
                if not self._note_moved_head(moved) and self._moved_head is None:
                    self._approval = None
                    self._state.approval = None
                    self._review_note = f"the merge found the PR head moved; `{head[:12]}` is still under review"
                continue
            self._approval = None
            self._state.approval = None
            head = current.head_sha
            await self._update_ticket(note=f"the PR head moved to {head[:12]} after approval; renewed review needed")

    async def _gate_moved_head(self, push: HeadPush) -> None:
        """Verify a moved head of the run's PR before anyone is asked to review it (MOVED_HEAD_PATCH).

        The PR is read first: the head verified is the one it has now (a push seen late, already replaced by
        another, is marked superseded and the PR's current head is taken in its place; a closed or merged PR
        is left to the review wait). The head is fetched from the forge and stored as its change from the
        run's base (``env.capture_head``), a candidate of the run (``pushed_head``) verified like any other:
        a fresh workspace, the recipe's tests and the regression policy, the reproduction replayed, and the
        rebuilt tree must be the head's own. An approval held for the previous head, and a request for changes
        of it, no longer apply.

        Passing: new evidence and an evidence comment keyed by the head, the publish fact names the head and its
        digest (the renewed review request, which the review wait then makes, carries both), a keyed comment
        says so on the PR and the last approver (a forge reviewer) is asked again. Failing: said on the PR
        (keyed by the head) and on the ticket, and the run ends ``needs-human-triage``: a head that failed is
        never offered for approval, and the run does not wait for a review nobody should give. Idempotent on
        retry: every effect is keyed by the head.
        """
        wf = self._state.workflow_id
        publish = self._state.publish
        report = self._report
        assert publish is not None and publish.pr_number is not None and report is not None
        assert self._spec_ref is not None
        fact = next(f for f in self._state.head_pushes if f.head_sha == push.head_sha)
        previous = self._approval or self._state.approval
        self._approval = None
        self._state.approval = None
        self._state.pending_approval = None
        self._revision_request = None
        self._enter(Phase.VERIFY)
        pr = await self._step(steps.READ_PR, ReadPullInput(repository=self._input.repository, number=publish.pr_number))
        if pr.merged or pr.state != "open":
            fact.status, fact.detail = HeadPushStatus.SUPERSEDED, f"the PR is {'merged' if pr.merged else pr.state}"
            return
        if pr.head_sha != push.head_sha:
            fact.status, fact.detail = HeadPushStatus.SUPERSEDED, f"the PR's head was {pr.head_sha} by then"
            self._note_moved_head(
                HeadPush(pr_number=publish.pr_number, head_sha=pr.head_sha, before=push.head_sha, source="forge")
            )
            return
        sha = push.head_sha
        fact.status = HeadPushStatus.VERIFYING
        captured = await self._step(
            steps.CAPTURE_HEAD,
            CaptureHeadInput(run_id=wf, spec_ref=self._spec_ref, head_sha=sha, base_revision=report.base_revision),
        )
        self._record(captured.patch_ref)
        old_head = publish.commit
        candidate = CandidateFact(
            attempt=0,
            op_id=f"{op_id(wf, 'head')}:{sha}",
            patch_ref=captured.patch_ref,
            summary=captured.message.strip() or f"head {sha}",
            commit_timestamp=captured.committed_at,
            tree=captured.tree,
            pushed_head=sha,
            pushed_by=push.pusher,
        )
        self._state.candidates.append(candidate)
        failure = (
            f"{sha[:12]} changes nothing from the base revision {report.base_revision[:12]}"
            if captured.empty
            else await self._verify(report, candidate)
        )
        candidate.verification = VerificationStatus.PASSED if failure is None else VerificationStatus.FAILED
        candidate.failure = failure
        if failure is not None:
            fact.status, fact.detail = HeadPushStatus.FAILED, failure
            await self._say_on_pr(
                f"{wf}:head-failed:{sha}", head_gate.head_failed_comment(old_head, sha, push.pusher, failure)
            )
            detail = head_gate.head_failed_detail(sha, push.pusher, failure)
            self._closing_note = detail
            raise RunEnded(Outcome.NEEDS_HUMAN_TRIAGE, detail)
        candidate.commit = sha
        self._enter(Phase.PUBLISH)
        evidence = await self._build_evidence(report, candidate)
        publish.commit = sha
        publish.manifest_ref = evidence.manifest_ref
        publish.report_ref = evidence.report_ref
        publish.report_url = evidence.report_url
        publish.evidence_digest = evidence.digest
        publish.evidence_comment_id = await self._evidence_comment(publish.pr_number, candidate, evidence)
        await self._say_on_pr(
            f"{wf}:head-verified:{sha}",
            head_gate.head_verified_comment(old_head, sha, push.pusher, evidence.digest, candidate.test_summary or ""),
        )
        if previous is not None and previous.source == "webhook":
            await self._step(
                steps.REQUEST_REVIEW,
                RequestReviewInput(
                    repository=self._input.repository, number=publish.pr_number, reviewers=[previous.reviewer]
                ),
            )
        fact.status, fact.detail = HeadPushStatus.PASSED, f"verified; evidence {evidence.digest}"
        self._review_note = head_gate.head_verified_note(sha, push.pusher, evidence.digest)

    async def _reverify_on_moved_base(self) -> bool:
        """Before merging (BASE_MOVED_PATCH): read the base branch; if it moved since the head under review was
        verified (``publish.verified_base``), rebuild the change on its new head and verify that.

        A change that no longer applies (a conflict) is said on the PR and the ticket and ends the run
        ``needs-human-triage``: nothing is merged around it. A rebuilt change that fails verification ends it the
        same way. One that passes gets new evidence, and then (``RunPolicy.base_moved``): ``merge`` with the
        same change (equal patch IDs) records the verification on the new base (an evidence comment keyed by
        the head and the base) and returns False: the approved head merges, and the forge's merge commit is the
        tree verified. A change that differs, or ``rebase``: the rebuilt head (a commit on the new base) is
        pushed with a lease on the head under review, an evidence comment keyed by it, a keyed comment on the
        PR, the approval dropped (its reviewer asked again), and True: the review wait asks for a review of it.
        Every effect is keyed by the new base, so a retried step finds its own work.
        """
        wf = self._state.workflow_id
        inp = self._input
        publish = self._state.publish
        report = self._report
        assert publish is not None and publish.pr_number is not None and report is not None
        assert self._spec_ref is not None
        now = await self._step(steps.READ_BRANCH, ReadBranchInput(repository=inp.repository, branch=inp.base_branch))
        verified_base = publish.verified_base or report.base_revision
        if now.sha is None or now.sha == verified_base:
            return False
        new_base = now.sha
        head = publish.commit
        under_review = next(c for c in reversed(self._state.candidates) if c.commit == head)
        self._enter(Phase.VERIFY)
        rebuilt = await self._step(
            steps.REBUILD_ON_BASE,
            RebuildOnBaseInput(
                run_id=wf, spec_ref=self._spec_ref, head_sha=head, old_base=verified_base, new_base=new_base
            ),
        )
        if rebuilt.conflict or rebuilt.patch_ref is None:
            await self._say_on_pr(
                f"{wf}:base-conflict:{new_base}",
                head_gate.base_conflict_comment(head, inp.base_branch, new_base, rebuilt.detail),
            )
            self._closing_note = head_gate.base_conflict_detail(inp.base_branch, new_base, rebuilt.detail)
            raise RunEnded(Outcome.NEEDS_HUMAN_TRIAGE, self._closing_note)
        self._record(rebuilt.patch_ref)
        candidate = CandidateFact(
            attempt=0,
            op_id=f"{op_id(wf, 'base')}:{new_base}",
            patch_ref=rebuilt.patch_ref,
            summary=under_review.summary,
            commit_timestamp=under_review.commit_timestamp,
            base_revision=new_base,
            rebuilt_from=head,
        )
        self._state.candidates.append(candidate)
        failure = await self._verify(report, candidate)
        candidate.verification = VerificationStatus.PASSED if failure is None else VerificationStatus.FAILED
        candidate.failure = failure
        if failure is not None:
            await self._say_on_pr(
                f"{wf}:base-failed:{new_base}",
                head_gate.base_failed_comment(head, inp.base_branch, new_base, failure),
            )
            self._closing_note = head_gate.base_failed_detail(inp.base_branch, new_base, failure)
            raise RunEnded(Outcome.NEEDS_HUMAN_TRIAGE, self._closing_note)
        assert candidate.commit is not None
        self._enter(Phase.PUBLISH)
        evidence = await self._build_evidence(report, candidate)
        publish.verified_base = new_base
        publish.manifest_ref = evidence.manifest_ref
        publish.report_ref = evidence.report_ref
        publish.report_url = evidence.report_url
        publish.evidence_digest = evidence.digest
        if rebuilt.same_change and inp.policy.base_moved == "merge":
            await self._say_on_pr(
                f"{wf}:evidence:{head}:base-{new_base}",
                head_gate.base_verified_header(head, inp.base_branch, new_base)
                + messages.evidence_comment(self._state, candidate, evidence),
            )
            return False
        await self._step(
            steps.PUBLISH_BRANCH,
            PublishBranchInput(
                op_id=f"{op_id(wf, 'base-push')}:{new_base}",
                run_id=wf,
                repository=inp.repository,
                clone_url=report.clone_url,
                branch=publish.branch,
                base_revision=new_base,
                patch_ref=candidate.patch_ref,
                expected_commit=candidate.commit,
                message=self._commit_message(report, candidate),
                commit_timestamp=candidate.commit_timestamp,
                expected_old=head,
            ),
        )
        publish.commit = candidate.commit
        publish.evidence_comment_id = await self._evidence_comment(publish.pr_number, candidate, evidence)
        await self._say_on_pr(
            f"{wf}:base-rebuilt:{new_base}",
            head_gate.base_rebuilt_comment(head, inp.base_branch, new_base, candidate.commit, evidence.digest),
        )
        previous = self._approval or self._state.approval
        self._approval = None
        self._state.approval = None
        if previous is not None and previous.source == "webhook":
            await self._step(
                steps.REQUEST_REVIEW,
                RequestReviewInput(repository=inp.repository, number=publish.pr_number, reviewers=[previous.reviewer]),
            )
        self._review_note = head_gate.base_rebuilt_note(inp.base_branch, new_base, candidate.commit)
        return True

    async def _ask_for_review(self, pr_number: int, head: str, approval: Approval, why: str) -> None:
        """Say on the PR (one keyed comment per head) and on the ticket that the approval received does not
        stand on the forge, and what would: a review approving ``head``."""
        wf = self._state.workflow_id
        ask = (
            f"durafix received an approval of `{head}` ({approval.source}, by {approval.reviewer}) but did not merge: "
            f"{why}. To merge, a reviewer with permission to approve submits an **Approve** review of `{head}` "
            "on this pull request."
        )
        await self._step(
            steps.ENSURE_COMMENT,
            EnsureCommentInput(
                repository=self._input.repository, number=pr_number, key=f"{wf}:review-needed:{head}", body=ask
            ),
        )
        self._review_note = f"not merged: {why}; waiting for an approving review of `{head[:12]}` on the PR"
        await self._update_ticket(note=self._review_note)

    # ---- revisions on review ------------------------------------------------------------------------

    def _commit_message(self, report: ReportInfo, candidate: CandidateFact) -> str:
        if candidate.pushed_head:
            return candidate.summary  # the pushed head's own message (its verification commit is not pushed)
        if candidate.revision:
            return revisions.revision_commit_message(
                self._state.issue_number,
                self._state.workflow_id,
                candidate.revision,
                candidate.reviewer or "a reviewer",
                candidate.summary,
            )
        return messages.commit_message(self._state, report.title, candidate.summary)

    async def _revise(self, request: Rejection) -> None:
        """Answer a permitted reviewer's request for changes of the head under review.

        While the revision budget (``revisions_max``) lasts: one bounded attempt on top of the candidate under
        review (its patch is where the attempt starts; its first message carries the review's body and line
        comments, read from the forge), verified like any candidate. A revision that passes is pushed to the
        same branch as a commit on top of the head under review, with that head as the push's lease (a branch
        moved by anyone else is a conflict, never overwritten); the same PR then shows it (its description
        now lists the revision), gets an evidence comment keyed by the new head, and the reviewer is asked
        again. A revision that fails is said on the PR (keyed per revision) and pushes nothing: the previous
        head stays under review. Once the budget is spent, the request is said on the PR and ends the run
        ``rejected``. A rejection (reject command, closed PR) that arrives during the revision is acted on by
        the review wait that follows it.
        """
        wf = self._state.workflow_id
        budgets = self._state.budgets
        publish = self._state.publish
        report = self._report
        assert publish is not None and publish.pr_number is not None and report is not None
        head = publish.commit
        if budgets.revisions_used >= budgets.revisions_max:
            await self._say_on_pr(
                f"{wf}:revisions-spent", revisions.budget_spent_comment(budgets.revisions_max, request.reviewer, head)
            )
            raise RunEnded(
                Outcome.REJECTED,
                f"changes requested by {request.reviewer} after the revision budget ({budgets.revisions_max}) "
                "was spent" + (f": {request.reason}" if request.reason else ""),
            )
        budgets.revisions_used += 1
        n = budgets.revisions_used
        under_review = next(c for c in reversed(self._state.candidates) if c.commit == head)
        self._state.pending_approval = None
        self._approval = None  # an approval of the head under review does not cover its revision
        self._revising = True
        try:
            candidate, failure = await self._revision_candidate(report, request, under_review, n)
            if failure is None:
                assert candidate is not None
                await self._publish_revision(report, candidate, head)
                self._review_note = f"revision {n} pushed as `{publish.commit[:12]}`; waiting for a review of it"
            else:
                await self._say_on_pr(
                    f"{wf}:revision-failed:{n}",
                    revisions.revision_failed_comment(n, budgets.revisions_max, request.reviewer, head, failure),
                )
                self._review_note = f"revision {n} did not pass ({failure}); `{head[:12]}` is still under review"
        finally:
            self._revising = False

    async def _revision_candidate(
        self, report: ReportInfo, request: Rejection, under_review: CandidateFact, n: int
    ) -> tuple[CandidateFact | None, str | None]:
        """Revision ``n``: the attempt and its verification. The verified candidate, or why there is none."""
        wf = self._state.workflow_id
        budgets = self._state.budgets
        assert self._spec_ref is not None and under_review.commit is not None
        review: ReviewRead | None = None
        if request.review_id is not None and request.pr_number is not None:
            review = await self._step(
                steps.READ_REVIEW,
                ReadReviewInput(
                    repository=self._input.repository, number=request.pr_number, review_id=int(request.review_id)
                ),
            )
        feedback = revisions.feedback_text(request, review)
        spent = budgets.model_prompt_tokens + budgets.model_completion_tokens
        if spent >= budgets.model_token_budget:
            return None, f"the model token budget is spent ({spent} >= {budgets.model_token_budget})"
        self._enter(Phase.REPAIR)
        # An attempt number of its own, so its transcripts and patch are told apart from the repair attempts'.
        attempt = budgets.repair_attempts_used + n
        repair_op = op_id(wf, "revision", n)
        try:
            proposal = await self._stepped_attempt(
                report,
                attempt,
                repair_op,
                [],
                budgets.model_token_budget - spent,
                start_patch=under_review.patch_ref,
                revision=n,
                review_feedback=feedback,
            )
        except RunEnded as ended:
            return None, ended.detail
        except ActivityError as err:
            self._count_tokens(err)
            if failure_class(err) not in (FailureClass.NO_PATCH, FailureClass.PERMANENT, FailureClass.BUDGET):
                raise
            return None, f"no usable patch ({failure_message(err)})"
        if proposal.patch_ref.sha256 == under_review.patch_ref.sha256:
            return None, "the revision changed nothing"
        self._record(proposal.patch_ref)
        candidate = CandidateFact(
            attempt=attempt,
            op_id=repair_op,
            patch_ref=proposal.patch_ref,
            summary=proposal.summary,
            commit_timestamp=int(workflow.now().timestamp()),
            revision=n,
            parent_commit=under_review.commit,
            review_id=request.review_id,
            reviewer=request.reviewer,
        )
        self._state.candidates.append(candidate)
        self._enter(Phase.VERIFY)
        failure = await self._verify(report, candidate)
        candidate.verification = VerificationStatus.PASSED if failure is None else VerificationStatus.FAILED
        candidate.failure = failure
        return (candidate, None) if failure is None else (None, failure)

    async def _publish_revision(self, report: ReportInfo, candidate: CandidateFact, old_head: str) -> None:
        """Push the verified revision on top of ``old_head`` (the lease), then evidence and a renewed review."""
        wf = self._state.workflow_id
        inp = self._input
        publish = self._state.publish
        assert publish is not None and publish.pr_number is not None and candidate.commit is not None
        self._enter(Phase.PUBLISH)
        evidence = await self._build_evidence(report, candidate)
        await self._push(report, candidate, op_id(wf, "revision-push", candidate.revision), publish.branch, old_head)
        repaired = next(
            c for c in self._state.candidates if not c.revision and c.verification == VerificationStatus.PASSED
        )
        await self._ensure_pr(report, repaired, op_id(wf, "revision-pr", candidate.revision), publish.branch)
        publish.commit = candidate.commit
        publish.manifest_ref = evidence.manifest_ref
        publish.report_ref = evidence.report_ref
        publish.report_url = evidence.report_url
        publish.evidence_digest = evidence.digest
        publish.evidence_comment_id = await self._evidence_comment(publish.pr_number, candidate, evidence)
        reviewer = candidate.reviewer or ""
        await self._say_on_pr(
            f"{wf}:revision:{candidate.revision}",
            revisions.revised_comment(
                candidate.revision,
                self._state.budgets.revisions_max,
                reviewer or "the reviewer",
                old_head,
                candidate.commit,
            ),
        )
        if reviewer:
            await self._step(
                steps.REQUEST_REVIEW,
                RequestReviewInput(repository=inp.repository, number=publish.pr_number, reviewers=[reviewer]),
            )

    async def _say_on_pr(self, key: str, body: str) -> None:
        publish = self._state.publish
        assert publish is not None and publish.pr_number is not None
        await self._step(
            steps.ENSURE_COMMENT,
            EnsureCommentInput(repository=self._input.repository, number=publish.pr_number, key=key, body=body),
        )

    # ---- ending -------------------------------------------------------------------------------------

    async def _finish(self, outcome: Outcome, detail: str) -> None:
        """Clean up what the run owns, then record the honest outcome. Runs on every ending."""
        self._enter(Phase.CLEANUP)
        if self._state.cancellation:
            self._cancel_step(CancelStep.CLEANING)
        self._state.pending_approval = None
        try:
            report = await self._step(steps.CLEANUP_RUN, CleanupRunInput(run_id=self._state.workflow_id))
            unreachable = await self._cleanup_hosts(report)
            wait = self._input.policy.host_start_s
            self._state.cleanup = CleanupFact(
                status=CleanupStatus.COMPLETE if report.complete and not unreachable else CleanupStatus.INCOMPLETE,
                removed=len(report.removed),
                remaining=[f"{r.kind}:{r.resource_id}" for r in report.remaining] + [f"host:{h}" for h in unreachable],
                errors=report.errors
                + [f"host {h} did not take its share of the cleanup within {wait:g} s" for h in unreachable],
            )
        except ActivityError as err:
            self._state.cleanup = CleanupFact(status=CleanupStatus.FAILED, errors=[failure_message(err)])
        if not self._state.cleanup.complete:
            detail = f"{outcome.value}: {detail}; cleanup left {self._state.cleanup.remaining or 'unknown resources'}"
            outcome = Outcome.CLEANUP_INCOMPLETE
            if workflow.patched(CLEANUP_TICKET_PATCH):
                left = messages.cleanup_incomplete_note(self._state.workflow_id, self._state.cleanup)
                self._closing_note = f"{self._closing_note}. {left}" if self._closing_note else left
        self._state.outcome = outcome
        self._state.outcome_detail = detail
        self._enter(Phase.DONE)
        try:
            await self._update_ticket(note=self._closing_note, closing=True)
        except ActivityError as err:
            self._state.outcome_detail += f" (final ticket update failed: {failure_message(err)})"

    async def _store_record(self) -> None:
        """The whole state stored as the run's record, named by ``record_ref`` (the result is bounded). Best
        effort: the run has ended, and a record it could not store leaves ``record_ref`` unset."""
        if workflow.patched(RUN_RECORD_PATCH):
            with contextlib.suppress(ActivityError):
                self._state.record_ref = await self._step(steps.RECORD_RUN, RecordRunInput(state=self._state))

    async def _update_ticket(self, note: str = "", *, closing: bool = False) -> None:
        ticket = self._state.ticket
        if ticket is None:
            return
        async with self._ticket_lock:
            await self._step(
                steps.UPDATE_TICKET,
                UpdateTicketInput(
                    repository=self._input.repository,
                    issue_number=ticket.issue_number,
                    comment_id=ticket.comment_id,
                    op_id=ticket.op_id,
                    body=messages.ticket_body(self._state, note),
                    closing=closing,
                ),
            )

    # ---- helpers ------------------------------------------------------------------------------------

    def _enter(self, phase: Phase) -> None:
        if self._state.phase != phase:
            self._state.phase = phase
            self._state.timeline.append(PhaseMark(phase=phase, at=workflow.now()))
            self._record_state()

    def _record_state(self) -> None:
        """Upsert the compact state into the memo (:mod:`pipeline.recorded_state`), which the server keeps
        and ``describe`` returns: what ``durafix status`` shows while no worker can answer the query."""
        if workflow.patched(STATE_MEMO_PATCH):
            workflow.upsert_memo({STATE_MEMO: recorded_state(self._state, workflow.now())})

    def _count_tokens(self, err: BaseException) -> None:
        """Tokens spent by a failed model call still count against the budget (its transport failures are
        counted too)."""
        accounting.charge_failure(self._state.budgets, err)

    def _record(self, ref: ArtifactRef) -> None:
        if all(r.sha256 != ref.sha256 or r.name != ref.name for r in self._state.evidence):
            self._state.evidence.append(ref)

    async def _model_step(self, step: Step[In, Out], arg: In, attempt: int | None = None) -> Out:
        """``_step`` for a step that asks the model: a transport failure that outlasted the step's retries is
        the endpoint's outage, never a verdict on the attempt. The same step is sent again after a durable
        wait (:func:`pipeline.accounting.outage_wait`), its failed tries counted as transport retries of the
        run and of ``attempt``; once the outage would outlast the policy's allowance the run ends saying the
        endpoint was unavailable, the attempt in flight the last one used."""
        policy = self._input.policy
        budgets = self._state.budgets
        began = workflow.now()
        waits = 0
        while True:
            try:
                return await self._step(step, arg)
            except ActivityError as err:
                if (
                    _is_cancellation(err)
                    or not accounting.is_transport_failure(err)
                    or not workflow.patched(MODEL_OUTAGE_PATCH)
                ):
                    raise
                accounting.charge_failure(budgets, err, attempt)
                wait = accounting.outage_wait(policy, waits)
                down = (workflow.now() - began).total_seconds()
                if accounting.outage_spent(policy, down, wait):
                    raise RunEnded(
                        Outcome.NEEDS_HUMAN_TRIAGE,
                        f"the model endpoint was unavailable for {down:.0f} s ({failure_message(err)}), longer than "
                        f"the run's outage allowance of {policy.model_outage_allowance_s:g} s; "
                        f"{budgets.transport_retries} model request(s) failed on the transport and no repair "
                        f"attempt was spent on them ({budgets.repair_attempts_used} of {budgets.repair_attempts_max} "
                        "used): start the run again once the endpoint answers",
                    ) from err
                waits += 1
                budgets.outage_waits += 1
                budgets.outage_wait_s += wait
                await workflow.sleep(timedelta(seconds=wait))

    async def _step(self, step: Step[In, Out], arg: In, *, host: str = "") -> Out:
        """Run ``step`` with its declared queue, timeouts and output type (see :mod:`pipeline.steps`); on the
        queue of ``host`` instead when given, which must take it within ``RunPolicy.host_start_s``.

        A host-bound step has two tries per send (:func:`_host_retries`), so that a host gone silent is given up
        on quickly. A send whose last try was lost with its worker process (:func:`pipeline.failures.worker_lost`:
        the host's supervisor failed it, so the host is alive and a fresh child polls there) is sent again, until
        the step's own ``max_attempts`` are spent: a worker killed twice on a live host is not a dead host. Sending
        again is as safe as Temporal's retry: every step is idempotent by the operation ID in its input."""
        if not host:
            return await self._send(step, arg, host="")
        tries = self._input.policy.timeouts(step.timeouts).max_attempts
        sent = 0
        while True:
            try:
                return await self._send(step, arg, host=host)
            except ActivityError as err:
                sent += _HOST_TRIES
                again = not _is_cancellation(err) and worker_lost(err) and not (tries and sent >= tries)
                # The patch is asked last, so its marker is recorded only where a run is really sent again.
                if not (again and workflow.patched(HOST_WORKER_LOST_PATCH)):
                    raise
                workflow.logger.warning("%s lost its worker on host %s; sending it to the host again", step.name, host)

    async def _send(self, step: Step[In, Out], arg: In, *, host: str) -> Out:
        """One ``execute_activity`` of ``step`` (see :meth:`_step`)."""
        timeouts = self._input.policy.timeouts(step.timeouts)
        to_start = self._input.policy.host_start_s if host else timeouts.schedule_to_start
        result: Out = await workflow.execute_activity(
            step.name,
            arg,
            task_queue=host_queue(host) if host else step.queue.value,
            result_type=step.output,
            schedule_to_start_timeout=timedelta(seconds=to_start),
            start_to_close_timeout=timedelta(seconds=timeouts.start_to_close),
            schedule_to_close_timeout=timedelta(seconds=timeouts.schedule_to_close),
            heartbeat_timeout=timedelta(seconds=timeouts.heartbeat) if timeouts.heartbeat else None,
            retry_policy=_host_retries(timeouts.retry_policy()) if host else timeouts.retry_policy(),
            cancellation_type=(
                ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
                if self._cancellation_v2 and step.waits_for_cancellation
                else ActivityCancellationType.TRY_CANCEL
            ),
        )
        if self._cancel_requested():
            raise asyncio.CancelledError()
        return result


_HOST_TRIES = 2


def _host_retries(policy: RetryPolicy) -> RetryPolicy:
    """A step bound to a host is tried there twice at most per send: an attempt that stopped beating says the host
    is in trouble, and the run does better provisioning elsewhere than waiting out every attempt on it."""
    attempts = policy.maximum_attempts
    return dataclasses.replace(policy, maximum_attempts=_HOST_TRIES if attempts == 0 else min(attempts, _HOST_TRIES))


def _host_unreachable(err: ActivityError) -> bool:
    """A step bound to a host ended timed out: it waited on the host's queue longer than allowed (no worker of
    the host polls), or its last attempt stopped beating (the host died or was cut off with the attempt, or its
    poll was still open on the server when the link went down and the retry went to it)."""
    cause = err.cause
    return isinstance(cause, ActivityTimeout) and cause.type in (TimeoutType.SCHEDULE_TO_START, TimeoutType.HEARTBEAT)


def _detail_ref(err: BaseException, key: str) -> ArtifactRef | None:
    """The artifact an activity's failure names in its details under ``key`` (``None`` when it names none)."""
    for detail in failure_details(err):
        if isinstance(detail, dict) and isinstance(detail.get(key), dict):
            return ArtifactRef.model_validate(detail[key])
    return None
