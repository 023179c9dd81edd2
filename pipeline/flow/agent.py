"""The stepped agent: one repair attempt (or revision) as recorded steps: model turn, tool batch, ..., then
the conclusion.

The transcript and the patch so far travel between the steps as stored references, so each completed step is
in the history and is never run again: a worker lost mid-step costs only that step (a model turn re-sends its
one request; a tool batch re-runs on base + the patch before it)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from evidence.interface import ArtifactRef
    from pipeline import accounting, steps
    from pipeline.flow.attempt_carry import (
        ATTEMPT_STEP_FAILED,
        AttemptInput,
        AttemptOutcome,
        AttemptSpec,
        attempt_state,
        take_back,
    )
    from pipeline.flow.context import RunContext, RunEnded
    from pipeline.flow.environments import Environments
    from pipeline.patches import AGENT_RUN_TOOLS_PATCH, ATTEMPT_CHILD_PATCH
    from pipeline.state import Outcome, Phase, ReproductionOutcome
    from pipeline.steps import (
        AGENT_MAX_TURNS,
        AgentConcludeInput,
        AgentRecordInput,
        AgentRunInput,
        AgentToolCall,
        AgentToolResult,
        AgentToolsInput,
        AgentTurnInput,
        AgentWorkspaceInput,
        ProposalResult,
    )
    from repair.stepping import Segment, ToolCall, segments
    from repair.tools import RUN_REPRODUCTION, RUN_TOOLS, WORKSPACE_TOOLS


@dataclass
class _Progress:
    """An attempt's state between its steps."""

    transcript: ArtifactRef | None = None
    patch: ArtifactRef | None = None
    prompt: int = 0
    completion: int = 0
    model: str = ""
    summary: str | None = None
    turn: int = 0
    tools: list[str] | None = field(default=None)


