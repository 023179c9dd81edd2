"""``repair_attempt``: one stepped repair attempt (or revision) of a run, as a child workflow of ``repair_bug``.

What it is given and gives back, and why it exists: :mod:`pipeline.flow.attempt_carry`. It runs exactly the
steps :meth:`pipeline.flow.agent.SteppedAgent.attempt_here` runs inside a run recorded before children, on a
run context built from its input, and ends in one of four ways: a proposal, the run's ending (all turns used,
an environment that kept dying), cancelled (the run's cancellation reaches it as a cancellation of the child:
the step in flight is cancelled as in the run, and the state so far still goes back), or a step's failure,
raised as an ``ApplicationError`` of type :data:`~pipeline.flow.attempt_carry.ATTEMPT_STEP_FAILED` carrying
the state so far, caused by the step's own failure.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from pipeline.flow.agent import SteppedAgent
    from pipeline.flow.attempt_carry import ATTEMPT_STEP_FAILED, ATTEMPT_WORKFLOW, AttemptInput, AttemptOutcome
    from pipeline.flow.context import RunContext, RunEnded, is_cancellation
    from pipeline.flow.environments import Environments
    from pipeline.state import Outcome, RunState
    from pipeline.steps import ProposalResult


@workflow.defn(name=ATTEMPT_WORKFLOW)
class RepairAttemptWorkflow:
    @workflow.init
    def __init__(self, inp: AttemptInput) -> None:
        ctx = RunContext(input=inp.run, state=inp.state)
        ctx.take_up(inp)
        self._ctx = ctx

    @workflow.query
    def state(self) -> RunState:
        """The run's state as this attempt has it so far (its budgets count every turn taken)."""
        return self._ctx.state.bounded()

    @workflow.run
    async def run(self, inp: AttemptInput) -> AttemptOutcome:
        ctx = self._ctx
        agent = SteppedAgent(ctx, Environments(ctx))
        try:
            proposal = await agent.attempt_here(inp.order)
        except RunEnded as ended:
            return self._outcome(ended=ended.outcome, detail=ended.detail)
        except asyncio.CancelledError:
            return self._outcome(cancelled=True)
        except ActivityError as err:
            if is_cancellation(err) or ctx.cancel_requested():
                return self._outcome(cancelled=True)
            raise ApplicationError(
                f"attempt {inp.order.attempt}: a step failed",
                self._outcome().model_dump(mode="json"),
                type=ATTEMPT_STEP_FAILED,
                non_retryable=True,
            ) from err
        return self._outcome(proposal=proposal)

    def _outcome(
        self,
        *,
        proposal: ProposalResult | None = None,
        ended: Outcome | None = None,
        detail: str = "",
        cancelled: bool = False,
    ) -> AttemptOutcome:
        ctx = self._ctx
        return AttemptOutcome(
            state=ctx.state,
            hosts=ctx.hosts,
            live_envs=ctx.live_envs,
            proposal=proposal,
            ended=ended,
            ended_detail=detail,
            cancelled=cancelled,
        )
