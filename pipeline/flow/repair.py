"""The repair phase: bounded attempts, each proposing a patch by one of three engines (the stepped agent, the
external agent command, or the one-shot ``model.propose_patch`` of runs recorded before the stepped agent),
each verified; the first candidate that passes is the run's."""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from environments.reproduction import ReproductionKind
    from evidence.interface import ArtifactRef
    from pipeline import accounting, steps
    from pipeline.failures import FailureClass, failure_class, failure_message
    from pipeline.flow.agent import SteppedAgent
    from pipeline.flow.attempt_carry import AttemptSpec
    from pipeline.flow.context import RunContext, RunEnded, detail_ref
    from pipeline.flow.verify import Verify
    from pipeline.ids import op_id
    from pipeline.patches import COMMAND_ENGINE_PATCH, REPRODUCTION_SEED_PATCH, STEPPED_AGENT_PATCH
    from pipeline.state import CandidateFact, Outcome, Phase, ReproductionSeedFact
    from pipeline.steps import AgentCommandInput, ProposalResult, ProposePatchInput, ReproductionSeedInput
    from repair.context import EarlierAttempt


P = TypeVar("P", bound=ProposePatchInput)


class Engine(StrEnum):
    """Which engine proposes a run's patches (decided once per run, at the start of the repair phase)."""

    STEPPED = "stepped"
    COMMAND = "command"
    ONE_SHOT = "one-shot"


