"""Moved heads and bases during the review wait: a head of the run's PR the run did not push is verified
before anyone is asked to review it (MOVED_HEAD_PATCH); a base branch that moved since the head under review
was verified is rebuilt on and verified before the merge (BASE_MOVED_PATCH)."""

from __future__ import annotations

from typing import NoReturn

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pipeline import head_gate, messages, steps
    from pipeline.flow import candidates
    from pipeline.flow import publish as publishing
    from pipeline.flow.context import RunContext, RunEnded
    from pipeline.flow.decisions import Decisions
    from pipeline.flow.publish import OnPublished, Publish
    from pipeline.flow.verify import Verify
    from pipeline.ids import op_id
    from pipeline.state import (
        Approval,
        CandidateFact,
        HeadPush,
        HeadPushFact,
        HeadPushStatus,
        Outcome,
        Phase,
    )
    from pipeline.steps import (
        CaptureHeadInput,
        EvidenceResult,
        HeadCaptured,
        ReadBranchInput,
        ReadPullInput,
        RebuildOnBaseInput,
        RebuiltOnBase,
        RequestReviewInput,
    )


class MovedHeads(OnPublished):
    """Moved heads and bases (see the module docstring)."""

    def __init__(self, ctx: RunContext, decide: Decisions, verify: Verify, publish: Publish) -> None:
        super().__init__(ctx, verify, publish)
        self.decide = decide

    async def ask_again(self, previous: Approval | None) -> None:
        """Ask the last approver again, when the approval was a forge review (an operator is not a reviewer)."""
        if previous is not None and previous.source == "webhook":
            assert self.publish.pr_number is not None
            await self.ctx.step(
                steps.REQUEST_REVIEW,
                RequestReviewInput(
                    repository=self.ctx.input.repository, number=self.publish.pr_number, reviewers=[previous.reviewer]
                ),
            )

    # ---- moved heads ------------------------------------------------------------------------------------

    async def gate_moved_head(self, push: HeadPush) -> None:
        """Verify a moved head of the run's PR before anyone is asked to review it.

        The PR is read first: the head verified is the one it has now (a push seen late, already replaced by
        another, is marked superseded and the PR's current head is taken in its place; a closed or merged PR
        is left to the review wait). The head is fetched from the forge and stored as its change from the
        run's base (``env.capture_head``), a candidate of the run (``pushed_head``) verified like any other:
        a fresh workspace, the recipe's tests and the regression policy, the reproduction replayed, and the
        rebuilt tree must be the head's own. An approval held for the previous head, and a request for changes
        of it, no longer apply.

        Passing: new evidence and an evidence comment keyed by the head, the publish fact names the head and its
        digest (the renewed review request, which the review wait then makes, carries both), a keyed comment
        says so on the PR and the last approver (a forge reviewer) is asked again. Failing: said on the PR
        (keyed by the head) and on the ticket, and the run ends ``needs-human-triage``: a head that failed is
        never offered for approval, and the run does not wait for a review nobody should give. Idempotent on
        retry: every effect is keyed by the head.
        """
        ctx = self.ctx
        fact = next(f for f in ctx.state.head_pushes if f.head_sha == push.head_sha)
        previous = ctx.clear_approval()
        ctx.state.pending_approval = None
        ctx.decisions.revision_request = None
        ctx.enter(Phase.VERIFY)
        if not await self._still_the_head(push, fact):
            return
        fact.status = HeadPushStatus.VERIFYING
        captured = await ctx.step(
            steps.CAPTURE_HEAD,
            CaptureHeadInput(
                run_id=ctx.wf, spec_ref=ctx.spec, head_sha=push.head_sha, base_revision=ctx.the_report.base_revision
            ),
        )
        ctx.record(captured.patch_ref)
        old_head = self.publish.commit
        candidate = self._pushed_candidate(push, captured)
        ctx.state.candidates.append(candidate)
        if captured.empty:
            failure: str | None = (
                f"{push.head_sha[:12]} changes nothing from the base revision {ctx.the_report.base_revision[:12]}"
            )
            candidates.record_verdict(candidate, failure)
        else:
            failure = await self.verify.judge(candidate)
        if failure is not None:
            await self._head_failed(push, fact, old_head, failure)
        await self._head_passed(push, fact, candidate, old_head, previous)

    async def _still_the_head(self, push: HeadPush, fact: HeadPushFact) -> bool:
        """Whether ``push`` names the PR's head now (else its fact is superseded, by the PR's current head)."""
        publish = self.publish
        assert publish.pr_number is not None
        pr = await self.ctx.step(
            steps.READ_PR, ReadPullInput(repository=self.ctx.input.repository, number=publish.pr_number)
        )
        if pr.merged or pr.state != "open":
            fact.status, fact.detail = HeadPushStatus.SUPERSEDED, f"the PR is {'merged' if pr.merged else pr.state}"
            return False
        if pr.head_sha != push.head_sha:
            fact.status, fact.detail = HeadPushStatus.SUPERSEDED, f"the PR's head was {pr.head_sha} by then"
            self.decide.note_moved_head(
                HeadPush(pr_number=publish.pr_number, head_sha=pr.head_sha, before=push.head_sha, source="forge")
            )
            return False
        return True

    def _pushed_candidate(self, push: HeadPush, captured: HeadCaptured) -> CandidateFact:
        sha = push.head_sha
        return CandidateFact(
            attempt=0,
            op_id=f"{op_id(self.ctx.wf, 'head')}:{sha}",
            patch_ref=captured.patch_ref,
            summary=captured.message.strip() or f"head {sha}",
            commit_timestamp=captured.committed_at,
            tree=captured.tree,
            pushed_head=sha,
            pushed_by=push.pusher,
        )

    async def _head_failed(self, push: HeadPush, fact: HeadPushFact, old_head: str, failure: str) -> NoReturn:
        sha = push.head_sha
        fact.status, fact.detail = HeadPushStatus.FAILED, failure
        await self.ctx.say_on_pr(
            f"{self.ctx.wf}:head-failed:{sha}", head_gate.head_failed_comment(old_head, sha, push.pusher, failure)
        )
        detail = head_gate.head_failed_detail(sha, push.pusher, failure)
        self.ctx.closing_note = detail
        raise RunEnded(Outcome.NEEDS_HUMAN_TRIAGE, detail)

    async def _head_passed(
        self, push: HeadPush, fact: HeadPushFact, candidate: CandidateFact, old_head: str, previous: Approval | None
    ) -> None:
        ctx = self.ctx
        sha = push.head_sha
        publish = self.publish
        assert publish.pr_number is not None
        candidate.commit = sha
        ctx.enter(Phase.PUBLISH)
        evidence = await self.publishing.build_evidence(candidate)
        publishing.refresh(publish, evidence, commit=sha)
        publish.evidence_comment_id = await self.publishing.evidence_comment(publish.pr_number, candidate, evidence)
        await ctx.say_on_pr(
            f"{ctx.wf}:head-verified:{sha}",
            head_gate.head_verified_comment(old_head, sha, push.pusher, evidence.digest, candidate.test_summary or ""),
        )
        await self.ask_again(previous)
        fact.status, fact.detail = HeadPushStatus.PASSED, f"verified; evidence {evidence.digest}"
        ctx.decisions.review_note = head_gate.head_verified_note(sha, push.pusher, evidence.digest)

    # ---- moved bases ------------------------------------------------------------------------------------

    async def reverify_on_moved_base(self) -> bool:
        """Before merging: read the base branch; if it moved since the head under review was verified
        (``publish.verified_base``), rebuild the change on its new head and verify that.

        A change that no longer applies (a conflict) is said on the PR and the ticket and ends the run
        ``needs-human-triage``: nothing is merged around it. A rebuilt change that fails verification ends it the
        same way. One that passes gets new evidence, and then (``RunPolicy.base_moved``): ``merge`` with the
        same change (equal patch IDs) records the verification on the new base (an evidence comment keyed by
        the head and the base) and returns False: the approved head merges, and the forge's merge commit is the
        tree verified. A change that differs, or ``rebase``: the rebuilt head (a commit on the new base) is
        pushed with a lease on the head under review, an evidence comment keyed by it, a keyed comment on the
        PR, the approval dropped (its reviewer asked again), and True: the review wait asks for a review of it.
        Every effect is keyed by the new base, so a retried step finds its own work.
        """
        ctx = self.ctx
        inp = ctx.input
        publish = self.publish
        now = await ctx.step(steps.READ_BRANCH, ReadBranchInput(repository=inp.repository, branch=inp.base_branch))
        verified_base = publish.verified_base or ctx.the_report.base_revision
        if now.sha is None or now.sha == verified_base:
            return False
        new_base = now.sha
        head = publish.commit
        under_review = next(c for c in reversed(ctx.state.candidates) if c.commit == head)
        ctx.enter(Phase.VERIFY)
        rebuilt = await ctx.step(
            steps.REBUILD_ON_BASE,
            RebuildOnBaseInput(
                run_id=ctx.wf, spec_ref=ctx.spec, head_sha=head, old_base=verified_base, new_base=new_base
            ),
        )
        candidate = await self._rebuilt_candidate(rebuilt, under_review, new_base)
        ctx.enter(Phase.PUBLISH)
        evidence = await self.publishing.build_evidence(candidate)
        publish.verified_base = new_base
        publishing.refresh(publish, evidence)
        if rebuilt.same_change and inp.policy.base_moved == "merge":
            await ctx.say_on_pr(
                f"{ctx.wf}:evidence:{head}:base-{new_base}",
                head_gate.base_verified_header(head, inp.base_branch, new_base)
                + messages.evidence_comment(ctx.state, candidate, evidence),
            )
            return False
        await self._push_rebuilt(candidate, head, new_base, evidence)
        return True

    async def _rebuilt_candidate(
        self, rebuilt: RebuiltOnBase, under_review: CandidateFact, new_base: str
    ) -> CandidateFact:
        """The head under review rebuilt on ``new_base``, verified; the run ends if it conflicts or fails."""
        ctx = self.ctx
        head = self.publish.commit
        branch = ctx.input.base_branch
        if rebuilt.conflict or rebuilt.patch_ref is None:
            await ctx.say_on_pr(
                f"{ctx.wf}:base-conflict:{new_base}",
                head_gate.base_conflict_comment(head, branch, new_base, rebuilt.detail),
            )
            ctx.closing_note = head_gate.base_conflict_detail(branch, new_base, rebuilt.detail)
            raise RunEnded(Outcome.NEEDS_HUMAN_TRIAGE, ctx.closing_note)
        ctx.record(rebuilt.patch_ref)
        candidate = CandidateFact(
            attempt=0,
            op_id=f"{op_id(ctx.wf, 'base')}:{new_base}",
            patch_ref=rebuilt.patch_ref,
            summary=under_review.summary,
            commit_timestamp=under_review.commit_timestamp,
            base_revision=new_base,
            rebuilt_from=head,
        )
        ctx.state.candidates.append(candidate)
        failure = await self.verify.judge(candidate)
        if failure is not None:
            await ctx.say_on_pr(
                f"{ctx.wf}:base-failed:{new_base}", head_gate.base_failed_comment(head, branch, new_base, failure)
            )
            ctx.closing_note = head_gate.base_failed_detail(branch, new_base, failure)
            raise RunEnded(Outcome.NEEDS_HUMAN_TRIAGE, ctx.closing_note)
        assert candidate.commit is not None
        return candidate

    async def _push_rebuilt(self, candidate: CandidateFact, head: str, new_base: str, evidence: EvidenceResult) -> None:
        """Push the rebuilt head (leased on ``head``) for a renewed review; its approver is asked again."""
        ctx = self.ctx
        publish = self.publish
        assert publish.pr_number is not None and candidate.commit is not None
        push_op = f"{op_id(ctx.wf, 'base-push')}:{new_base}"
        await self.publishing.push(candidate, push_op, publish.branch, head, base_revision=new_base, parent=False)
        publish.commit = candidate.commit
        publish.evidence_comment_id = await self.publishing.evidence_comment(publish.pr_number, candidate, evidence)
        await ctx.say_on_pr(
            f"{ctx.wf}:base-rebuilt:{new_base}",
            head_gate.base_rebuilt_comment(head, ctx.input.base_branch, new_base, candidate.commit, evidence.digest),
        )
        previous = ctx.clear_approval()
        await self.ask_again(previous)
        ctx.decisions.review_note = head_gate.base_rebuilt_note(ctx.input.base_branch, new_base, candidate.commit)
