"""Benchmark: the durability tax, the demo's run as a plain loop of its activities vs through Temporal.

Run: ``uv run python -m tests.bench.bench_tax [--rounds R] [--quick]`` (default R=3; ``--quick`` is one
round). On the embedded e2e stack (:func:`tests.support.e2e_stack.running_e2e_stack`: the GitHub emulator, the
scripted model server, the evidence server, a real Temporal dev server), each round repairs the sample app's
report (``examples/cart``) twice, each time on a fresh repository seeded with the sample, to the merge:

- *plain*: :class:`PlainRun` calls the real activity implementations (the production worker's, from
  :func:`pipeline.worker.runner.activities_for` over one :class:`~pipeline.services.Services`) one after another in
  this process, in the order ``repair_bug`` calls them on its happy path, with the inputs it would build;
  each call runs under :class:`temporalio.testing.ActivityEnvironment` (the adapters read
  ``activity.info()`` and heartbeat), so there is no server, no serialization and no task queue;
- *temporal*: the same report through ``repair_bug`` (:func:`pipeline.client.start_run`) with the
  production workers (:func:`pipeline.worker.runner.build_workers`) in this process, approved as an operator
  (:func:`pipeline.client.approve`) once it awaits review, awaited to ``merged``.

The two take turns (which goes first alternates by round) after one unmeasured warm-up of each (the mirror
and dependency caches, the browser, imports). What differs is what Temporal adds: scheduling each step,
serializing its input and output, the workflow tasks, the history. The figures are medians over rounds,
and the ratio is temporal / plain.

The plain loop covers only the happy path (what the demo's run does): a step that answers otherwise (the
report does not reproduce, a candidate fails verification, the base moved) raises :class:`PlainRunFailed`.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.testing import ActivityEnvironment

from environments.interface import EnvironmentHandle
from evidence.interface import ArtifactRef
from infra.processes import ServiceError
from pipeline import client as runs
from pipeline import messages, steps
from pipeline.config import DurafixConfig
from pipeline.ids import branch_for, op_id, workflow_id_for
from pipeline.services import Services
from pipeline.state import (
    Approval,
    ApprovalRequest,
    BaselineFact,
    Budgets,
    CandidateFact,
    Outcome,
    Phase,
    PhaseMark,
    PublishFact,
    ReproductionFact,
    ReproductionOutcome,
    RunState,
    TicketFact,
    VerificationStatus,
)
from pipeline.steps import (
    AGENT_MAX_TURNS,
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
    MergeInput,
    MergeStatus,
    PrepareProcedureInput,
    PrepareSpecInput,
    ProcedureResult,
    ProvisionInput,
    PublishBranchInput,
    ReadBranchInput,
    ReadPullInput,
    ReadReportInput,
    ReportInfo,
    ReproduceInput,
    Step,
    UpdateTicketInput,
    VerifyInput,
)
from pipeline.worker.runner import ALL_QUEUES, activities_for, build_workers
from repair.stepping import ToolCall, segments
from repair.tools import RUN_REPRODUCTION, RUN_TOOLS, WORKSPACE_TOOLS
from tests.support.e2e_stack import E2EStack, combined_model_script, running_e2e_stack

In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out")

DEFAULT_ROUNDS = 3
REVIEWER = "bench-operator"


class PlainRunFailed(RuntimeError):
    """A step answered off the happy path the plain loop follows."""


def registry(services: Services) -> dict[str, Callable[..., Any]]:
    """Every activity the production worker registers, by its step name."""
    out: dict[str, Callable[..., Any]] = {}
    for queue in ALL_QUEUES:
        for fn in activities_for(queue, services):
            defn = activity._Definition.must_from_callable(fn)
            assert defn.name is not None
            out[defn.name] = fn
    return out


class PlainRun:
    """One run of ``repair_bug``'s happy path as a plain loop: its steps in its order, inputs built as it builds
    them (the same operation IDs, messages and references), results kept in a :class:`RunState` as it keeps
    them. Not durable and not idempotent beyond what each activity is by itself: it exists to be timed.
    ``calls`` is the step names in the order called (the smoke test compares them with a workflow history)."""

    def __init__(
        self, config: DurafixConfig, activities: dict[str, Callable[..., Any]], repository: str, issue: int
    ) -> None:
        self.config = config
        self.activities = activities
        self.policy = runs.run_policy(config)
        self.wf = workflow_id_for(repository, issue)
        self.repository = repository
        self.issue = issue
        self.state = RunState(
            workflow_id=self.wf,
            run_id="plain",
            repository=repository,
            issue_number=issue,
            base_branch="main",
            budgets=Budgets(
                repair_attempts_max=self.policy.max_repair_attempts,
                model_token_budget=self.policy.model_token_budget,
                revisions_max=self.policy.revisions_max,
            ),
        )
        self.calls: list[str] = []
        self.spec_ref: ArtifactRef | None = None
        self.procedure_ref: ArtifactRef | None = None

    # ---- the loop -----------------------------------------------------------------------------------

    def step(self, step: Step[In, Out], arg: In) -> Out:
        """Call ``step``'s implementation in an activity context of this run (no server)."""
        env = ActivityEnvironment()
        env.info = dataclasses.replace(
            env.info,
            activity_type=step.name,
            activity_id=str(len(self.calls) + 1),
            task_queue=step.queue.value,
            workflow_id=self.wf,
            workflow_run_id="plain",
            workflow_type="repair_bug",
        )
        self.calls.append(step.name)
        result: Out = env.run(self.activities[step.name], arg)
        return result

    def run(self) -> RunState:
        wf = self.wf
        self.enter(Phase.INTAKE)
        report = self.step(
            steps.READ_REPORT, ReadReportInput(repository=self.repository, issue_number=self.issue, base_branch="main")
        )
        self.state.target_revision = report.base_revision
        self.enter(Phase.TICKET)
        ticket_op = op_id(wf, "ticket")
        ticket = self.step(
            steps.ENSURE_TICKET,
            EnsureTicketInput(
                op_id=ticket_op,
                repository=self.repository,
                issue_number=self.issue,
                title=report.title,
                body=messages.ticket_body(self.state),
            ),
        )
        self.state.ticket = TicketFact(
            op_id=ticket_op, issue_number=ticket.issue_number, comment_id=ticket.comment_id, url=ticket.url
        )
        self.enter(Phase.PROCEDURE)
        procedure = self.step(steps.PREPARE_PROCEDURE, PrepareProcedureInput(run_id=wf, report_body=report.body))
        if procedure.procedure_ref is None and procedure.missing:
            procedure = self.draft_procedure(report)
        if procedure.procedure_ref is None:
            raise PlainRunFailed(f"no usable reproduction procedure: {procedure.error}")
        self.procedure_ref = procedure.procedure_ref
        self.record(procedure.procedure_ref)

        self.enter(Phase.PROVISION)
        self.spec_ref = self.step(
            steps.PREPARE_SPEC,
            PrepareSpecInput(
                run_id=wf,
                op_id=op_id(wf, "spec"),
                repository=self.repository,
                clone_url=report.clone_url,
                base_revision=report.base_revision,
            ),
        )
        self.record(self.spec_ref)
        base = self.reproduce_on(report.base_revision, None, "base", Phase.PROVISION, Phase.REPRODUCE)
        self.state.reproduction = base
        if base.status != ReproductionOutcome.REPRODUCED:
            raise PlainRunFailed(f"the report did not reproduce: {base.status} ({base.detail})")
        self.update_ticket()

        self.enter(Phase.BASELINE)
        baseline_op = op_id(wf, "baseline")
        baseline = self.step(steps.RUN_BASELINE, BaselineInput(run_id=wf, op_id=baseline_op, spec_ref=self.spec_ref))
        self.record(baseline.test_output_ref)
        self.state.baseline = BaselineFact(op_id=baseline_op, **baseline.model_dump())
        if not baseline.runnable or not (baseline.passed or baseline.cases_ref is not None):
            raise PlainRunFailed(f"the baseline does not pass: {baseline.summary}")

        candidate = self.repair(report)
        self.enter(Phase.PUBLISH)
        self.publish(report, candidate)
        self.update_ticket()
        self.review_and_merge()
        self.finish(Outcome.MERGED)
        return self.state

    def draft_procedure(self, report: ReportInfo) -> ProcedureResult:
        drafted = self.step(
            steps.DRAFT_PROCEDURE,
            DraftProcedureInput(
                run_id=self.wf,
                op_id=op_id(self.wf, "draft-procedure"),
                issue_title=report.title,
                issue_body=report.body,
            ),
        )
        self.state.budgets.model_prompt_tokens += drafted.prompt_tokens
        self.state.budgets.model_completion_tokens += drafted.completion_tokens
        return drafted

    def repair(self, report: ReportInfo) -> CandidateFact:
        """Attempt 1 as the stepped agent does it; the happy path has it pass verification."""
        wf = self.wf
        assert self.spec_ref is not None
        budgets = self.state.budgets
        attempt = 1
        self.enter(Phase.REPAIR)
        budgets.repair_attempts_used = attempt
        repair_op = op_id(wf, "repair", attempt)
        token_budget = budgets.model_token_budget - budgets.model_prompt_tokens - budgets.model_completion_tokens
        transcript: ArtifactRef | None = None
        patch: ArtifactRef | None = None
        prompt = completion = 0
        model = ""
        summary: str | None = None
        tools = [*WORKSPACE_TOOLS, *RUN_TOOLS]
        for turn in range(1, AGENT_MAX_TURNS + 1):
            answer = self.step(
                steps.AGENT_TURN,
                AgentTurnInput(
                    run_id=wf,
                    op_id=f"{repair_op}:turn-{turn}",
                    attempt=attempt,
                    turn=turn,
                    issue_title=report.title,
                    issue_body=report.body,
                    previous_failures=[],
                    transcript_ref=transcript,
                    token_budget=token_budget - prompt - completion,
                    tools=tools,
                    patch_ref=patch,
                    compact_above_chars=self.policy.agent_compact_chars,
                    revision=0,
                    review_feedback="",
                    spec_ref=self.spec_ref,
                    reproduction=self.state.reproduction,
                    baseline_summary=self.state.baseline.summary if self.state.baseline else None,
                    earlier_attempts=[],
                ),
            )
            prompt += answer.prompt_tokens
            completion += answer.completion_tokens
            budgets.model_prompt_tokens += answer.prompt_tokens
            budgets.model_completion_tokens += answer.completion_tokens
            model = answer.model
            transcript = answer.transcript_ref
            if not answer.calls:
                summary = answer.summary or "(the model gave no summary)"
                break
            transcript, patch, summary = self.agent_calls(
                report, attempt, turn, repair_op, answer.calls, transcript, patch
            )
            if summary is not None:
                break
        if summary is None:
            raise PlainRunFailed(f"the model used all {AGENT_MAX_TURNS} turns without finishing")
        proposal = self.step(
            steps.AGENT_CONCLUDE,
            AgentConcludeInput(
                run_id=wf,
                op_id=repair_op,
                attempt=attempt,
                spec_ref=self.spec_ref,
                patch_ref=patch,
                transcript_ref=transcript,
                summary=summary,
                prompt_tokens=prompt,
                completion_tokens=completion,
                model=model,
            ),
        )
        self.record(proposal.patch_ref)
        candidate = CandidateFact(
            attempt=attempt,
            op_id=repair_op,
            patch_ref=proposal.patch_ref,
            summary=proposal.summary,
            commit_timestamp=int(datetime.now(UTC).timestamp()),
        )
        self.state.candidates.append(candidate)
        self.enter(Phase.VERIFY)
        failure = self.verify(report, candidate)
        if failure is not None:
            raise PlainRunFailed(f"attempt 1 failed verification: {failure}")
        candidate.verification = VerificationStatus.PASSED
        return candidate

    def agent_calls(
        self,
        report: ReportInfo,
        attempt: int,
        turn: int,
        repair_op: str,
        calls: list[AgentToolCall],
        transcript: ArtifactRef,
        patch: ArtifactRef | None,
    ) -> tuple[ArtifactRef, ArtifactRef | None, str | None]:
        """One turn's calls, segmented as the workflow segments them (:func:`repair.stepping.segments`)."""
        assert self.spec_ref is not None
        summary: str | None = None
        cut = segments([ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in calls])
        for k, segment in enumerate(cut, 1):
            part = [AgentToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in segment.calls]
            suffix = "" if len(cut) == 1 else f"-{k}"
            if segment.run is None:
                ran = self.step(
                    steps.AGENT_TOOLS,
                    AgentToolsInput(
                        run_id=self.wf,
                        op_id=f"{repair_op}:tools-{turn}{suffix}",
                        attempt=attempt,
                        turn=turn,
                        spec_ref=self.spec_ref,
                        transcript_ref=transcript,
                        patch_ref=patch,
                        calls=part,
                    ),
                )
                transcript, patch = ran.transcript_ref, ran.patch_ref
                summary = ran.summary if ran.summary is not None else summary
            elif segment.run == RUN_REPRODUCTION:
                fact = self.reproduce_on(
                    report.base_revision, patch, f"agent-{attempt}-{turn}-{k}", Phase.REPAIR, Phase.REPAIR
                )
                self.enter(Phase.REPAIR)
                shown = {
                    ReproductionOutcome.REPRODUCED: "the bug still shows on your workspace",
                    ReproductionOutcome.NOT_REPRODUCED: "the bug no longer shows on your workspace",
                }.get(fact.status, f"the reproduction ended {fact.status}")
                content = f"{shown}: {fact.detail}" if fact.detail else shown
                transcript = self.step(
                    steps.AGENT_RECORD,
                    AgentRecordInput(
                        run_id=self.wf,
                        attempt=attempt,
                        turn=turn,
                        transcript_ref=transcript,
                        results=[AgentToolResult(id=part[0].id, content=content)],
                    ),
                )
            else:
                done = self.step(
                    steps.AGENT_RUN,
                    AgentRunInput(
                        run_id=self.wf,
                        op_id=f"{repair_op}:run-{turn}-{k}",
                        attempt=attempt,
                        turn=turn,
                        spec_ref=self.spec_ref,
                        transcript_ref=transcript,
                        patch_ref=patch,
                        call=part[0],
                    ),
                )
                transcript = done.transcript_ref
                if done.output_ref is not None:
                    self.record(done.output_ref)
        return transcript, patch, summary

    def verify(self, report: ReportInfo, candidate: CandidateFact) -> str | None:
        assert self.spec_ref is not None
        verified = self.step(
            steps.VERIFY_CANDIDATE,
            VerifyInput(
                run_id=self.wf,
                op_id=op_id(self.wf, "verify", candidate.attempt),
                spec_ref=self.spec_ref,
                patch_ref=candidate.patch_ref,
                message=messages.commit_message(self.state, report.title, candidate.summary),
                commit_timestamp=candidate.commit_timestamp,
                baseline_cases_ref=self.state.baseline.cases_ref if self.state.baseline else None,
                parent_commit=None,
                base_revision=None,
            ),
        )
        candidate.commit = verified.commit
        candidate.tree = verified.tree
        candidate.tests_passed = verified.tests_passed
        candidate.test_summary = verified.test_summary
        candidate.test_output_ref = verified.test_output_ref
        candidate.bundle_ref = verified.bundle_ref
        self.record(verified.test_output_ref)
        self.record(verified.bundle_ref)
        candidate.regression = verified.regression
        for ref in verified.regression.refs if verified.regression else []:
            self.record(ref)
        if not verified.tests_passed:
            return f"tests failed: {verified.test_summary}"
        replay = self.reproduce_on(
            verified.commit, candidate.patch_ref, f"candidate-{candidate.attempt}", Phase.VERIFY, Phase.VERIFY
        )
        candidate.replay = replay
        if replay.status != ReproductionOutcome.NOT_REPRODUCED:
            return f"replay on the candidate was {replay.status}: {replay.detail}"
        return None

    def reproduce_on(
        self, revision: str, patch_ref: ArtifactRef | None, label: str, provisioning: Phase, reproducing: Phase
    ) -> ReproductionFact:
        """Provision, reproduce, tear down (the workflow's first environment attempt; no second one here)."""
        assert self.spec_ref is not None and self.procedure_ref is not None
        env_op = op_id(self.wf, f"env-{label}", 1)
        self.enter(provisioning)
        handle = self.step(
            steps.PROVISION,
            ProvisionInput(
                run_id=self.wf,
                op_id=env_op,
                spec_ref=self.spec_ref,
                patch_ref=patch_ref,
                provider=self.config.environment_provider,
                base_revision=None,
            ),
        )
        repro_op = op_id(self.wf, f"reproduce-{label}", 1)
        self.enter(reproducing)
        result = self.step(
            steps.REPRODUCE,
            ReproduceInput(
                run_id=self.wf,
                op_id=repro_op,
                revision=revision,
                procedure_ref=self.procedure_ref,
                environment=handle,
                spec_ref=self.spec_ref,
            ),
        )
        self.teardown(handle)
        self.state.budgets.reproduction_runs += result.runs
        for ref in result.artifacts:
            self.record(ref)
        return ReproductionFact(
            op_id=repro_op,
            revision=revision,
            status=ReproductionOutcome.of(result.status),
            procedure_ref=self.procedure_ref,
            trace_refs=result.trace_refs,
            screenshot_refs=result.screenshot_refs,
            video_refs=result.video_refs,
            log_ref=result.log_ref,
            detail=result.detail,
        )

    def teardown(self, handle: EnvironmentHandle) -> None:
        self.step(steps.TEARDOWN, handle)

    def publish(self, report: ReportInfo, candidate: CandidateFact) -> None:
        wf = self.wf
        assert candidate.commit is not None and self.procedure_ref is not None and self.spec_ref is not None
        base, replay, baseline = self.state.reproduction, candidate.replay, self.state.baseline
        assert base is not None and replay is not None and candidate.test_output_ref is not None
        assert baseline is not None
        evidence = self.step(
            steps.BUILD_EVIDENCE,
            BuildEvidenceInput(
                run_id=wf,
                repository=self.repository,
                issue_number=self.issue,
                base_revision=report.base_revision,
                candidate_commit=candidate.commit,
                procedure_ref=self.procedure_ref,
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
                spec_ref=self.spec_ref,
                test_summary=candidate.test_summary or "",
                baseline_passed=baseline.passed,
                baseline_summary=baseline.summary,
                baseline_output_ref=baseline.test_output_ref,
                regression=candidate.regression,
            ),
        )
        self.record(evidence.manifest_ref)
        self.record(evidence.report_ref)
        branch = branch_for(wf)
        self.state.publish = publish = PublishFact(
            branch=branch,
            commit=candidate.commit,
            manifest_ref=evidence.manifest_ref,
            report_ref=evidence.report_ref,
            report_url=evidence.report_url,
            evidence_digest=evidence.digest,
        )
        message = messages.commit_message(self.state, report.title, candidate.summary)
        self.step(
            steps.PUBLISH_BRANCH,
            PublishBranchInput(
                op_id=op_id(wf, "push"),
                run_id=wf,
                repository=self.repository,
                clone_url=report.clone_url,
                branch=branch,
                base_revision=report.base_revision,
                patch_ref=candidate.patch_ref,
                expected_commit=candidate.commit,
                message=message,
                commit_timestamp=candidate.commit_timestamp,
                expected_old=None,
                parent_commit=None,
            ),
        )
        pr = self.step(
            steps.ENSURE_DRAFT_PR,
            EnsureDraftPrInput(
                op_id=op_id(wf, "pr"),
                run_id=wf,
                repository=self.repository,
                branch=branch,
                base="main",
                title=messages.pr_title(report.title, self.issue),
                body=messages.pr_body(self.state, candidate, self.policy.closing_keyword),
            ),
        )
        publish.pr_number, publish.pr_url = pr.number, pr.url
        comment = self.step(
            steps.ENSURE_COMMENT,
            EnsureCommentInput(
                repository=self.repository,
                number=pr.number,
                key=f"{wf}:evidence:{candidate.commit}",
                body=messages.evidence_comment(self.state, candidate, evidence),
            ),
        )
        publish.evidence_comment_id = comment.comment_id

    def review_and_merge(self) -> None:
        """The review wait (the operator's approval is at hand: no wait), the PR and base read, the merge."""
        publish = self.state.publish
        assert publish is not None and publish.pr_number is not None
        assert publish.evidence_digest is not None
        self.enter(Phase.AWAITING_REVIEW)
        self.state.pending_approval = ApprovalRequest(
            pr_number=publish.pr_number,
            head_sha=publish.commit,
            evidence_digest=publish.evidence_digest,
            requested_at=datetime.now(UTC),
        )
        self.update_ticket()
        approval = Approval(reviewer=REVIEWER, head_sha=publish.commit, evidence_digest=publish.evidence_digest)
        self.state.approval = approval
        self.state.pending_approval = None
        self.enter(Phase.MERGE)
        pr = self.step(steps.READ_PR, ReadPullInput(repository=self.repository, number=publish.pr_number))
        if pr.merged or pr.state != "open":
            raise PlainRunFailed(f"the PR is {pr.state}, merged {pr.merged}")
        base = self.step(steps.READ_BRANCH, ReadBranchInput(repository=self.repository, branch="main"))
        if base.sha != self.state.target_revision:
            raise PlainRunFailed(f"the base moved to {base.sha}")
        merged = self.step(
            steps.MERGE,
            MergeInput(
                op_id=op_id(self.wf, "merge", 1),
                repository=self.repository,
                number=publish.pr_number,
                approved_sha=approval.head_sha,
                reviewer=approval.reviewer,
                source=approval.source,
                review_id=approval.review_id,
                approval_policy=self.policy.approval_policy,
            ),
        )
        if merged.status not in (MergeStatus.MERGED, MergeStatus.ALREADY_MERGED):
            raise PlainRunFailed(f"the merge answered {merged.status}: {merged.detail}")
        self.state.merged_sha = merged.merged_sha

    def finish(self, outcome: Outcome) -> None:
        self.enter(Phase.CLEANUP)
        cleanup = self.step(steps.CLEANUP_RUN, CleanupRunInput(run_id=self.wf))
        if not cleanup.complete:
            raise PlainRunFailed(f"cleanup left {cleanup.remaining}")
        self.state.outcome = outcome
        self.enter(Phase.DONE)
        # After cleanup, as the run's own: the one write the run's tombstone lets through.
        self.update_ticket(closing=True)

    def update_ticket(self, *, closing: bool = False) -> None:
        ticket = self.state.ticket
        assert ticket is not None
        self.step(
            steps.UPDATE_TICKET,
            UpdateTicketInput(
                repository=self.repository,
                issue_number=ticket.issue_number,
                comment_id=ticket.comment_id,
                op_id=ticket.op_id,
                body=messages.ticket_body(self.state),
                closing=closing,
            ),
        )

    def enter(self, phase: Phase) -> None:
        if self.state.phase != phase:
            self.state.phase = phase
            self.state.timeline.append(PhaseMark(phase=phase, at=datetime.now(UTC)))

    def record(self, ref: ArtifactRef) -> None:
        if all(r.sha256 != ref.sha256 or r.name != ref.name for r in self.state.evidence):
            self.state.evidence.append(ref)


