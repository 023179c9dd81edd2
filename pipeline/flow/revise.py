"""Revisions on review: a permitted reviewer's request for changes of the head under review answered by one
bounded attempt on top of it, verified like any candidate, and pushed to the same branch."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from pipeline import revisions, steps
    from pipeline.failures import FailureClass, failure_class, failure_message
    from pipeline.flow import publish as publishing
    from pipeline.flow.agent import SteppedAgent
    from pipeline.flow.attempt_carry import AttemptSpec
    from pipeline.flow.context import RunContext, RunEnded
    from pipeline.flow.publish import OnPublished, Publish
    from pipeline.flow.verify import Verify
    from pipeline.ids import op_id
    from pipeline.state import CandidateFact, Outcome, Phase, Rejection, VerificationStatus
    from pipeline.steps import ProposalResult, ReadReviewInput, RequestReviewInput, ReviewRead


class Revisions(OnPublished):
    """Revisions on review (see the module docstring)."""

    def __init__(self, ctx: RunContext, agent: SteppedAgent, verify: Verify, publish: Publish) -> None:
        super().__init__(ctx, verify, publish)
        self.agent = agent

    async def revise(self, request: Rejection) -> None:
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
        ctx = self.ctx
        budgets = ctx.state.budgets
        head = self.publish.commit
        if budgets.revisions_used >= budgets.revisions_max:
            await ctx.say_on_pr(
                f"{ctx.wf}:revisions-spent",
                revisions.budget_spent_comment(budgets.revisions_max, request.reviewer, head),
            )
            raise RunEnded(
                Outcome.REJECTED,
                f"changes requested by {request.reviewer} after the revision budget ({budgets.revisions_max}) "
                "was spent" + (f": {request.reason}" if request.reason else ""),
            )
        budgets.revisions_used += 1
        n = budgets.revisions_used
        under_review = next(c for c in reversed(ctx.state.candidates) if c.commit == head)
        ctx.state.pending_approval = None
        ctx.clear_approval()  # an approval of the head under review does not cover its revision
        ctx.decisions.revising = True
        try:
            candidate, failure = await self._candidate(request, under_review, n)
            if candidate is not None:
                await self._publish(candidate, head)
                ctx.decisions.review_note = (
                    f"revision {n} pushed as `{self.publish.commit[:12]}`; waiting for a review of it"
                )
            else:
                await ctx.say_on_pr(
                    f"{ctx.wf}:revision-failed:{n}",
                    revisions.revision_failed_comment(n, budgets.revisions_max, request.reviewer, head, failure),
                )
                ctx.decisions.review_note = (
                    f"revision {n} did not pass ({failure}); `{head[:12]}` is still under review"
                )
        finally:
            ctx.decisions.revising = False

    async def _candidate(
        self, request: Rejection, under_review: CandidateFact, n: int
    ) -> tuple[CandidateFact | None, str]:
        """Revision ``n``: the attempt and its verification. The verified candidate, or None and why not."""
        ctx = self.ctx
        budgets = ctx.state.budgets
        assert under_review.commit is not None
        feedback = revisions.feedback_text(request, await self._read_review(request))
        spent = budgets.model_prompt_tokens + budgets.model_completion_tokens
        if spent >= budgets.model_token_budget:
            return None, f"the model token budget is spent ({spent} >= {budgets.model_token_budget})"
        ctx.enter(Phase.REPAIR)
        # An attempt number of its own, so its transcripts and patch are told apart from the repair attempts'.
        attempt = budgets.repair_attempts_used + n
        repair_op = op_id(ctx.wf, "revision", n)
        spec = AttemptSpec(
            attempt=attempt,
            repair_op=repair_op,
            failures=[],
            token_budget=budgets.model_token_budget - spent,
            start_patch=under_review.patch_ref,
            revision=n,
            review_feedback=feedback,
        )
        proposal = await self._propose(spec)
        if isinstance(proposal, str):
            return None, proposal
        if proposal.patch_ref.sha256 == under_review.patch_ref.sha256:
            return None, "the revision changed nothing"
        candidate = self.verify.proposed(attempt, repair_op, proposal)
        candidate.revision, candidate.parent_commit = n, under_review.commit
        candidate.review_id, candidate.reviewer = request.review_id, request.reviewer
        failure = await self.verify.judge_new(candidate)
        return (candidate, "") if failure is None else (None, failure)

    async def _read_review(self, request: Rejection) -> ReviewRead | None:
        """The review that asked for changes, read from the forge (None for a request carrying no review ID)."""
        if request.review_id is None or request.pr_number is None:
            return None
        return await self.ctx.step(
            steps.READ_REVIEW,
            ReadReviewInput(
                repository=self.ctx.input.repository, number=request.pr_number, review_id=int(request.review_id)
            ),
        )

    async def _propose(self, spec: AttemptSpec) -> ProposalResult | str:
        """The revision's proposal, or why it has none (a step failure that is not the attempt's propagates)."""
        try:
            return await self.agent.attempt(spec)
        except RunEnded as ended:
            return ended.detail
        except ActivityError as err:
            self.ctx.count_tokens(err)
            if failure_class(err) not in (FailureClass.NO_PATCH, FailureClass.PERMANENT, FailureClass.BUDGET):
                raise
            return f"no usable patch ({failure_message(err)})"

    async def _publish(self, candidate: CandidateFact, old_head: str) -> None:
        """Push the verified revision on top of ``old_head`` (the lease), then evidence and a renewed review."""
        ctx = self.ctx
        publish = self.publish
        assert publish.pr_number is not None and candidate.commit is not None
        ctx.enter(Phase.PUBLISH)
        evidence = await self.publishing.build_evidence(candidate)
        await self.publishing.push(
            candidate, op_id(ctx.wf, "revision-push", candidate.revision), publish.branch, old_head
        )
        repaired = next(
            c for c in ctx.state.candidates if not c.revision and c.verification == VerificationStatus.PASSED
        )
        await self.publishing.ensure_pr(repaired, op_id(ctx.wf, "revision-pr", candidate.revision), publish.branch)
        publishing.refresh(publish, evidence, commit=candidate.commit)
        publish.evidence_comment_id = await self.publishing.evidence_comment(publish.pr_number, candidate, evidence)
        reviewer = candidate.reviewer or ""
        await ctx.say_on_pr(
            f"{ctx.wf}:revision:{candidate.revision}",
            revisions.revised_comment(
                candidate.revision,
                ctx.state.budgets.revisions_max,
                reviewer or "the reviewer",
                old_head,
                candidate.commit,
            ),
        )
        if reviewer:
            await ctx.step(
                steps.REQUEST_REVIEW,
                RequestReviewInput(repository=ctx.input.repository, number=publish.pr_number, reviewers=[reviewer]),
            )
