"""``repair_bug``: one durable workflow per bug report.

This module is the state machine and its wiring: the Temporal handlers (queries, updates, signals and their
validators), ``run``, and the order of the phases. Each phase's work is a plain class under
:mod:`pipeline.flow`, given the run's one :class:`~pipeline.flow.context.RunContext`. Everything is
deterministic (no I/O, clocks or randomness other than ``workflow.now()``), every external effect an activity
with an operation ID ``<workflow_id>:<step>[:<n>]``. The run's facts live in :class:`RunState`, returned by
the ``state`` query.

Phases: intake -> ticket -> procedure -> provision -> reproduce -> baseline -> repair/verify (bounded) ->
publish -> awaiting-review -> merge -> cleanup -> done. Each is entered where its work starts (provisioning
the base environment is ``provision``; the candidate's environment is part of ``verify``), and the sub-state
of the activity running in it is its heartbeat. Cleanup runs on every ending, cancellation included.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from pipeline.flow.attempt import RepairAttemptWorkflow
    from pipeline.flow.context import RunContext, RunEnded, is_cancellation, new_run_state
    from pipeline.flow.phases import Phases
    from pipeline.inputs import ApprovalAck, RepairInput
    from pipeline.patches import CANCELLATION_PATCH, PINNED_REPORT_PATCH
    from pipeline.state import (
        Approval,
        Delivered,
        DeliveryAck,
        DeliveryKind,
        DeliveryRecord,
        HeadPush,
        Outcome,
        Rejection,
        ReportEdit,
        RunState,
        Withdrawal,
    )


@workflow.defn(name="repair_bug")
class RepairBugWorkflow:
    # The run context's class: a later release's workflow (tests/replay/changed_workflow.py) may extend it.
    context_type: type[RunContext] = RunContext

    @workflow.init
    def __init__(self, inp: RepairInput) -> None:
        info = workflow.info()
        carried = inp.resume
        state = (
            carried.state.model_copy(update={"run_id": info.run_id})
            if carried is not None
            else new_run_state(inp, info.workflow_id, info.run_id)
        )
        self._ctx = ctx = self.context_type(input=inp, state=state)
        if carried is not None:
            ctx.resume(carried)
        self._state = state
        self._phases = Phases(ctx)
        self._decide = self._phases.decide
        self._ending = self._phases.ending

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
        accepted, detail = self._decide.take_approval(approval, early=False)
        return ApprovalAck(accepted=accepted, detail=detail)

    @approve.validator
    def _validate_approve(self, approval: Approval) -> None:
        """Refuse (before it enters history) an approval that names anything but what awaits review."""
        refusal = self._decide.approval_refusal(approval, early=False)
        if refusal is not None:
            raise ValueError(refusal)

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
            what=self._decide.route(delivered),
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
        refusal = self._decide.delivery_refusal(delivered)
        if refusal is not None:
            raise ValueError(refusal)

    @workflow.signal
    def reject(self, rejection: Rejection) -> None:
        """A rejection (reject command, closed PR), or a review requesting changes (``changes_requested``)."""
        self._decide.reject(rejection)

    @workflow.signal
    def withdraw(self, withdrawal: Withdrawal) -> None:
        """A dismissed review withdraws the approval it carried, if the run has not acted on it yet."""
        self._decide.withdraw(withdrawal)

    @workflow.signal
    def head_moved(self, push: HeadPush) -> None:
        """The run's PR head moved to ``push.head_sha`` (a push to the run's branch, told by the webhook receiver
        or the reconciler). Ignored unless it names the run's PR and a head the run neither pushed nor awaits
        review of; the same head seen twice is acted on once. The review wait verifies it before anyone is
        asked to review it (:meth:`pipeline.flow.moved.MovedHeads.gate_moved_head`)."""
        self._decide.note_moved_head(push)

    @workflow.signal
    async def report_edited(self, edit: ReportEdit) -> None:
        """The issue's title or body changed after the trigger. Noted (once per source) and said on the ticket;
        the run keeps the text pinned at its trigger."""
        ctx = self._ctx
        if ctx.input.report is None or any(e.source == edit.source for e in self._state.report_edits):
            return
        self._state.report_edits.append(edit)
        if self._state.ticket is None or ctx.ending or self._state.outcome is not None:
            return  # the ticket, once created (or at the end), carries it
        if not workflow.patched(PINNED_REPORT_PATCH):
            return
        # Best effort: the next ticket update of the run carries the note as well.
        with contextlib.suppress(ActivityError, asyncio.CancelledError):
            await ctx.update_ticket(note=ctx.closing_note)

    # ---- the run ------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: RepairInput) -> RunState:
        ctx = self._ctx
        # Runs started before cancellation waited for active work (and noted the evidence it kept) must
        # replay as they ran: the patch marker is recorded once, at the start of new runs.
        ctx.cancellation_v2 = workflow.patched(CANCELLATION_PATCH)
        if inp.resume is None:  # a run continued as new keeps the deadline it started with
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
            if is_cancellation(err) or ctx.cancel_requested():
                cancelled = True
                outcome, detail = Outcome.CANCELLED, f"cancellation requested during {self._state.phase.value}"
            else:
                outcome, detail = self._ending.step_failure(err)
        # From here on activities run to record the ending; a cancellation no longer stops them.
        ctx.ending = True
        if cancelled:
            await self._ending.wind_down_cancelled()
        await self._ending.finish(outcome, detail)
        if cancelled:
            self._ending.cancelled()
        await self._ending.store_record()
        if cancelled:
            raise asyncio.CancelledError()
        return self._state.bounded()

    async def _pipeline(self) -> tuple[Outcome, str]:
        """The phases in order; a phase that ends the run raises :class:`RunEnded`. A run continued as new
        (its review wait did) takes up the review wait where it was."""
        if self._ctx.input.resume is None:
            await self._phases.to_review()
        return await self._review_and_merge()

    async def _review_and_merge(self) -> tuple[Outcome, str]:
        """The review gate, to the merge or another ending (a later release may extend it: see ``context_type``)."""
        return await self._phases.review.run()


# Every workflow a worker of the orchestration queue must host: a run and its attempts' child workflows.
WORKFLOWS: tuple[type, ...] = (RepairBugWorkflow, RepairAttemptWorkflow)