# ---- the two ways, timed ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timed:
    """One run: its wall time, its steps in order, and whether it merged."""

    seconds: float
    steps: list[str]
    merged: bool


class Tax:
    """Both ways on one stack; one :class:`Services` for the plain loop, kept across its runs as the worker
    keeps its own (its browser, its forge clients)."""

    def __init__(self, stack: E2EStack) -> None:
        self.stack = stack
        self.config = stack.config
        self.services = Services(self.config)
        self.activities = registry(self.services)

    def report(self, *, labelled: bool) -> tuple[str, int]:
        repository = self.stack.new_repository()
        return repository, self.stack.open_report(repository, labelled=labelled)

    @asynccontextmanager
    async def workers(self, client: Client, config: DurafixConfig) -> AsyncIterator[None]:
        """The production workers (every queue) in this process for the whole benchmark: like the plain loop's
        one :class:`Services`, their collaborators (the browser, the forge clients) outlive each run. They
        poll idle while the plain loop runs. At the end both ways' browsers are closed: nothing the benchmark
        launched outlives it."""
        served = Services(config)
        with concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="durafix-activity") as pool:
            built = build_workers(client, config, ALL_QUEUES, pool, services=served)
            polling = [asyncio.create_task(w.run()) for w in built]
            try:
                yield
            finally:
                await asyncio.gather(*(w.shutdown() for w in built), return_exceptions=True)
                await asyncio.gather(*polling, return_exceptions=True)
                for services in (served, self.services):
                    if "browser" in services.__dict__:  # launched (a cached property): close it
                        await asyncio.to_thread(services.browser.close)

    async def plain(self) -> Timed:
        # Unlabelled, so that neither the receiver nor its reconciler starts a run for the report.
        repository, issue = self.report(labelled=False)
        run = PlainRun(self.config, self.activities, repository, issue)
        started = time.monotonic()
        # Off the event loop: some adapters drive their own loops (the browser's thread) and block on them.
        state = await asyncio.to_thread(run.run)
        return Timed(time.monotonic() - started, run.calls, state.merged_sha is not None)

    async def temporal(self, client: Client) -> Timed:
        """The run the labelled report's webhook starts, as in the demo (the reconciler would cancel a run whose
        report lost its label, and start one for a labelled report without a run), on the workers of
        :meth:`workers`. Timed by the server, from the execution's start to its close: the webhook's own
        latency is ``bench_webhook_pr``'s to measure."""
        repository, issue = self.report(labelled=True)
        workflow_id = workflow_id_for(repository, issue)
        await self.approve_when_asked(client, workflow_id)
        handle = client.get_workflow_handle(workflow_id, result_type=RunState)
        final = await handle.result()
        desc = await handle.describe()
        assert desc.close_time is not None
        seconds = (desc.close_time - desc.start_time).total_seconds()
        return Timed(seconds, await history_steps(client, workflow_id), final.outcome == Outcome.MERGED)

    @staticmethod
    async def approve_when_asked(client: Client, workflow_id: str, timeout_s: float = 600) -> None:
        """As an operator, approve the head under review as soon as the run asks (read every 0.1 s)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                state = await runs.get_state(client, workflow_id)
            except RPCError:  # the webhook has not started the run yet
                await asyncio.sleep(0.1)
                continue
            pending = state.pending_approval
            if state.outcome is not None:
                raise PlainRunFailed(f"{workflow_id} ended {state.outcome}: {state.outcome_detail}")
            if state.phase == Phase.AWAITING_REVIEW and pending is not None:
                approval = Approval(
                    reviewer=REVIEWER, head_sha=pending.head_sha, evidence_digest=pending.evidence_digest
                )
                ack = await runs.approve(client, workflow_id, approval)
                assert ack.accepted, ack.detail
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{workflow_id} asked for no review within {timeout_s:.0f}s")


async def history_steps(client: Client, workflow_id: str) -> list[str]:
    """The activity types ``workflow_id`` scheduled, in order."""
    names: list[str] = []
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names.append(event.activity_task_scheduled_event_attributes.activity_type.name)
    return names


@dataclass(frozen=True)
class Round:
    plain: Timed
    temporal: Timed


STACK_STARTS = 3


@contextmanager
def e2e_stack(root: Path) -> Iterator[E2EStack]:
    """:func:`~tests.support.e2e_stack.running_e2e_stack` with the e2e tests' model script, in ``root``; started
    again (in a fresh state directory, everything of the failed start stopped) when one of its services is
    not ready in time: on a loaded host the receiver's start can outlast the 30 s it is given."""
    for attempt in range(1, STACK_STARTS + 1):
        state = root / f"state-{attempt}"
        state.mkdir()
        with ExitStack() as started:
            try:
                stack = started.enter_context(
                    running_e2e_stack(state, model_script=combined_model_script(root / "model-script.yaml"))
                )
            except ServiceError as err:
                if attempt == STACK_STARTS:
                    raise
                print(f"the stack did not start ({err}); starting it again", file=sys.stderr, flush=True)
                continue
            yield stack
            return


