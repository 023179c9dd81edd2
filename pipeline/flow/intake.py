"""Intake, up to the first repair attempt: the report (pinned at its trigger), the ticket, the reproduction
procedure (drafted by the model when the report has none), the environment spec, the report reproduced on the
base, and the recipe's tests on the base (the baseline).

A report with no reproduction has one drafted from its prose (DRAFTS_RUN_ON_BASE_PATCH): the spec first, then
what the drafter is told of the repository (the kinds its recipe can run, its files by name), then up to
:data:`DRAFT_ROUNDS` rounds of a draft run on the base, each draft that does not show the bug sent back to the
model with what its run found. The first draft that reproduces is the run's reproduction (its run on the base is
the base reproduction); when none does, the run ends in triage saying what the last one found."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from environments.diagnosis import Stage
    from environments.reproduction import ReproductionKind
    from pipeline import messages, steps
    from pipeline.failures import FailureClass, failure_class, failure_message
    from pipeline.flow.context import RunContext, RunEnded
    from pipeline.flow.environments import Environments
    from pipeline.flow.side_by_side import side_by_side
    from pipeline.ids import op_id
    from pipeline.patches import DRAFTS_RUN_ON_BASE_PATCH, PINNED_REPORT_PATCH
    from pipeline.state import (
        BaselineFact,
        DraftingFact,
        DraftRoundFact,
        Outcome,
        Phase,
        ReportEdit,
        ReproductionOutcome,
        TicketFact,
        TriageFact,
        TriageReason,
    )
    from pipeline.steps import (
        BaselineInput,
        BaselineResult,
        DraftContextInput,
        DraftProcedureInput,
        EnsureTicketInput,
        PrepareProcedureInput,
        PrepareSpecInput,
        ProcedureResult,
        ReadReportInput,
        ReportInfo,
    )
    from repair.procedure_draft import DraftRound

# How many drafts a report without a reproduction gets (each run on the base) before the run gives up.
DRAFT_ROUNDS = 3


class Intake:
    """The phases before the repair (see the module docstring), in the order :meth:`run` takes them."""

    def __init__(self, ctx: RunContext, envs: Environments) -> None:
        self.ctx = ctx
        self.envs = envs

    async def run(self) -> None:
        """Intake, ticket, procedure, provision and reproduce; the run ends here if the report does not
        reproduce on its base."""
        await self.prepare()
        await self.reproduce_base()

    async def prepare(self) -> None:
        """Intake, ticket, procedure and spec: everything the base reproduction and the baseline need."""
        await self.read_report()
        await self.open_ticket()
        await self.prepare_procedure()
        if self.ctx.spec_ref is None:  # a drafted reproduction needed it first
            await self.prepare_spec()

    def base_reproduced(self) -> bool:
        """Whether the base reproduction already ran (the accepted draft's run on the base is the run's)."""
        return self.ctx.state.drafting is not None and self.ctx.state.reproduction is not None

    async def read_report(self) -> ReportInfo:
        ctx = self.ctx
        inp = ctx.input
        ctx.enter(Phase.INTAKE)
        report = await ctx.step(
            steps.READ_REPORT,
            ReadReportInput(repository=inp.repository, issue_number=inp.issue_number, base_branch=inp.base_branch),
        )
        pinned = inp.report
        if pinned is not None and ctx.patched(PINNED_REPORT_PATCH):
            changed = [name for name in ("title", "body") if getattr(report, name) != getattr(pinned, name)]
            if changed and not any(e.source == "intake" for e in ctx.state.report_edits):
                ctx.state.report_edits.append(ReportEdit(editor="", fields=changed, at=ctx.now(), source="intake"))
            report = report.model_copy(update={"title": pinned.title, "body": pinned.body})
        ctx.report = report
        ctx.state.target_revision = report.base_revision
        return report

    async def open_ticket(self) -> None:
        ctx = self.ctx
        ctx.enter(Phase.TICKET)
        ticket_op = op_id(ctx.wf, "ticket")
        ticket = await ctx.step(
            steps.ENSURE_TICKET,
            EnsureTicketInput(
                op_id=ticket_op,
                repository=ctx.input.repository,
                issue_number=ctx.input.issue_number,
                title=ctx.the_report.title,
                body=messages.ticket_body(ctx.state),
            ),
        )
        ctx.state.ticket = TicketFact(
            op_id=ticket_op, issue_number=ticket.issue_number, comment_id=ticket.comment_id, url=ticket.url
        )

    async def prepare_procedure(self) -> None:
        ctx = self.ctx
        ctx.enter(Phase.PROCEDURE)
        procedure = await ctx.step(
            steps.PREPARE_PROCEDURE,
            PrepareProcedureInput(run_id=ctx.wf, report_body=ctx.the_report.body),
        )
        if procedure.procedure_ref is None and procedure.missing:
            if ctx.patched(DRAFTS_RUN_ON_BASE_PATCH):
                await self._draft_until_reproduced()
                return
            procedure = await self._draft_procedure()
        if procedure.procedure_ref is None:
            raise RunEnded(Outcome.NEEDS_HUMAN_TRIAGE, f"no usable reproduction procedure: {procedure.error}")
        ctx.procedure_ref = procedure.procedure_ref
        ctx.state.reproduction_kind = ReproductionKind(procedure.kind)
        ctx.state.reproduction_app = procedure.app
        ctx.record(procedure.procedure_ref)

    async def _draft_until_reproduced(self) -> None:
        """Draft a reproduction, run it on the base, and send it back with what its run found until one shows the
        bug (see the module docstring); the last run on the base is left in the state for :meth:`reproduce_base`,
        which ends the run when it did not reproduce."""
        ctx = self.ctx
        await self.prepare_spec()
        ctx.enter(Phase.PROCEDURE)
        context = await ctx.step(
            steps.DRAFT_CONTEXT,
            DraftContextInput(run_id=ctx.wf, op_id=op_id(ctx.wf, "draft-context"), spec_ref=ctx.spec),
        )
        drafting = ctx.state.drafting = DraftingFact(max_rounds=DRAFT_ROUNDS)
        previous: list[DraftRound] = []
        revision = ctx.the_report.base_revision
        for n in range(1, DRAFT_ROUNDS + 1):
            ctx.enter(Phase.PROCEDURE)
            draft = DraftProcedureInput(
                run_id=ctx.wf,
                op_id=op_id(ctx.wf, "draft-procedure", n),
                issue_title=ctx.the_report.title,
                issue_body=ctx.the_report.body,
                kinds=context.kinds,
                facts=context.facts,
                previous=previous,
            )
            drafted = await self._draft_procedure(draft)
            if drafted.procedure_ref is None:
                raise RunEnded(Outcome.NEEDS_HUMAN_TRIAGE, f"no usable reproduction procedure: {drafted.error}")
            ctx.procedure_ref = drafted.procedure_ref
            ctx.state.reproduction_kind = ReproductionKind(drafted.kind)
            ctx.state.reproduction_app = drafted.app
            ctx.record(drafted.procedure_ref)
            this = DraftRoundFact(
                round=n, procedure_ref=drafted.procedure_ref, kind=drafted.kind, described=drafted.described
            )
            drafting.rounds.append(this)
            found = await self.envs.reproduce_on(revision, None, f"draft-{n}", Phase.PROVISION, Phase.REPRODUCE)
            this.status, this.detail = found.status, found.detail
            ctx.state.reproduction = found
            if found.status == ReproductionOutcome.REPRODUCED:
                drafting.accepted = n
                return
            if found.status == ReproductionOutcome.APP_NOT_READY:
                return  # the environment, not the draft: no later draft could run either
            refusal = f"ran on the base revision {revision[:12]}: {found.status.value}: {found.detail}"
            previous.append(DraftRound(yaml=drafted.drafted_yaml, refusal=refusal))

    async def _draft_procedure(self, draft: DraftProcedureInput | None = None) -> ProcedureResult:
        """The report has no procedure block: ask the model to draft one from its prose (``draft``: the request,
        by default a browser procedure's as runs recorded before drafts ran on the base asked for it)."""
        ctx = self.ctx
        report = ctx.the_report
        try:
            drafted = await ctx.model_step(
                steps.DRAFT_PROCEDURE,
                draft
                or DraftProcedureInput(
                    run_id=ctx.wf,
                    op_id=op_id(ctx.wf, "draft-procedure"),
                    issue_title=report.title,
                    issue_body=report.body,
                ),
            )
        except ActivityError as err:
            ctx.count_tokens(err)
            if failure_class(err) not in (FailureClass.PROCEDURE_INVALID, FailureClass.PERMANENT, FailureClass.BUDGET):
                raise
            return ProcedureResult(procedure_ref=None, error=failure_message(err))
        ctx.state.budgets.model_prompt_tokens += drafted.prompt_tokens
        ctx.state.budgets.model_completion_tokens += drafted.completion_tokens
        return drafted

    async def prepare_spec(self) -> None:
        ctx = self.ctx
        report = ctx.the_report
        ctx.enter(Phase.PROVISION)
        spec_ref = await ctx.step(
            steps.PREPARE_SPEC,
            PrepareSpecInput(
                run_id=ctx.wf,
                op_id=op_id(ctx.wf, "spec"),
                repository=ctx.input.repository,
                clone_url=report.clone_url,
                base_revision=report.base_revision,
            ),
        )
        ctx.spec_ref = spec_ref
        ctx.record(spec_ref)

    async def reproduce_base(self, *, beside: bool = False) -> None:
        """The base environment is provisioned in PROVISION and the procedure runs in REPRODUCE (both again if
        the environment dies under the reproduction); ``beside`` the baseline (see
        :meth:`~pipeline.flow.environments.Environments.reproduce_on`)."""
        ctx = self.ctx
        revision = ctx.the_report.base_revision
        drafting = ctx.state.drafting
        if self.base_reproduced():
            assert ctx.state.reproduction is not None
            base = ctx.state.reproduction  # the last draft's run on the base
        else:
            base = await self.envs.reproduce_on(revision, None, "base", Phase.PROVISION, Phase.REPRODUCE, beside=beside)
        ctx.state.reproduction = base
        if base.status == ReproductionOutcome.APP_NOT_READY:
            # The procedure never ran: no verdict on the report, but a recipe (or worker) to fix.
            # The hint, the command and its log are the triage fact's, said on the ticket and by `durafix status`.
            # The reproduction's detail (the provider's own words, the log's tail among them: what a repair agent
            # is told when its candidate's app does not start) is not quoted on the ticket when the command is known.
            failure = base.environment_failure
            ctx.state.triage = TriageFact(reason=TriageReason.ENVIRONMENT_NOT_SET_UP, environment=failure)
            said = base.detail if failure is None else messages.failed_command_text(failure)
            if failure is not None and failure.log_ref is not None:
                said += f"; its output is in {failure.log_ref.name}"
            raise RunEnded(
                Outcome.NEEDS_HUMAN_TRIAGE,
                f"the environment could not be set up on {revision[:12]}, so the report was not tried: {said}",
            )
        if base.status != ReproductionOutcome.REPRODUCED:
            reason = (
                TriageReason.INCONCLUSIVE
                if base.status == ReproductionOutcome.INCONCLUSIVE
                else TriageReason.NOT_REPRODUCED
            )
            ctx.state.triage = TriageFact(reason=reason)
            if drafting is not None:
                raise RunEnded(
                    Outcome.NEEDS_HUMAN_TRIAGE,
                    f"none of the {len(drafting.rounds)} reproductions drafted from the report showed the bug on "
                    f"{revision[:12]}; the last, {drafting.rounds[-1].described}: {base.status} ({base.detail})",
                )
            raise RunEnded(
                Outcome.NEEDS_HUMAN_TRIAGE,
                f"the report did not reproduce on {revision[:12]}: {base.status} ({base.detail})",
            )

    async def checks_on_base(self) -> None:
        """The base reproduction beside the baseline (:mod:`pipeline.flow.side_by_side`), with the verdicts of
        runs that ran them one after the other: the first to fail cancels the other and ends the run, except a
        baseline whose setup failed. That one is the base reproduction's setup too, which says what is broken
        (the environment's own log, ``environment.log``, and the cause): it is held, records nothing and cancels
        nothing; when the base reproduction fails (or ends the run otherwise) the baseline stays unrecorded, and
        when it reproduced, the held baseline is recorded and ends the run as it would have after it."""
        held: list[BaselineResult] = []

        async def baseline() -> None:
            result = await self.baseline(beside=True)
            if result is not None:
                held.append(result)

        await side_by_side(self.ctx, {"base reproduction": self.reproduce_base(beside=True), "baseline": baseline()})
        for result in held:
            self.judge_baseline(result)

    async def baseline(self, *, beside: bool = False) -> BaselineResult | None:
        """The recipe's tests on the base: a run whose tests cannot run, or fail before any change, ends in
        triage before the model is asked for anything (a fix could not be judged against them). ``beside``: run
        beside the base reproduction, whose phase the run shows (the baseline enters none of its own); a result
        whose setup failed is then returned unjudged and unrecorded (:meth:`checks_on_base` says why), every
        other is judged here (None)."""
        ctx = self.ctx
        if not beside:
            ctx.enter(Phase.BASELINE)
        baseline_op = op_id(ctx.wf, "baseline")
        result = await ctx.step(steps.RUN_BASELINE, BaselineInput(run_id=ctx.wf, op_id=baseline_op, spec_ref=ctx.spec))
        if beside and setup_failed(result):
            return result
        self.judge_baseline(result)
        return None

    def judge_baseline(self, result: BaselineResult) -> None:
        """Record the baseline ``result`` (its log among the run's evidence) and end the run in triage when its
        tests cannot run, or fail without per-test results."""
        ctx = self.ctx
        baseline_op = op_id(ctx.wf, "baseline")
        ctx.record(result.test_output_ref)
        ctx.state.baseline = BaselineFact(op_id=baseline_op, **result.model_dump(exclude={"environment_failure"}))
        base = ctx.the_report.base_revision[:12]
        if result.runnable and (result.passed or result.cases_ref is not None):
            # With per-test results a failing base is no obstacle: a candidate must only fail no other test.
            return
        ctx.enter(Phase.BASELINE)  # the run ends in the baseline's phase, also when it ran beside the reproduction
        if not result.runnable:
            ctx.state.triage = TriageFact(
                reason=TriageReason.ENVIRONMENT_NOT_SET_UP, environment=result.environment_failure
            )
            raise RunEnded(
                Outcome.NEEDS_HUMAN_TRIAGE,
                f"the recipe's tests cannot run on the base revision {base}: {result.summary}; "
                "fix `setup`/`test` in durafix.yaml",
            )
        ctx.state.triage = TriageFact(reason=TriageReason.BASELINE_FAILS, environment=result.environment_failure)
        raise RunEnded(
            Outcome.NEEDS_HUMAN_TRIAGE,
            f"the recipe's tests already fail on the base revision {base} ({result.summary}); a fix is judged "
            "against a passing baseline, or per test with a `test_report` (JUnit XML) named in durafix.yaml",
        )


def setup_failed(result: BaselineResult) -> bool:
    """Whether the baseline could not run because the recipe's setup failed (not its tests)."""
    failed = result.environment_failure
    return not result.runnable and failed is not None and failed.stage == Stage.SETUP.value