class Repair:
    """The repair phase (see the module docstring)."""

    def __init__(self, ctx: RunContext, agent: SteppedAgent, verify: Verify) -> None:
        self.ctx = ctx
        self.agent = agent
        self.verify = verify

    def _engine(self) -> Engine:
        # Both patches are asked in this order, as they always were (the stepped one first, unconditionally).
        stepped = self.ctx.patched(STEPPED_AGENT_PATCH)
        if self.ctx.input.policy.engine == "command" and self.ctx.patched(COMMAND_ENGINE_PATCH):
            return Engine.COMMAND
        return Engine.STEPPED if stepped else Engine.ONE_SHOT

    async def run(self) -> CandidateFact:
        """Attempts until one passes verification, or the run ends ``repair-budget-exhausted``."""
        budgets = self.ctx.state.budgets
        # Each refused attempt: its patch summary and why (the next attempt's first message says both).
        failures: list[EarlierAttempt] = []
        engine = self._engine()
        await self._seed()
        for attempt in range(1, budgets.repair_attempts_max + 1):
            candidate = await self._attempt(engine, attempt, failures)
            if candidate is not None:
                return candidate
        raise RunEnded(
            Outcome.REPAIR_BUDGET_EXHAUSTED,
            f"{budgets.repair_attempts_max} repair attempt(s) failed verification: "
            + "; ".join(f.line() for f in failures),
        )

    async def _attempt(self, engine: Engine, attempt: int, failures: list[EarlierAttempt]) -> CandidateFact | None:
        """Attempt ``attempt``: its verified candidate, or None (why is added to ``failures``)."""
        ctx = self.ctx
        budgets = ctx.state.budgets
        spent = budgets.model_prompt_tokens + budgets.model_completion_tokens
        if spent >= budgets.model_token_budget:
            raise RunEnded(
                Outcome.REPAIR_BUDGET_EXHAUSTED,
                f"model token budget spent ({spent} >= {budgets.model_token_budget})",
            )
        ctx.enter(Phase.REPAIR)
        budgets.repair_attempts_used = attempt
        repair_op = op_id(ctx.wf, "repair", attempt)
        try:
            proposal = await self._propose(engine, attempt, repair_op, failures, budgets.model_token_budget - spent)
        except ActivityError as err:
            failures.append(EarlierAttempt(attempt=attempt, reason=self._refused(err)))
            return None
        if engine == Engine.ONE_SHOT:  # the stepped and command attempts charged their own tokens
            budgets.model_prompt_tokens += proposal.prompt_tokens
            budgets.model_completion_tokens += proposal.completion_tokens
        candidate = self.verify.proposed(attempt, repair_op, proposal)
        failure = await self.verify.judge_new(candidate)
        if failure is None:
            return candidate
        failures.append(EarlierAttempt(attempt=attempt, summary=candidate.summary, reason=failure))
        return None

    async def _seed(self) -> None:
        """A test reproduction's files, written on the base once (``env.reproduction_seed``), as the patch the
        attempts start from; recorded in the run's state. Only runs with a test reproduction ask for the patch,
        so every other run issues the commands it always did."""
        ctx = self.ctx
        if ctx.state.reproduction_kind != ReproductionKind.TEST or ctx.state.reproduction_seed is not None:
            return
        if not ctx.patched(REPRODUCTION_SEED_PATCH):
            return
        assert ctx.procedure_ref is not None
        seed_op = op_id(ctx.wf, "reproduction-seed")
        seeded = await ctx.step(
            steps.REPRODUCTION_SEED,
            ReproductionSeedInput(run_id=ctx.wf, op_id=seed_op, spec_ref=ctx.spec, procedure_ref=ctx.procedure_ref),
        )
        if seeded.patch_ref is not None:
            ctx.record(seeded.patch_ref)
            ctx.state.reproduction_seed = ReproductionSeedFact(
                op_id=seed_op, patch_ref=seeded.patch_ref, files=seeded.files, tests=seeded.tests
            )

    def _start_patch(self) -> ArtifactRef | None:
        """Where an attempt starts: the reproduction's test files when the run has them, else the base."""
        seed = self.ctx.state.reproduction_seed
        return seed.patch_ref if seed is not None else None

    def _refused(self, err: ActivityError) -> str:
        """Why a failed proposal leaves no candidate (the next attempt is told); re-raised unless it is the
        attempt's failure (no usable patch, a permanent refusal); the budget spent ends the run."""
        budgets = self.ctx.state.budgets
        kind = failure_class(err)
        self.ctx.count_tokens(err)
        if kind == FailureClass.BUDGET:
            raise RunEnded(Outcome.REPAIR_BUDGET_EXHAUSTED, failure_message(err)) from err
        if kind not in (FailureClass.NO_PATCH, FailureClass.PERMANENT):
            raise err
        if kind == FailureClass.NO_PATCH:
            accounting.count_no_patch(budgets, err)
        return f"no usable patch ({failure_message(err)})"

    async def _propose(
        self, engine: Engine, attempt: int, repair_op: str, failures: list[EarlierAttempt], token_budget: int
    ) -> ProposalResult:
        ctx = self.ctx
        if engine == Engine.COMMAND:
            return await self._command(attempt, repair_op, [f.line() for f in failures], token_budget)
        if engine == Engine.STEPPED:
            return await self.agent.attempt(
                AttemptSpec(
                    attempt=attempt,
                    repair_op=repair_op,
                    failures=list(failures),
                    token_budget=token_budget,
                    start_patch=self._start_patch(),
                )
            )
        return await ctx.step(
            steps.PROPOSE_PATCH,
            self._input(ProposePatchInput, attempt, repair_op, [f.line() for f in failures], token_budget),
        )

    def _input(self, kind: type[P], attempt: int, repair_op: str, failures: list[str], token_budget: int) -> P:
        """What an attempt of the one-shot or the command engine is given."""
        ctx = self.ctx
        report = ctx.the_report
        return kind(
            run_id=ctx.wf,
            op_id=repair_op,
            attempt=attempt,
            spec_ref=ctx.spec,
            issue_title=report.title,
            issue_body=report.body,
            previous_failures=failures,
            token_budget=token_budget,
        )

    async def _command(self, attempt: int, repair_op: str, failures: list[str], token_budget: int) -> ProposalResult:
        """One repair attempt by the external agent CLI: one ``model.agent_command`` activity, whose proposal
        passed the same patch policy as the built-in engine's and goes through the same verification. Its
        tokens are charged here (a failure's by the caller, from the failure's details), as the stepped
        attempt charges its turns, so the caller charges nothing more for a run that took this branch. What the
        CLI printed is stored (redacted) and recorded in the run's evidence, whether the attempt failed or not."""
        ctx = self.ctx
        try:
            proposal = await ctx.step(
                steps.AGENT_COMMAND, self._input(AgentCommandInput, attempt, repair_op, failures, token_budget)
            )
        except ActivityError as err:
            if (log_ref := detail_ref(err, "log_ref")) is not None:
                ctx.record(log_ref)
            raise
        accounting.charge_proposal(ctx.state.budgets, attempt, proposal)
        if proposal.log_ref is not None:
            ctx.record(proposal.log_ref)
        return proposal
