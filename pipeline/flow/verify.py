"""Verification of a candidate of any kind: a fresh workspace, the recipe's tests and the regression policy,
and the reproduction replayed on it beside them (:mod:`pipeline.flow.side_by_side`; after them in runs recorded
before)."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from environments.regression import ProofStatus
    from pipeline import steps
    from pipeline.flow import candidates
    from pipeline.flow.context import RunContext
    from pipeline.flow.environments import UNMADE, Environments
    from pipeline.flow.side_by_side import side_by_side
    from pipeline.patches import CHECKS_SIDE_BY_SIDE_PATCH
    from pipeline.state import CandidateFact, Phase, ReproductionFact, ReproductionOutcome
    from pipeline.steps import ProposalResult, VerifyInput, VerifyResult


class Verify:
    """The verify phase (see the module docstring)."""

    def __init__(self, ctx: RunContext, envs: Environments) -> None:
        self.ctx = ctx
        self.envs = envs

    def proposed(self, attempt: int, op: str, proposal: ProposalResult) -> CandidateFact:
        """The candidate of an attempt's ``proposal`` (its patch recorded in the run's evidence), committed now."""
        self.ctx.record(proposal.patch_ref)
        return CandidateFact(
            attempt=attempt,
            op_id=op,
            patch_ref=proposal.patch_ref,
            summary=proposal.summary,
            commit_timestamp=int(self.ctx.now().timestamp()),
        )

    async def judge_new(self, candidate: CandidateFact) -> str | None:
        """A new candidate of the run: kept in its state, then verified in the verify phase (:meth:`judge`)."""
        self.ctx.state.candidates.append(candidate)
        self.ctx.enter(Phase.VERIFY)
        return await self.judge(candidate)

    async def judge(self, candidate: CandidateFact) -> str | None:
        """Verify ``candidate`` and record its verdict; None means passed, else why it failed."""
        failure = await self.verify(candidate)
        candidates.record_verdict(candidate, failure)
        return failure

    async def verify(self, candidate: CandidateFact) -> str | None:
        """Verify a candidate on a fresh workspace: tests, and the reproduction replayed (beside the tests, or
        after them in runs recorded before CHECKS_SIDE_BY_SIDE_PATCH). None means passed."""
        ctx = self.ctx
        report = ctx.the_report
        baseline = ctx.state.baseline
        tests = VerifyInput(
            run_id=ctx.wf,
            op_id=candidates.verify_op(ctx.wf, candidate),
            spec_ref=ctx.spec,
            patch_ref=candidate.patch_ref,
            message=candidates.commit_message(ctx.state, report.title, candidate),
            commit_timestamp=candidate.commit_timestamp,
            baseline_cases_ref=baseline.cases_ref if baseline else None,
            parent_commit=candidate.parent_commit,
            base_revision=candidate.base_revision,
        )
        if ctx.patched(CHECKS_SIDE_BY_SIDE_PATCH):
            return await self._side_by_side(candidate, tests)
        head_tree = candidate.tree
        verified = await ctx.step(steps.VERIFY_CANDIDATE, tests)
        commit = self._take(candidate, verified)
        failure = self._judged(candidate, verified, head_tree)
        if failure is not None:
            return failure
        candidate.replay = await self._replay(candidate, commit, beside=False)
        return replay_failure(candidate.replay)

    async def _side_by_side(self, candidate: CandidateFact, tests: VerifyInput) -> str | None:
        """The tests (which make the candidate's commit) beside the reproduction replayed on base + the patch,
        which is stored as :data:`UNMADE` until the commit exists. The tests failing cancels the replay (its
        environment torn down). The replay failing does not cancel the tests: they make the commit its record
        names, and their results are the candidate's record as before; its verdict is taken once both ended."""
        head_tree = candidate.tree
        replays: list[ReproductionFact] = []

        async def run_tests() -> str | None:
            verified = await self.ctx.step(steps.VERIFY_CANDIDATE, tests)
            self._take(candidate, verified)
            return self._judged(candidate, verified, head_tree)

        async def replay() -> None:
            replays.append(await self._replay(candidate, candidate.pushed_head or UNMADE, beside=True))

        checks = {"tests": run_tests(), "reproduction": replay()}
        failure = await side_by_side(self.ctx, checks)
        if replays and candidate.commit is not None:
            candidate.replay = self.envs.tag(replays[0], candidate.commit)
        if failure is not None:
            return failure
        # Both checks ended without raising and the tests passed: the replay ended too, and the commit exists.
        assert candidate.replay is not None
        return replay_failure(candidate.replay)

    async def _replay(self, candidate: CandidateFact, revision: str, *, beside: bool) -> ReproductionFact:
        """The reproduction replayed on base + ``candidate``'s patch, in the verify phase, as ``revision``
        (``beside`` the tests or not: :meth:`~pipeline.flow.environments.Environments.reproduce_on`)."""
        return await self.envs.reproduce_on(
            revision,
            candidate.patch_ref,
            candidates.label(candidate),
            Phase.VERIFY,
            Phase.VERIFY,
            base=candidate.base_revision,
            beside=beside,
        )

    def _take(self, candidate: CandidateFact, verified: VerifyResult) -> str:
        """Record what the verification found on ``candidate`` and in the run's evidence; the candidate's commit."""
        # A pushed head is verified as base + its whole change, which must rebuild the head's own tree; the
        # candidate is then that head (the commit made on the workspace is the verification's, not the PR's).
        commit = candidate.commit = candidate.pushed_head or verified.commit
        candidate.tree = verified.tree
        candidate.tests_passed = verified.tests_passed
        candidate.test_summary = verified.test_summary
        candidate.test_output_ref = verified.test_output_ref
        candidate.bundle_ref = verified.bundle_ref
        self.ctx.record(verified.test_output_ref)
        self.ctx.record(verified.bundle_ref)
        candidate.regression = verified.regression
        for ref in verified.regression.refs if verified.regression else []:
            self.ctx.record(ref)
        return commit

    def _judged(self, candidate: CandidateFact, verified: VerifyResult, head_tree: str | None) -> str | None:
        """Why the verification's own findings refuse ``candidate`` (before its replay), or None."""
        if candidate.pushed_head and verified.tree != head_tree:
            return f"the verified tree {verified.tree} is not the tree {head_tree} of {candidate.pushed_head}"
        if not verified.tests_passed:
            return f"tests failed: {verified.test_summary}"
        proof = verified.regression
        if self.ctx.input.policy.require_regression_test and (proof is None or proof.status != ProofStatus.PROVEN):
            said = proof.summary if proof else "no regression proof was run"
            return (
                f"no regression test: {said}; the policy asks for a test that fails on the base and passes with the fix"
            )
        return None


def replay_failure(replay: ReproductionFact) -> str | None:
    """Why the reproduction replayed on a candidate refuses it, or None (it no longer reproduces)."""
    if replay.status == ReproductionOutcome.REPRODUCED:
        return "the bug still reproduces on the candidate"
    if replay.status != ReproductionOutcome.NOT_REPRODUCED:
        return f"replay on the candidate was {replay.status}: {replay.detail}"
    return None