class SteppedAgent:
    """The stepped engine (see the module docstring)."""

    def __init__(self, ctx: RunContext, envs: Environments) -> None:
        self.ctx = ctx
        self.envs = envs

    async def attempt(self, spec: AttemptSpec) -> ProposalResult:
        """Run the attempt to its conclusion. Tokens are charged to the run after every turn (a failed turn's
        through its failure, by the caller). The run ends ``repair-budget-exhausted`` when the attempt uses all
        its turns; a step's failure propagates as the ``ActivityError`` the caller judges.

        New runs run it as a child workflow (:mod:`pipeline.flow.attempt_carry`), with the same steps, outcome
        and charges as here; runs recorded before ran it in their own history, and replay so."""
        if self.ctx.patched(ATTEMPT_CHILD_PATCH):
            return await self._in_child(spec)
        return await self.attempt_here(spec)

    async def _in_child(self, spec: AttemptSpec) -> ProposalResult:
        """:meth:`attempt_here` in the child workflow ``repair_attempt``; what it changed of the run's state is
        taken back whichever way it ended, then it ends here as it ended there."""
        ctx = self.ctx
        carried = ctx.carried() | {"state": attempt_state(ctx.state)}
        inp = AttemptInput(run=ctx.input.model_copy(update={"resume": None}), order=spec, **carried)
        try:
            outcome = await ctx.attempt_in_child(inp)
        except ChildWorkflowError as err:
            wrapper = err.cause
            if not (isinstance(wrapper, ApplicationError) and wrapper.type == ATTEMPT_STEP_FAILED):
                raise
            self._take_back(AttemptOutcome.model_validate(wrapper.details[0]))
            step_failure = wrapper.__cause__
            if isinstance(step_failure, ActivityError):
                # Its cause chain is what the caller judges (the step's own failure): kept as it came.
                raise step_failure from step_failure.__cause__
            raise
        self._take_back(outcome)
        if outcome.cancelled:
            raise asyncio.CancelledError()
        if outcome.ended is not None:
            raise RunEnded(outcome.ended, outcome.ended_detail)
        assert outcome.proposal is not None
        return outcome.proposal

    def _take_back(self, outcome: AttemptOutcome) -> None:
        """What the attempt changed of the run's state (:func:`~pipeline.flow.attempt_carry.take_back`), and
        the hosts and environments it holds."""
        ctx = self.ctx
        take_back(ctx.state, outcome.state)
        ctx.hosts[:] = outcome.hosts
        ctx.live_envs.clear()
        ctx.live_envs.update(outcome.live_envs)
        ctx.record_state()

    async def attempt_here(self, spec: AttemptSpec) -> ProposalResult:
        """:meth:`attempt` in this workflow's own history (the child's, or a run recorded before children)."""
        ctx = self.ctx
        tools = [*WORKSPACE_TOOLS, *RUN_TOOLS] if ctx.patched(AGENT_RUN_TOOLS_PATCH) else None
        progress = _Progress(patch=spec.start_patch, tools=tools)
        while progress.summary is None:
            if progress.turn >= AGENT_MAX_TURNS:
                raise RunEnded(
                    Outcome.REPAIR_BUDGET_EXHAUSTED,
                    f"attempt {spec.attempt}: the model used all {AGENT_MAX_TURNS} turns without finishing",
                )
            await self._turn(spec, progress)
        return await ctx.step(
            steps.AGENT_CONCLUDE,
            AgentConcludeInput(
                run_id=ctx.wf,
                op_id=spec.repair_op,
                attempt=spec.attempt,
                spec_ref=ctx.spec,
                patch_ref=progress.patch,
                transcript_ref=progress.transcript,
                summary=progress.summary,
                prompt_tokens=progress.prompt,
                completion_tokens=progress.completion,
                model=progress.model,
            ),
        )

    async def _turn(self, spec: AttemptSpec, progress: _Progress) -> None:
        """One model turn and the calls it made."""
        ctx = self.ctx
        report = ctx.the_report
        progress.turn += 1
        turn = progress.turn
        baseline = ctx.state.baseline
        answer = await ctx.model_step(
            steps.AGENT_TURN,
            AgentTurnInput(
                run_id=ctx.wf,
                op_id=f"{spec.repair_op}:turn-{turn}",
                attempt=spec.attempt,
                turn=turn,
                issue_title=report.title,
                issue_body=report.body,
                previous_failures=[f.line() for f in spec.failures],
                transcript_ref=progress.transcript,
                token_budget=spec.token_budget - progress.prompt - progress.completion,
                tools=progress.tools,
                patch_ref=progress.patch,
                compact_above_chars=ctx.input.policy.agent_compact_chars if progress.tools is not None else None,
                revision=spec.revision,
                review_feedback=spec.review_feedback,
                spec_ref=ctx.spec,
                reproduction=ctx.state.reproduction,
                baseline_summary=baseline.summary if baseline else None,
                earlier_attempts=spec.failures,
                seed_tests=ctx.state.reproduction_seed.tests if ctx.state.reproduction_seed else [],
            ),
            spec.attempt,
        )
        progress.prompt += answer.prompt_tokens
        progress.completion += answer.completion_tokens
        accounting.charge_turn(ctx.state.budgets, spec.attempt, turn, answer)
        progress.model = answer.model
        progress.transcript = answer.transcript_ref
        if not answer.calls:
            progress.summary = answer.summary or "(the model gave no summary)"
            return
        await self._calls(spec, progress, answer.calls, answer.transcript_ref)

    async def _calls(
        self, spec: AttemptSpec, progress: _Progress, calls: list[AgentToolCall], transcript: ArtifactRef
    ) -> None:
        """Carry out one turn's calls in order, each segment where it runs (:func:`repair.stepping.segments`):
        workspace tools as one ``model.agent_tools`` batch, ``run_tests``/``run`` as ``env.agent_run`` in the
        sandbox, ``run_reproduction`` as the run's own reproduction on base + the patch so far. Each segment
        is a recorded step that sees every edit before it; the transcript, the patch and the summary after.
        Without run tools offered (runs recorded before) every call goes to one batch, as then."""
        tool_calls = [ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in calls]
        cut = segments(tool_calls) if progress.tools is not None else [Segment(None, tool_calls)]
        progress.transcript = transcript
        summary: str | None = None
        for k, segment in enumerate(cut, 1):
            part = [AgentToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in segment.calls]
            # One segment keeps the operation ID of the whole batch, as before the run tools existed.
            suffix = "" if len(cut) == 1 else f"-{k}"
            if segment.run is None:
                said = await self._tools(spec, progress, part, suffix)
                summary = said if said is not None else summary
            elif segment.run == RUN_REPRODUCTION:
                await self._reproduction(spec, progress, part[0], k)
            else:
                await self._run(spec, progress, part[0], k)
        progress.summary = summary

    async def _tools(
        self, spec: AttemptSpec, progress: _Progress, part: list[AgentToolCall], suffix: str
    ) -> str | None:
        ctx = self.ctx
        where = self._workspace(spec, progress, f"{spec.repair_op}:tools-{progress.turn}{suffix}")
        ran = await ctx.step(steps.AGENT_TOOLS, AgentToolsInput(**dict(where), calls=part))
        accounting.count_tools(ctx.state.budgets, spec.attempt, ran)
        progress.transcript, progress.patch = ran.transcript_ref, ran.patch_ref
        return ran.summary

    def _workspace(self, spec: AttemptSpec, progress: _Progress, step_op: str) -> AgentWorkspaceInput:
        """Where the turn's step ``step_op`` works: base + the patch so far, with the transcript so far."""
        assert progress.transcript is not None
        return AgentWorkspaceInput(
            run_id=self.ctx.wf,
            op_id=step_op,
            attempt=spec.attempt,
            turn=progress.turn,
            spec_ref=self.ctx.spec,
            transcript_ref=progress.transcript,
            patch_ref=progress.patch,
        )

    async def _reproduction(self, spec: AttemptSpec, progress: _Progress, call: AgentToolCall, k: int) -> None:
        ctx = self.ctx
        assert progress.transcript is not None
        content = await self._reproduce(spec.attempt, progress.turn, k, progress.patch)
        progress.transcript = await ctx.step(
            steps.AGENT_RECORD,
            AgentRecordInput(
                run_id=ctx.wf,
                attempt=spec.attempt,
                turn=progress.turn,
                transcript_ref=progress.transcript,
                results=[AgentToolResult(id=call.id, content=content)],
            ),
        )

    async def _run(self, spec: AttemptSpec, progress: _Progress, call: AgentToolCall, k: int) -> None:
        ctx = self.ctx
        where = self._workspace(spec, progress, f"{spec.repair_op}:run-{progress.turn}-{k}")
        done = await ctx.step(steps.AGENT_RUN, AgentRunInput(**dict(where), call=call))
        progress.transcript = done.transcript_ref
        accounting.count_invalid(ctx.state.budgets, spec.attempt, int(done.refused))
        if done.output_ref is not None:
            ctx.record(done.output_ref)

    async def _reproduce(self, attempt: int, turn: int, k: int, patch: ArtifactRef | None) -> str:
        """The report's procedure on the app built from base + ``patch``, told as a tool result. An app that
        keeps dying is a finding for the model here, not the end of the run."""
        label = f"agent-{attempt}-{turn}-{k}"
        try:
            fact = await self.envs.reproduce_on(
                self.ctx.the_report.base_revision, patch, label, Phase.REPAIR, Phase.REPAIR
            )
        except RunEnded as ended:
            return f"error: the reproduction could not run: {ended.detail}"
        self.ctx.enter(Phase.REPAIR)
        shown = {
            ReproductionOutcome.REPRODUCED: "the bug still shows on your workspace",
            ReproductionOutcome.NOT_REPRODUCED: "the bug no longer shows on your workspace",
        }.get(fact.status, f"the reproduction ended {fact.status}")
        return f"{shown}: {fact.detail}" if fact.detail else shown