def bench(rounds: int, *, warm: bool = True) -> list[Round]:
    """``rounds`` rounds (see the module) on one fresh e2e stack, after a warm-up of each way. Synchronous: the
    stack starts and stops outside any event loop (it runs its own)."""
    with tempfile.TemporaryDirectory(prefix="durafix-bench-tax-") as tmp, e2e_stack(Path(tmp)) as stack:
        return asyncio.run(on_stack(stack, rounds, warm=warm))


async def on_stack(stack: E2EStack, rounds: int, *, warm: bool) -> list[Round]:
    tax = Tax(stack)
    client = await runs.connect(stack.config)
    async with tax.workers(client, stack.config):
        return await rounds_of(tax, client, rounds, warm=warm)


async def rounds_of(tax: Tax, client: Client, rounds: int, *, warm: bool) -> list[Round]:
    if warm:
        print("warming up: one run each way (not measured)", file=sys.stderr, flush=True)
        await tax.plain()
        await tax.temporal(client)
    out: list[Round] = []
    for i in range(rounds):
        if i % 2 == 0:
            plain = await tax.plain()
            temporal = await tax.temporal(client)
        else:
            temporal = await tax.temporal(client)
            plain = await tax.plain()
        print(
            f"  round {i + 1}: plain {plain.seconds:.1f}s, temporal {temporal.seconds:.1f}s",
            file=sys.stderr,
            flush=True,
        )
        out.append(Round(plain, temporal))
    return out


