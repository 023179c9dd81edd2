"""The ending of every run: how a failure or a cancellation is told, the cleanup of what the run owns, and
the honest outcome recorded (and said on the ticket)."""

from __future__ import annotations

import contextlib

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from pipeline import messages, steps
    from pipeline.failures import FailureClass, failure_class, failure_kind, failure_message
    from pipeline.flow.context import RunContext
    from pipeline.flow.environments import Environments
    from pipeline.patches import CLEANUP_TICKET_PATCH, RUN_RECORD_PATCH
    from pipeline.state import CancelStep, CleanupFact, CleanupStatus, Outcome, Phase
    from pipeline.steps import CleanupRunInput, RecordRunInput


class Ending:
    """The ending phase (see the module docstring)."""

    def __init__(self, ctx: RunContext, envs: Environments) -> None:
        self.ctx = ctx
        self.envs = envs

    def step_failure(self, err: ActivityError) -> tuple[Outcome, str]:
        """The ending of a run a step failed under: what failed, and whether it says anything about the
        report. Our own machinery failing (a transport error, the engine, a timeout) is said to be that, never
        a verdict on the report."""
        kind = failure_class(err)
        what = f"{failure_kind(err)}: {failure_message(err)}"
        phase = self.ctx.state.phase.value
        if kind == FailureClass.AMBIGUOUS:
            return Outcome.AMBIGUOUS_NEEDS_HUMAN, f"step failed ({what})"
        if kind is None or kind.retryable:
            return Outcome.NEEDS_HUMAN_TRIAGE, (
                f"durafix itself failed during {phase} after its retries ({what}); this says nothing about the "
                "report: an operator must look (`durafix history`) and can then retry"
            )
        return Outcome.NEEDS_HUMAN_TRIAGE, f"step failed during {phase} ({what})"

    async def wind_down_cancelled(self) -> None:
        """The first steps of cancellation; cleanup and the final step follow in :meth:`finish`.

        Long activities are scheduled with WAIT_CANCELLATION_COMPLETED, so by the time the cancellation
        reaches this code the active work has ended: it acknowledged the cancellation through its heartbeat,
        or it finished first and its late result was dropped (``RunContext.cancel_requested``). Only then is
        cleanup allowed to start, so it never races an activity still creating resources.
        """
        ctx = self.ctx
        ctx.cancel_step(CancelStep.REQUESTED)
        ctx.cancel_step(CancelStep.STOPPING_ACTIVE_WORK, f"stopped during {ctx.state.phase.value}")
        kept = ", ".join(sorted({r.name for r in ctx.state.evidence})) or "none yet"
        ctx.cancel_step(CancelStep.PRESERVING_EVIDENCE, f"{len(ctx.state.evidence)} artifact(s) kept")
        if ctx.cancellation_v2:
            ctx.closing_note = f"cancelled; evidence kept in the store: {kept}"
            try:
                await ctx.update_ticket(note=ctx.closing_note)
            except ActivityError as err:
                ctx.state.outcome_detail = f"ticket note failed: {failure_message(err)}"

    def cancelled(self) -> None:
        """The last cancellation step, once the ending is recorded."""
        state = self.ctx.state
        done = CancelStep.CANCELLED if state.outcome == Outcome.CANCELLED else CancelStep.CLEANUP_INCOMPLETE
        self.ctx.cancel_step(done, state.outcome_detail)

    async def finish(self, outcome: Outcome, detail: str) -> None:
        """Clean up what the run owns, then record the honest outcome. Runs on every ending."""
        ctx = self.ctx
        await ctx.settle_behind(ending=True)  # a write still in flight is not left running past the record
        ctx.enter(Phase.CLEANUP)
        if ctx.state.cancellation:
            ctx.cancel_step(CancelStep.CLEANING)
        ctx.state.pending_approval = None
        ctx.state.cleanup = await self._cleanup()
        if not ctx.state.cleanup.complete:
            detail = f"{outcome.value}: {detail}; cleanup left {ctx.state.cleanup.remaining or 'unknown resources'}"
            outcome = Outcome.CLEANUP_INCOMPLETE
            if ctx.patched(CLEANUP_TICKET_PATCH):
                left = messages.cleanup_incomplete_note(ctx.wf, ctx.state.cleanup)
                ctx.closing_note = f"{ctx.closing_note}. {left}" if ctx.closing_note else left
        ctx.state.outcome = outcome
        ctx.state.outcome_detail = detail
        ctx.enter(Phase.DONE)
        try:
            await ctx.update_ticket(note=ctx.closing_note, closing=True)
        except ActivityError as err:
            ctx.state.outcome_detail += f" (final ticket update failed: {failure_message(err)})"

    async def store_record(self) -> None:
        """The whole state stored as the run's record, named by ``record_ref`` (the result is bounded). Best
        effort: the run has ended, and a record it could not store leaves ``record_ref`` unset."""
        if self.ctx.patched(RUN_RECORD_PATCH):
            with contextlib.suppress(ActivityError):
                self.ctx.state.record_ref = await self.ctx.step(steps.RECORD_RUN, RecordRunInput(state=self.ctx.state))

    async def _cleanup(self) -> CleanupFact:
        """The run's cleanup, everywhere it holds something: what was removed and what remains."""
        ctx = self.ctx
        try:
            report = await ctx.step(steps.CLEANUP_RUN, CleanupRunInput(run_id=ctx.wf))
            unreachable = await self.envs.cleanup_hosts(report)
        except ActivityError as err:
            return CleanupFact(status=CleanupStatus.FAILED, errors=[failure_message(err)])
        wait = ctx.input.policy.host_start_s
        return CleanupFact(
            status=CleanupStatus.COMPLETE if report.complete and not unreachable else CleanupStatus.INCOMPLETE,
            removed=len(report.removed),
            remaining=[f"{r.kind}:{r.resource_id}" for r in report.remaining] + [f"host:{h}" for h in unreachable],
            errors=report.errors
            + [f"host {h} did not take its share of the cleanup within {wait:g} s" for h in unreachable],
        )
