"""The phases of one run, wired together on its :class:`~pipeline.flow.context.RunContext`, and their order up
to the review wait: what ``repair_bug`` runs (:mod:`pipeline.workflow`), and what a driver other than Temporal
runs on a context of its own (the durability-tax benchmark's plain loop)."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pipeline.flow.agent import SteppedAgent
    from pipeline.flow.context import RunContext
    from pipeline.flow.decisions import Decisions
    from pipeline.flow.ending import Ending
    from pipeline.flow.environments import Environments
    from pipeline.flow.intake import Intake
    from pipeline.flow.moved import MovedHeads
    from pipeline.flow.publish import Publish
    from pipeline.flow.repair import Repair
    from pipeline.flow.review import ReviewGate
    from pipeline.flow.revise import Revisions
    from pipeline.flow.verify import Verify
    from pipeline.patches import BASELINE_PATCH, CHECKS_SIDE_BY_SIDE_PATCH, FORGE_WRITES_BEHIND_PATCH
    from pipeline.state import Phase


class Phases:
    """Every phase of one run, given the run's one context."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.decide = Decisions(ctx)
        envs = Environments(ctx)
        verify = Verify(ctx, envs)
        agent = SteppedAgent(ctx, envs)
        self.intake = Intake(ctx, envs)
        self.repair = Repair(ctx, agent, verify)
        self.publish = Publish(ctx)
        moved = MovedHeads(ctx, self.decide, verify, self.publish)
        self.review = ReviewGate(ctx, moved, Revisions(ctx, agent, verify, self.publish))
        self.ending = Ending(ctx, envs)

    async def to_review(self) -> None:
        """Intake to the published draft PR, in order; a phase that ends the run raises
        :class:`~pipeline.flow.context.RunEnded`."""
        ctx = self.ctx
        await self.intake.prepare()
        if not self.intake.base_reproduced() and ctx.patched(CHECKS_SIDE_BY_SIDE_PATCH):
            await self.intake.checks_on_base()
            behind = await self.ticket_after_intake()
        else:
            await self.intake.reproduce_base()
            behind = await self.ticket_after_intake()
            if ctx.patched(BASELINE_PATCH):
                await self.intake.baseline()
        candidate = await self.repair.run()
        ctx.enter(Phase.PUBLISH)
        await self.publish.first(candidate, overlapped=behind)
        if behind:
            # The review wait's first update (REVIEW_TICKET_PATCH, asked by every run that has this one) writes
            # the same body with the PR in it, right after: this one would be overwritten unread.
            await ctx.settle_behind()
        else:
            await ctx.update_ticket()

    async def ticket_after_intake(self) -> bool:
        """The ticket update once the base reproduced: sent behind the run's next work (FORGE_WRITES_BEHIND_PATCH;
        nobody reads the ticket before the review is asked for) or awaited. Whether it was sent behind."""
        ctx = self.ctx
        if ctx.patched(FORGE_WRITES_BEHIND_PATCH):
            ctx.write_behind()
            return True
        await ctx.update_ticket()
        return False