def report(results: list[Round], command: str) -> None:
    def med(values: Iterable[float]) -> float:
        return statistics.median(list(values))

    plain = med(r.plain.seconds for r in results)
    temporal = med(r.temporal.seconds for r in results)
    n_steps = len(results[0].temporal.steps)
    same = all(r.plain.steps == r.temporal.steps for r in results)
    print(f"$ {command}")
    print(
        f"the sample app's report (examples/cart) repaired to the merge on the embedded stack; "
        f"medians of {len(results)} round(s)"
    )
    rows: list[tuple[str, str]] = [
        ("steps per run (activities)", f"{n_steps}" + ("" if same else " (the plain loop's differ!)")),
        ("plain loop (ActivityEnvironment, one process)", f"{plain:.2f} s"),
        ("through Temporal (repair_bug, in-process worker)", f"{temporal:.2f} s"),
        ("  temporal / plain", f"{temporal / plain:.3f}x"),
        ("  tax per run", f"{temporal - plain:+.2f} s"),
        ("  tax per step", f"{(temporal - plain) / n_steps * 1000:+.0f} ms"),
        (
            "runs merged (plain / temporal)",
            f"{sum(r.plain.merged for r in results)} / {sum(r.temporal.merged for r in results)}",
        ),
    ]
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    print("(the Temporal figure includes the operator's approval, sent within 0.1 s of the run asking for it)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=None, help=f"rounds (default {DEFAULT_ROUNDS})")
    parser.add_argument("--quick", action="store_true", help="one round")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else DEFAULT_ROUNDS)
    report(bench(rounds), f"python -m tests.bench.bench_tax --rounds {rounds}")


if __name__ == "__main__":
    main()
