"""Publishing a verified candidate: its evidence, the push to the run's branch, the draft PR and the evidence
comment; and the one place the publish fact takes a new head's evidence."""

from __future__ import annotations

import asyncio

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from evidence.interface import ArtifactRef
    from pipeline import messages, steps
    from pipeline.flow import candidates
    from pipeline.flow.context import RunContext
    from pipeline.flow.verify import Verify
    from pipeline.ids import branch_for, op_id
    from pipeline.state import CandidateFact, PublishFact, ReproductionFact
    from pipeline.steps import (
        BuildEvidenceInput,
        EnsureCommentInput,
        EnsureDraftPrInput,
        EvidenceResult,
        PublishBranchInput,
        PullInfo,
    )


def refresh(publish: PublishFact, evidence: EvidenceResult, commit: str | None = None) -> None:
    """The one place the publish fact takes new evidence (and, with ``commit``, a new head)."""
    if commit is not None:
        publish.commit = commit
    publish.manifest_ref = evidence.manifest_ref
    publish.report_ref = evidence.report_ref
    publish.report_url = evidence.report_url
    publish.evidence_digest = evidence.digest


def _reproduction_refs(fact: ReproductionFact) -> list[ArtifactRef]:
    return [*fact.trace_refs, *fact.screenshot_refs, *fact.video_refs, *([fact.log_ref] if fact.log_ref else [])]


class OnPublished:
    """What a phase acting on the run's published PR holds: the run, the verification of its candidates and
    their publishing; :attr:`publish` is the run's publish fact (its PR open)."""

    def __init__(self, ctx: RunContext, verify: Verify, publishing: Publish) -> None:
        self.ctx = ctx
        self.verify = verify
        self.publishing = publishing

    @property
    def publish(self) -> PublishFact:
        publish = self.ctx.state.publish
        assert publish is not None and publish.pr_number is not None
        return publish


class Publish:
    """The publish phase (see the module docstring)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    async def first(self, candidate: CandidateFact, *, overlapped: bool = False) -> None:
        """Publish the repair's verified ``candidate``: evidence, a new branch, the draft PR, its comment. With
        ``overlapped`` (FORGE_WRITES_BEHIND_PATCH) the evidence is built while the branch is pushed: neither
        reads the other, and each is idempotent by its own key (the push's operation ID, the evidence's
        content-addressed artifacts), so a retry of either is what it was when they ran one after the other.
        The PR and its evidence comment, which a reviewer reads, follow both."""
        ctx = self.ctx
        assert candidate.commit is not None
        branch = branch_for(ctx.wf)
        if overlapped:
            # The fact names the branch before the push starts, as it does before an awaited push.
            ctx.state.publish = PublishFact(branch=branch, commit=candidate.commit)
            evidence, _ = await asyncio.gather(
                self.build_evidence(candidate), self.push(candidate, op_id(ctx.wf, "push"), branch, None)
            )
            refresh(ctx.state.publish, evidence)
        else:
            evidence = await self.build_evidence(candidate)
            ctx.state.publish = PublishFact(branch=branch, commit=candidate.commit)
            refresh(ctx.state.publish, evidence)
            await self.push(candidate, op_id(ctx.wf, "push"), branch, None)
        pr = await self.ensure_pr(candidate, op_id(ctx.wf, "pr"), branch)
        ctx.state.publish.pr_number = pr.number
        ctx.state.publish.pr_url = pr.url
        ctx.state.publish.evidence_comment_id = await self.evidence_comment(pr.number, candidate, evidence)

    def evidence_input(self, candidate: CandidateFact) -> BuildEvidenceInput:
        """What the evidence of a verified ``candidate`` (of any kind) is built from."""
        ctx = self.ctx
        assert candidate.commit is not None and ctx.procedure_ref is not None
        base = ctx.state.reproduction
        replay = candidate.replay
        assert base is not None and replay is not None and candidate.test_output_ref is not None
        baseline = ctx.state.baseline
        return BuildEvidenceInput(
            run_id=ctx.wf,
            repository=ctx.input.repository,
            issue_number=ctx.input.issue_number,
            base_revision=candidate.base_revision or ctx.the_report.base_revision,
            candidate_commit=candidate.commit,
            procedure_ref=ctx.procedure_ref,
            base_reproduction=_reproduction_refs(base),
            candidate_reproduction=_reproduction_refs(replay),
            base_status=base.status,
            candidate_status=replay.status,
            patch_ref=candidate.patch_ref,
            test_output_ref=candidate.test_output_ref,
            tests_passed=bool(candidate.tests_passed),
            spec_ref=ctx.spec,
            test_summary=candidate.test_summary or "",
            baseline_passed=baseline.passed if baseline else None,
            baseline_summary=baseline.summary if baseline else "",
            baseline_output_ref=baseline.test_output_ref if baseline else None,
            regression=candidate.regression,
        )

    async def build_evidence(self, candidate: CandidateFact) -> EvidenceResult:
        evidence = await self.ctx.step(steps.BUILD_EVIDENCE, self.evidence_input(candidate))
        self.ctx.record(evidence.manifest_ref)
        self.ctx.record(evidence.report_ref)
        return evidence

    async def push(
        self,
        candidate: CandidateFact,
        push_op: str,
        branch: str,
        old_head: str | None,
        *,
        base_revision: str | None = None,
        parent: bool = True,
    ) -> None:
        """Push the verified ``candidate`` to ``branch``: a new branch (``old_head`` None), or a commit on top
        of ``old_head``, which is then the push's lease (and, with ``parent``, the commit's parent). The commit
        is made on ``base_revision`` (default: the run's base)."""
        ctx = self.ctx
        report = ctx.the_report
        assert candidate.commit is not None
        await ctx.step(
            steps.PUBLISH_BRANCH,
            PublishBranchInput(
                op_id=push_op,
                run_id=ctx.wf,
                repository=ctx.input.repository,
                clone_url=report.clone_url,
                branch=branch,
                base_revision=base_revision or report.base_revision,
                patch_ref=candidate.patch_ref,
                expected_commit=candidate.commit,
                message=candidates.commit_message(ctx.state, report.title, candidate),
                commit_timestamp=candidate.commit_timestamp,
                expected_old=old_head,
                parent_commit=old_head if parent else None,
            ),
        )

    async def ensure_pr(self, repaired: CandidateFact, pr_op: str, branch: str) -> PullInfo:
        """The run's draft PR, its description written from the repair's candidate ``repaired``."""
        ctx = self.ctx
        inp = ctx.input
        return await ctx.step(
            steps.ENSURE_DRAFT_PR,
            EnsureDraftPrInput(
                op_id=pr_op,
                run_id=ctx.wf,
                repository=inp.repository,
                branch=branch,
                base=inp.base_branch,
                title=messages.pr_title(ctx.the_report.title, inp.issue_number),
                body=messages.pr_body(ctx.state, repaired, inp.policy.closing_keyword),
            ),
        )

    async def evidence_comment(self, number: int, candidate: CandidateFact, evidence: EvidenceResult) -> int:
        """The PR's evidence comment for ``candidate``'s commit (keyed by it); its ID."""
        comment = await self.ctx.step(
            steps.ENSURE_COMMENT,
            EnsureCommentInput(
                repository=self.ctx.input.repository,
                number=number,
                key=f"{self.ctx.wf}:evidence:{candidate.commit}",
                body=messages.evidence_comment(self.ctx.state, candidate, evidence),
            ),
        )
        return comment.comment_id
