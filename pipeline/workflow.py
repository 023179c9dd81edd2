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
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, CancelledError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel

    from environments.interface import EnvironmentHandle
    from environments.regression import ProofStatus
    from evidence.interface import ArtifactRef
    from pipeline import accounting, messages, revisions, steps
    from pipeline.failures import FailureClass, failure_class, failure_details, failure_kind, failure_message
    from pipeline.ids import branch_for, op_id
    from pipeline.inputs import ApprovalAck, RepairInput
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
        EnvironmentFact,
        EnvironmentState,
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
        ReadPullInput,
        ReadReportInput,
        ReadReviewInput,
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

CANCELLATION_PATCH = "cancellation-state-machine"
# A cancellation requested while an activity runs wins even when that activity then completes normally (it
# never heard of the cancellation: no heartbeat carried it back before it finished). Without this the run
# took the late result and went on as if never cancelled, up to the review wait.
LATE_COMPLETION_PATCH = "cancellation-wins-over-late-completion"
# The recipe's tests run once on the base revision before any repair attempt (runs recorded before it had no
# baseline, and replay without one).
BASELINE_PATCH = "baseline-tests"
# The ticket is updated when the run starts waiting for a review (runs recorded before left it at publish).
REVIEW_TICKET_PATCH = "ticket-at-review-wait"
# A run started with the report pinned at the trigger works on that text; an edit (seen at intake, or
# signalled by the receiver) is noted on the ticket, which is updated when the signal arrives.
PINNED_REPORT_PATCH = "report-pinned-at-trigger"
# The merge activity merges only on an approval the forge holds (or an allowed operator approval); when it
# finds none, the run says so on the PR and the ticket and waits for a review again.
REVIEW_ON_FORGE_PATCH = "approval-authority-on-forge"
# A repair attempt is a sequence of recorded steps (model turn, tool batch, ..., conclusion) instead of one
# ``model.propose_patch`` activity holding the conversation in memory (runs recorded before replay with it).
STEPPED_AGENT_PATCH = "stepped-agent"
# The stepped attempt offers the run tools (run_tests, run, run_reproduction), carried out in the sandbox;
# runs recorded before offered the workspace tools only.
AGENT_RUN_TOOLS_PATCH = "agent-run-tools"
# A model step whose every try failed on the transport (429, 5xx, a timeout) is waited out on a durable timer
# and sent again, up to the policy's outage allowance, instead of ending the run (runs recorded before ended
# in triage at the first such failure, and replay that way).
MODEL_OUTAGE_PATCH = "model-outage-waited-out"
# A permitted reviewer's request for changes starts a revision on top of the head under review (while the
# revision budget lasts) instead of rejecting; runs recorded before replay such a request as a rejection.
REVISIONS_PATCH = "revisions-on-review"
# A run whose policy names the external agent engine (``engine: command``) makes each attempt one
# ``model.agent_command`` activity (runs recorded before it knew no such engine).
COMMAND_ENGINE_PATCH = "command-engine"


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
        self._cancellation_v2 = True
        self._ending = False
        # Said on the ticket until the end: the final update rewrites the same comment.
        self._closing_note = ""
        # Ticket updates from a signal handler and from the run never interleave: each body is computed
        # when its turn comes, so the last write carries the latest state. Uncontended, it never yields.
        self._ticket_lock = asyncio.Lock()
        # Said on the ticket while the run waits again for a review after an approval that did not stand.
        self._review_note = ""

    # ---- queries, updates, signals ------------------------------------------------------------------

    # The handlers are registered under their method names ("state", "approve", "reject"), which recorded
    # histories and running clients use: never rename them. Clients call them by method reference.
    @workflow.query
    def state(self) -> RunState:
        return self._state

    @workflow.update
    async def approve(self, approval: Approval) -> ApprovalAck:
        """Record an approval. Idempotent: the same approval delivered twice is acknowledged once."""
        if self._approval is not None and self._approval.head_sha == approval.head_sha:
            return ApprovalAck(accepted=True, detail="approval already recorded for this head")
        self._approval = approval
        return ApprovalAck(accepted=True, detail=f"approved {approval.head_sha} by {approval.reviewer}")

    @approve.validator
    def _validate_approve(self, approval: Approval) -> None:
        """Refuse (before it enters history) an approval that names anything but what awaits review."""
        if self._approval is not None and self._approval.head_sha == approval.head_sha:
            return
        pending = self._state.pending_approval
        if pending is None or self._state.phase != Phase.AWAITING_REVIEW:
            raise ValueError(f"run is not awaiting review (phase {self._state.phase})")
        if approval.pr_number is not None and approval.pr_number != pending.pr_number:
            raise ValueError(f"approval is of PR #{approval.pr_number}, but this run's PR is #{pending.pr_number}")
        if approval.head_sha != pending.head_sha:
            raise ValueError(f"approval names {approval.head_sha} but the PR awaits review of {pending.head_sha}")
        if approval.expires_at is not None and approval.expires_at <= workflow.now():
            raise ValueError(f"approval expired at {approval.expires_at.isoformat()}")
        if approval.evidence_digest is not None and approval.evidence_digest != pending.evidence_digest:
            raise ValueError(
                f"approval names evidence {approval.evidence_digest} but the PR carries {pending.evidence_digest}"
            )

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
            raise asyncio.CancelledError()
        return self._state

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
                else op_id(wf, "verify", candidate.attempt),
                spec_ref=self._spec_ref,
                patch_ref=candidate.patch_ref,
                message=self._commit_message(report, candidate),
                commit_timestamp=candidate.commit_timestamp,
                baseline_cases_ref=self._state.baseline.cases_ref if self._state.baseline else None,
                parent_commit=candidate.parent_commit,
            ),
        )
        candidate.commit = verified.commit
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
        if not verified.tests_passed:
            return f"tests failed: {verified.test_summary}"
        proof = verified.regression
        if self._input.policy.require_regression_test and (proof is None or proof.status != ProofStatus.PROVEN):
            said = proof.summary if proof else "no regression proof was run"
            return (
                f"no regression test: {said}; the policy asks for a test that fails on the base and passes with the fix"
            )
        label = f"revision-{candidate.revision}" if candidate.revision else f"candidate-{candidate.attempt}"
        replay = await self._reproduce_on(verified.commit, candidate.patch_ref, label, Phase.VERIFY, Phase.VERIFY)
        candidate.replay = replay
        if replay.status == ReproductionOutcome.REPRODUCED:
            return "the bug still reproduces on the candidate"
        if replay.status != ReproductionOutcome.NOT_REPRODUCED:
            return f"replay on the candidate was {replay.status}: {replay.detail}"
        return None

    # ---- environments and reproduction --------------------------------------------------------------

    async def _reproduce_on(
        self, revision: str, patch_ref: ArtifactRef | None, label: str, provisioning: Phase, reproducing: Phase
    ) -> ReproductionFact:
        """Provision (in phase ``provisioning``), reproduce (in ``reproducing``), tear down. An environment
        found dead is provisioned anew, once."""
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
            )
            repro_op = op_id(wf, f"reproduce-{label}", env_attempt)
            self._enter(reproducing)
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
                )
            except ActivityError as err:
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
        await self._step(steps.TEARDOWN, handle)
        self._live_envs.pop(handle.env_id, None)
        if self._state.environment is not None and self._state.environment.env_id == handle.env_id:
            self._state.environment.last_status = EnvironmentState.TORN_DOWN

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
            base_revision=report.base_revision,
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
        while True:
            self._enter(Phase.AWAITING_REVIEW)
            self._state.pending_approval = ApprovalRequest(
                pr_number=publish.pr_number,
                head_sha=head,
                evidence_digest=publish.evidence_digest,
                requested_at=workflow.now(),
            )
            if workflow.patched(REVIEW_TICKET_PATCH):
                await self._update_ticket(note=self._review_note)
            try:
                await workflow.wait_condition(
                    lambda: (
                        self._approval is not None or self._rejection is not None or self._revision_request is not None
                    ),
                    timeout=timedelta(seconds=self._input.policy.review_timeout_s),
                )
            except TimeoutError:
                return Outcome.REJECTED, "no review before the review deadline"
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
            head = current.head_sha
            self._approval = None
            self._state.approval = None
            await self._update_ticket(note=f"the PR head moved to {head[:12]} after approval; renewed review needed")

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
            self._state.cleanup = CleanupFact(
                status=CleanupStatus.COMPLETE if report.complete else CleanupStatus.INCOMPLETE,
                removed=len(report.removed),
                remaining=[f"{r.kind}:{r.resource_id}" for r in report.remaining],
                errors=report.errors,
            )
        except ActivityError as err:
            self._state.cleanup = CleanupFact(status=CleanupStatus.FAILED, errors=[failure_message(err)])
        if not self._state.cleanup.complete:
            detail = f"{outcome.value}: {detail}; cleanup left {self._state.cleanup.remaining or 'unknown resources'}"
            outcome = Outcome.CLEANUP_INCOMPLETE
        self._state.outcome = outcome
        self._state.outcome_detail = detail
        self._enter(Phase.DONE)
        try:
            await self._update_ticket(note=self._closing_note)
        except ActivityError as err:
            self._state.outcome_detail += f" (final ticket update failed: {failure_message(err)})"

    async def _update_ticket(self, note: str = "") -> None:
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
                ),
            )

    # ---- helpers ------------------------------------------------------------------------------------

    def _enter(self, phase: Phase) -> None:
        if self._state.phase != phase:
            self._state.phase = phase
            self._state.timeline.append(PhaseMark(phase=phase, at=workflow.now()))

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

    async def _step(self, step: Step[In, Out], arg: In) -> Out:
        """Run ``step`` with its declared queue, timeouts and output type (see :mod:`pipeline.steps`)."""
        timeouts = self._input.policy.timeouts(step.timeouts)
        result: Out = await workflow.execute_activity(
            step.name,
            arg,
            task_queue=step.queue.value,
            result_type=step.output,
            schedule_to_start_timeout=timedelta(seconds=timeouts.schedule_to_start),
            start_to_close_timeout=timedelta(seconds=timeouts.start_to_close),
            schedule_to_close_timeout=timedelta(seconds=timeouts.schedule_to_close),
            heartbeat_timeout=timedelta(seconds=timeouts.heartbeat) if timeouts.heartbeat else None,
            retry_policy=timeouts.retry_policy(),
            cancellation_type=(
                ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
                if self._cancellation_v2 and step.waits_for_cancellation
                else ActivityCancellationType.TRY_CANCEL
            ),
        )
        if self._cancel_requested():
            raise asyncio.CancelledError()
        return result


def _detail_ref(err: BaseException, key: str) -> ArtifactRef | None:
    """The artifact an activity's failure names in its details under ``key`` (``None`` when it names none)."""
    for detail in failure_details(err):
        if isinstance(detail, dict) and isinstance(detail.get(key), dict):
            return ArtifactRef.model_validate(detail[key])
    return None
