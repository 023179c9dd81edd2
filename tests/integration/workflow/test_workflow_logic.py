"""The workflow's state machine on a real Temporal dev server, with recording activity doubles.

These tests pin the workflow's decisions (outcomes, operation IDs, approval rules, cleanup on every ending).
The end-to-end tests in ``tests/e2e`` run the same workflow against the real forge, browser and model.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import Worker

from browser.results import ReproductionStatus
from environments.diagnosis import diagnose
from environments.interface import CleanupReport, EnvironmentHandle, NoAppError, OwnedResource, ResourceKind
from environments.regression import ProofStatus
from environments.reproduction import ReproductionKind
from evidence.interface import ArtifactKind, ArtifactRef
from pipeline import client as runs
from pipeline import steps
from pipeline.failures import NO_PATCH_KIND, WORKER_LOST, FailureClass
from pipeline.flow.candidates import label as candidate_label
from pipeline.hosts import host_queue
from pipeline.ids import attempt_workflow_id
from pipeline.inputs import RepairInput
from pipeline.policies import RunPolicy
from pipeline.state import (
    Approval,
    EnvironmentFailureFact,
    HeadPush,
    Outcome,
    Phase,
    RegressionFact,
    Rejection,
    ReproductionOutcome,
    RunState,
    TriageReason,
)
from pipeline.steps import (
    AgentConcludeInput,
    AgentRecordInput,
    AgentRunInput,
    AgentRunResult,
    AgentToolCall,
    AgentToolsInput,
    AgentToolsResult,
    AgentTurnInput,
    AgentTurnResult,
    BaselineInput,
    BaselineResult,
    BranchHead,
    BuildEvidenceInput,
    CaptureHeadInput,
    CleanupRunInput,
    CommentResult,
    DraftContext,
    DraftContextInput,
    DraftProcedureInput,
    EnsureCommentInput,
    EnsureDraftPrInput,
    EnsureTicketInput,
    EnvironmentReproduceInput,
    EvidenceResult,
    HeadCaptured,
    MergeInput,
    MergeOutcome,
    MergeStatus,
    PrepareProcedureInput,
    PrepareSpecInput,
    ProcedureResult,
    ProposalResult,
    ProposePatchInput,
    ProvisionInput,
    PublishBranchInput,
    PublishResult,
    PullInfo,
    ReadBranchInput,
    ReadPullInput,
    ReadReportInput,
    ReadReviewInput,
    RebuildOnBaseInput,
    RebuiltOnBase,
    RecordRunInput,
    ReportInfo,
    ReproduceInput,
    ReproduceResult,
    ReproductionSeedInput,
    ReproductionSeedResult,
    RequestReviewInput,
    ReviewComment,
    ReviewRead,
    SandboxReproduceInput,
    TaskQueue,
    TicketResult,
    UpdateTicketInput,
    VerifyInput,
    VerifyResult,
)
from pipeline.workflow import RepairBugWorkflow
from repair.procedure_draft import RepositoryFacts
from tests.replay.record import record_history
from tests.support.artifacts import artifact_ref
from tests.support.temporal_workers import pipeline_workers, running

BASE = "a" * 40
CANDIDATE = "c" * 40
# A head someone else pushed to the run's branch (its evidence digest is "f" * 64).
MOVED = "d" * 40

# A lost try is retried at once (the supervisor's failures carry the same almost-zero delay).
QUICK = timedelta(milliseconds=1)


def revised(n: int) -> str:
    """The commit the doubles' verification gives revision ``n``."""
    return str(n + 4) * 40


def ref(name: str, kind: ArtifactKind = ArtifactKind.OTHER) -> ArtifactRef:
    digest = (name.encode().hex() * 64)[:64]
    return artifact_ref(name, key=f"sha256/{digest}", media_type="application/octet-stream", kind=kind, sha256=digest)


@dataclass
class Script:
    """What the doubles answer, and what they saw."""

    reproduces_on_base: bool = True
    fixes_on_attempt: int | None = 1
    merge_answers: list[MergeStatus] = field(default_factory=lambda: [MergeStatus.MERGED])
    fail_spec: bool = False
    # The spec's git fetch keeps failing as a transport error (our machinery, not the report).
    spec_transport_down: bool = False
    # The recipe's tests on the base: (runnable, passed).
    baseline: tuple[bool, bool] = (True, True)
    # The recipe declares no start: provisioning fails as env.provision says so.
    no_app: bool = False
    # The baseline reports per-test results (the recipe names a test_report).
    baseline_cases: bool = False
    # From which attempt verification's regression proof holds (before it: the patch adds no test).
    proven_from_attempt: int = 1
    stuck_resource: str | None = None
    head: str = CANDIDATE
    calls: list[tuple[str, Any]] = field(default_factory=list)
    # The whole states the runs stored as their records (``evidence.record_run``).
    records: list[RunState] = field(default_factory=list)
    live_envs: set[str] = field(default_factory=set)
    # When set, the base reproduction blocks until the event is set and never heartbeats, so a cancellation
    # cannot reach it: it completes normally after the run was cancelled.
    hold_reproduce: asyncio.Event | None = None
    # When set, turn 2 of attempt 1 sets it and then beats until a cancellation reaches it.
    hold_turn: asyncio.Event | None = None
    # How long each successive read of the PR takes (later reads are immediate).
    read_pr_delays_s: list[float] = field(default_factory=list)
    # Attempts whose conclusion is NoPatch of the kind named ("refused" or "no-op").
    no_patch_on_attempt: dict[int, str] = field(default_factory=dict)
    # The tool calls of every batch answered "error: ..." (the batch reports how many).
    invalid_tool_calls: int = 0
    # The checks meant to run side by side (the base reproduction and the baseline, a candidate's tests and its
    # reproduction) each wait, beating, until the other started (10 s at most), their spans kept in ``spans``:
    # run one after the other, the first ends before the second starts.
    rendezvous: bool = False
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)
    started: dict[str, asyncio.Event] = field(default_factory=dict)
    # A candidate's tests fail once its reproduction runs, which beats until a cancellation reaches it.
    tests_fail_beside_reproduction: bool = False
    # The recipe's setup command exits 1 in the baseline's workspace (the baseline answers at once, as a
    # sandbox's setup fails before an image is built) and, with ``base_env_setup_fails``, in the base's
    # environment too, whose provisioning answers only after the baseline's answer was sent: the order in which
    # a baseline's answer would be the first failure of the two.
    baseline_setup_fails: bool = False
    base_env_setup_fails: bool = False

    # Revisions on review fail their tests.
    revision_fails: bool = False
    # A head pushed to the run's branch by someone else fails its tests.
    pushed_head_fails: bool = False
    # The base branch's head when the merge is about to be made, and how the change rebuilds on it.
    base_now: str = BASE
    rebuild: RebuiltOnBase = field(default_factory=lambda: RebuiltOnBase(conflict=False, same_change=True))
    # The tools the first turn of an attempt calls, in order (the second turn finishes).
    turn_one_calls: list[str] = field(default_factory=lambda: ["write_file"])
    # The host stamped on each successive environment provisioned (then none: any host reaches it).
    provision_hosts: list[str] = field(default_factory=list)
    # How many tries of the base reproduction fail as their worker process lost (the supervisor's WorkerLost).
    reproduce_lost: int = 0
    # The try after those lost ones on a host hangs without beating (the host went silent with it).
    reproduce_silent_after_lost: bool = False
    # The kind of reproduction the report's block holds, and whether it is a command reproduction against the app.
    procedure_kind: ReproductionKind = ReproductionKind.BROWSER
    procedure_app: bool = False
    # How many runs of a command reproduction in the environment find it gone (EnvironmentGone, as the step does
    # when the app no longer answers).
    environment_gone: int = 0
    # The report has no reproduction: the model drafts test reproductions, the first this many of which do not
    # show the bug on the base.
    prose_report: bool = False
    drafts_not_reproducing: int = 1

    def names(self) -> list[str]:
        return [n for n, _ in self.calls]


def no_app_failure() -> ApplicationError:
    """What ``env.provision`` raises for a recipe without ``start``: NotReady, its details naming the start the
    recipe does not declare and the diagnosis's hint (no log: nothing ran)."""
    err = NoAppError()
    assert err.failed is not None
    found = diagnose(err.failed, str(err))
    assert found is not None
    fact = EnvironmentFailureFact(stage="start", command="", cause=found.cause.value, hint=found.hint)
    return FailureClass.NOT_READY.error(str(err), {"environment_failure": fact.model_dump(mode="json")})


SETUP = "pip install -r requirements.txt"


def setup_failure(log: str) -> EnvironmentFailureFact:
    """The recipe's setup command failing with exit 1, its output in the stored ``log``."""
    return EnvironmentFailureFact(
        stage="setup", command=SETUP, exit_code=1, log_ref=ref(log, ArtifactKind.LOG), log_url=f"http://logs/{log}"
    )


def setup_not_ready() -> ApplicationError:
    """What ``env.provision`` raises when the recipe's setup fails: NotReady, its details naming the command and
    the environment's stored log (``environment.log``)."""
    fact = setup_failure("environment.log")
    assert fact.log_ref is not None
    details = {"log_ref": fact.log_ref.model_dump(mode="json"), "environment_failure": fact.model_dump(mode="json")}
    return FailureClass.NOT_READY.error(f"setup failed: {SETUP!r} exited 1; its output is in environment.log", details)


def doubles(s: Script) -> dict[TaskQueue, list[Callable[..., Any]]]:
    def began(name: str) -> asyncio.Event:
        event = s.started.setdefault(name, asyncio.Event())
        event.set()
        return event

    async def beat_until(other: str, tries: int = 50) -> None:
        """Beat until the check ``other`` started (``tries`` beats 0.2 s apart at most)."""
        theirs = s.started.setdefault(other, asyncio.Event())
        for _ in range(tries):
            if theirs.is_set():
                return
            activity.heartbeat()
            await asyncio.sleep(0.2)

    async def meet(me: str, other: str) -> None:
        """``me`` ran until ``other`` started (see :attr:`Script.rendezvous`); its span kept."""
        start = time.monotonic()
        began(me)
        await beat_until(other)
        s.spans[me] = (start, time.monotonic())

    @activity.defn(name=steps.READ_REPORT.name)
    async def read_report(i: ReadReportInput) -> ReportInfo:
        s.calls.append(("read_report", i))
        return ReportInfo(title="Cart total wrong", body="steps", author="u", base_revision=BASE, clone_url="x")

    @activity.defn(name=steps.ENSURE_TICKET.name)
    async def ensure_ticket(i: EnsureTicketInput) -> TicketResult:
        s.calls.append(("ensure_ticket", i))
        return TicketResult(issue_number=i.issue_number, comment_id=7, url="http://forge/issue/1#c7")

    @activity.defn(name=steps.UPDATE_TICKET.name)
    async def update_ticket(i: UpdateTicketInput) -> None:
        s.calls.append(("update_ticket", i))

    @activity.defn(name=steps.PUBLISH_BRANCH.name)
    async def publish_branch(i: PublishBranchInput) -> PublishResult:
        s.calls.append(("publish_branch", i))
        return PublishResult(commit=i.expected_commit, pushed=True)

    @activity.defn(name=steps.ENSURE_DRAFT_PR.name)
    async def ensure_draft_pr(i: EnsureDraftPrInput) -> PullInfo:
        s.calls.append(("ensure_draft_pr", i))
        return PullInfo(number=3, url="http://forge/pull/3", head_sha=CANDIDATE, state="open", draft=True, merged=False)

    @activity.defn(name=steps.ENSURE_COMMENT.name)
    async def ensure_comment(i: EnsureCommentInput) -> CommentResult:
        s.calls.append(("ensure_comment", i))
        return CommentResult(comment_id=11, created=True)

    @activity.defn(name=steps.READ_PR.name)
    async def read_pr(i: ReadPullInput) -> PullInfo:
        s.calls.append(("read_pr", i))
        if s.read_pr_delays_s:
            await asyncio.sleep(s.read_pr_delays_s.pop(0))
        return PullInfo(number=3, url="u", head_sha=s.head, state="open", draft=True, merged=False)

    @activity.defn(name=steps.MERGE.name)
    async def merge(i: MergeInput) -> MergeOutcome:
        s.calls.append(("merge", i))
        status = s.merge_answers.pop(0)
        if status == MergeStatus.HEAD_MOVED:
            s.head = MOVED  # someone pushed to the branch after the approval
        return MergeOutcome(status=status, merged_sha="m" * 40 if status == MergeStatus.MERGED else None)

    @activity.defn(name=steps.PREPARE_SPEC.name)
    async def prepare_spec(i: PrepareSpecInput) -> ArtifactRef:
        s.calls.append(("prepare_spec", i))
        if s.fail_spec:
            raise FailureClass.PERMANENT.error("durafix.yaml is missing")
        if s.spec_transport_down:
            raise FailureClass.TRANSIENT.error("git: RPC failed; curl 52 Empty reply from server")
        return ref("spec", ArtifactKind.SPEC)

    @activity.defn(name=steps.PROVISION.name)
    async def provision(i: ProvisionInput) -> EnvironmentHandle:
        s.calls.append(("provision", i))
        if s.no_app:
            raise no_app_failure()
        if s.base_env_setup_fails and ":env-base:" in i.op_id:
            await beat_until("baseline-answered")
            await beat_until("never", tries=5)  # the baseline's answer reaches the workflow first
            raise setup_not_ready()
        s.live_envs.add(i.op_id)
        host = s.provision_hosts.pop(0) if s.provision_hosts else ""
        return EnvironmentHandle(
            env_id=i.op_id, provider="fake", run_id=i.run_id, op_id=i.op_id, base_url="http://x", host=host
        )

    @activity.defn(name=steps.TEARDOWN.name)
    async def teardown(h: EnvironmentHandle) -> CleanupReport:
        s.calls.append(("teardown", h))
        s.live_envs.discard(h.env_id)
        return CleanupReport(run_id=h.run_id)

    @activity.defn(name=steps.VERIFY_CANDIDATE.name)
    async def verify(i: VerifyInput) -> VerifyResult:
        s.calls.append(("verify", i))
        if ":base-verify:" in i.op_id:
            return VerifyResult(
                commit="b" * 40,
                tree="r" * 40,
                tests_passed=True,
                test_summary="3 passed",
                test_output_ref=ref("tests-base"),
                bundle_ref=ref("bundle-base"),
            )
        if ":head-verify:" in i.op_id:
            # A pushed head (base + its whole change) rebuilds the head's tree as captured.
            return VerifyResult(
                commit="9" * 40,
                tree="t" * 40,
                tests_passed=not s.pushed_head_fails,
                test_summary="1 failed, 2 passed" if s.pushed_head_fails else "3 passed",
                test_output_ref=ref("tests-head"),
                bundle_ref=ref("bundle-head"),
                regression=RegressionFact(status=ProofStatus.PROVEN, summary="proven"),
            )
        proven = int(i.op_id.rsplit(":", 1)[-1]) >= s.proven_from_attempt
        revision = int(i.op_id.rsplit(":", 1)[-1]) if ":revision-verify:" in i.op_id else 0
        if s.rendezvous:
            await meet("tests", "candidate-reproduce")
        if s.tests_fail_beside_reproduction:
            await beat_until("candidate-reproduce")
        return VerifyResult(
            commit=revised(revision) if revision else CANDIDATE,
            tree="t" * 40,
            tests_passed=not (revision and s.revision_fails) and not s.tests_fail_beside_reproduction,
            test_summary="3 passed",
            test_output_ref=ref("tests"),
            bundle_ref=ref("bundle"),
            regression=RegressionFact(
                status=ProofStatus.PROVEN if proven else ProofStatus.NO_TESTS,
                summary="proven" if proven else "the patch adds or changes no test file",
                test_files=["tests/test_cart.py"] if proven else [],
                base_output_ref=ref("regression-base") if proven else None,
            ),
        )

    @activity.defn(name=steps.CAPTURE_HEAD.name)
    async def capture_head(i: CaptureHeadInput) -> HeadCaptured:
        s.calls.append(("capture_head", i))
        return HeadCaptured(
            head_sha=i.head_sha,
            patch_ref=ref(f"head-{i.head_sha[:4]}", ArtifactKind.PATCH),
            tree="t" * 40,
            parents=[CANDIDATE],
            message="maintainer's change",
            committed_at=1_700_000_000,
            descends_from_base=True,
            empty=False,
        )

    @activity.defn(name=steps.REBUILD_ON_BASE.name)
    async def rebuild_on_base(i: RebuildOnBaseInput) -> RebuiltOnBase:
        s.calls.append(("rebuild_on_base", i))
        if s.rebuild.conflict:
            return s.rebuild
        return s.rebuild.model_copy(update={"patch_ref": ref("rebuilt", ArtifactKind.PATCH), "tree": "r" * 40})

    @activity.defn(name=steps.READ_BRANCH.name)
    async def read_branch(i: ReadBranchInput) -> BranchHead:
        s.calls.append(("read_branch", i))
        return BranchHead(sha=s.base_now)

    @activity.defn(name=steps.RUN_BASELINE.name)
    async def run_baseline(i: BaselineInput) -> BaselineResult:
        s.calls.append(("baseline", i))
        if s.rendezvous:
            await meet("baseline", "base-reproduce")
        if s.baseline_setup_fails:
            began("baseline-answered")
            return BaselineResult(
                runnable=False,
                passed=False,
                summary=f"setup failed: {SETUP!r} exited 1",
                test_output_ref=ref("baseline-tests.log", ArtifactKind.TEST_OUTPUT),
                environment_failure=setup_failure("baseline-tests.log"),
            )
        runnable, passed = s.baseline
        summary = (
            "passed"
            if passed
            else ("could not run (not found or not executable), exit 127" if not runnable else "failed")
        )
        return BaselineResult(
            runnable=runnable,
            passed=passed,
            summary=summary,
            test_output_ref=ref("baseline"),
            cases_ref=ref("baseline-cases") if s.baseline_cases else None,
        )

    @activity.defn(name=steps.RECORD_RUN.name)
    async def record_run(i: RecordRunInput) -> ArtifactRef:
        s.calls.append(("record_run", i))
        s.records.append(i.state)
        return ref("run-record")

    @activity.defn(name=steps.CLEANUP_RUN.name)
    async def cleanup_run(i: CleanupRunInput) -> CleanupReport:
        s.calls.append(("cleanup_run", i))
        removed = [
            OwnedResource(kind=ResourceKind.PROCESS, provider="fake", resource_id=e, run_id=i.run_id, op_id=e)
            for e in sorted(s.live_envs)
        ]
        s.live_envs.clear()
        remaining = []
        if s.stuck_resource:
            remaining.append(
                OwnedResource(
                    kind=ResourceKind.CONTAINER,
                    provider="fake",
                    resource_id=s.stuck_resource,
                    run_id=i.run_id,
                    op_id="x",
                )
            )
        errors = ["refused to stop"] if remaining else []
        return CleanupReport(run_id=i.run_id, removed=removed, remaining=remaining, errors=errors)

    @activity.defn(name=steps.BUILD_EVIDENCE.name)
    async def build(i: BuildEvidenceInput) -> EvidenceResult:
        s.calls.append(("build_evidence", i))
        digest = "f" * 64 if i.candidate_commit == MOVED else "e" * 64
        return EvidenceResult(
            manifest_ref=ref("manifest"), report_ref=ref("report"), digest=digest, report_url="http://r"
        )

    @activity.defn(name=steps.DRAFT_CONTEXT.name)
    async def draft_context(i: DraftContextInput) -> DraftContext:
        s.calls.append(("draft_context", i))
        kinds = [ReproductionKind.COMMAND, ReproductionKind.TEST]
        return DraftContext(kinds=kinds, facts=RepositoryFacts(ecosystem="python", test_subset="pytest {ids}"))

    @activity.defn(name=steps.DRAFT_PROCEDURE.name)
    async def draft_procedure(i: DraftProcedureInput) -> ProcedureResult:
        s.calls.append(("draft_procedure", i))
        n = len(i.previous) + 1
        return ProcedureResult(
            procedure_ref=ref(f"draft-{n}", ArtifactKind.PROCEDURE),
            drafted=True,
            kind=ReproductionKind.TEST,
            prompt_tokens=10,
            completion_tokens=5,
            drafted_yaml=f"draft {n}",
            described=f"the test tests/test_issue_{n}.py",
        )

    @activity.defn(name=steps.PREPARE_PROCEDURE.name)
    async def prepare_procedure(i: PrepareProcedureInput) -> ProcedureResult:
        s.calls.append(("prepare_procedure", i))
        if s.prose_report:
            return ProcedureResult(procedure_ref=None, error="the report has no block", missing=True)
        return ProcedureResult(
            procedure_ref=ref("procedure", ArtifactKind.PROCEDURE), kind=s.procedure_kind, app=s.procedure_app
        )

    @activity.defn(name=steps.REPRODUCTION_SEED.name)
    async def reproduction_seed(i: ReproductionSeedInput) -> ReproductionSeedResult:
        s.calls.append(("reproduction_seed", i))
        return ReproductionSeedResult(
            patch_ref=ref("seed", ArtifactKind.PATCH), files=["tests/test_issue.py"], tests=["tests/test_issue.py"]
        )

    @activity.defn(name=steps.REPRODUCE.name)
    async def reproduce(i: ReproduceInput) -> ReproduceResult:
        s.calls.append(("reproduce", i))
        on_base = i.revision == BASE
        if on_base and s.reproduce_lost:
            s.reproduce_lost -= 1
            raise ApplicationError("browser.reproduce: worker process died", type=WORKER_LOST, next_retry_delay=QUICK)
        if on_base and s.reproduce_silent_after_lost:
            s.reproduce_silent_after_lost = False
            await asyncio.sleep(3600)  # no heartbeat: the attempt times out on its heartbeat
        if on_base and s.hold_reproduce is not None:
            await s.hold_reproduce.wait()
        if s.rendezvous:
            await meet("base-reproduce", "baseline") if on_base else await meet("candidate-reproduce", "tests")
        if not on_base and s.tests_fail_beside_reproduction:
            began("candidate-reproduce")
            try:
                await beat_until("never", tries=300)
            except asyncio.CancelledError:
                s.calls.append(("reproduce_cancelled", i))
                raise
        result = reproduced(i.op_id, on_base)
        if s.rendezvous:  # its log, tagged with the revision it was asked to run as
            log = ref(f"log-{i.op_id}", ArtifactKind.LOG).model_copy(update={"revision": i.revision})
            result = result.model_copy(update={"artifacts": [log], "log_ref": log})
        return result

    def reproduced(op_id: str, on_base: bool) -> ReproduceResult:
        attempt = int(op_id.split("candidate-")[1].split(":")[0]) if "candidate-" in op_id else 0
        if "revision-" in op_id or ":reproduce-head-" in op_id or ":reproduce-base-" in op_id:
            present = False
        elif ":reproduce-draft-" in op_id:
            present = int(op_id.split(":reproduce-draft-")[1].split(":")[0]) > s.drafts_not_reproducing
        elif on_base:
            present = s.reproduces_on_base
        else:
            present = s.fixes_on_attempt is None or attempt < s.fixes_on_attempt
        status = ReproductionStatus.REPRODUCED if present else ReproductionStatus.NOT_REPRODUCED
        return ReproduceResult(status=status, detail="", artifacts=[], trace_refs=[], screenshot_refs=[], runs=1)

    @activity.defn(name=steps.REPRODUCE_IN_SANDBOX.name)
    async def reproduce_in_sandbox(i: SandboxReproduceInput) -> ReproduceResult:
        s.calls.append(("reproduce", i))
        return reproduced(i.op_id, i.revision == BASE)

    @activity.defn(name=steps.REPRODUCE_IN_ENVIRONMENT.name)
    async def reproduce_in_environment(i: EnvironmentReproduceInput) -> ReproduceResult:
        s.calls.append(("reproduce_in_environment", i))
        assert i.environment.env_id in s.live_envs, "reproduced in an environment that is not provisioned"
        if s.environment_gone:
            s.environment_gone -= 1
            raise FailureClass.ENVIRONMENT_GONE.error(f"{i.environment.env_id} does not answer at http://x")
        return reproduced(i.op_id, i.revision == BASE)

    @activity.defn(name=steps.PROPOSE_PATCH.name)
    async def propose(i: ProposePatchInput) -> ProposalResult:
        s.calls.append(("propose", i))
        return ProposalResult(
            patch_ref=ref(f"patch-{i.attempt}", ArtifactKind.PATCH),
            summary="multiply by quantity",
            files_changed=["cart.py"],
            prompt_tokens=100,
            completion_tokens=20,
            model="m",
        )

    @activity.defn(name=steps.AGENT_TURN.name)
    async def agent_turn(i: AgentTurnInput) -> AgentTurnResult:
        """Turn 1 asks for one edit; turn 2 finishes without a call. The first turn of an attempt is what the
        old single activity was: the request for a proposal (recorded as ``propose``)."""
        s.calls.append(("propose" if i.transcript_ref is None else "agent_turn", i))
        if s.hold_turn is not None and (i.attempt, i.turn) == (1, 2):
            s.hold_turn.set()
            while True:
                activity.heartbeat()
                await asyncio.sleep(0.2)
        calls = (
            [AgentToolCall(id=f"c{n}", name=name, arguments="{}") for n, name in enumerate(s.turn_one_calls, 1)]
            if i.turn == 1
            else []
        )
        return AgentTurnResult(
            transcript_ref=ref(f"transcript-{i.attempt}-{i.turn}"),
            calls=calls,
            summary=None if calls else "multiply by quantity",
            prompt_tokens=50,
            completion_tokens=10,
            model="m",
        )

    @activity.defn(name=steps.AGENT_TOOLS.name)
    async def agent_tools(i: AgentToolsInput) -> AgentToolsResult:
        s.calls.append(("agent_tools", i))
        return AgentToolsResult(
            transcript_ref=ref(f"transcript-{i.attempt}-{i.turn}-tools"),
            patch_ref=ref(f"patch-{i.attempt}", ArtifactKind.PATCH),
            files_changed=["cart.py"],
            invalid_calls=s.invalid_tool_calls,
        )

    @activity.defn(name=steps.AGENT_RUN.name)
    async def agent_run(i: AgentRunInput) -> AgentRunResult:
        s.calls.append(("agent_run", i))
        return AgentRunResult(
            transcript_ref=ref(f"transcript-{i.attempt}-{i.turn}-run"), output_ref=ref(f"run-{i.op_id}")
        )

    @activity.defn(name=steps.AGENT_RECORD.name)
    async def agent_record(i: AgentRecordInput) -> ArtifactRef:
        s.calls.append(("agent_record", i))
        return ref(f"transcript-{i.attempt}-{i.turn}-record")

    @activity.defn(name=steps.AGENT_CONCLUDE.name)
    async def agent_conclude(i: AgentConcludeInput) -> ProposalResult:
        s.calls.append(("agent_conclude", i))
        if (kind := s.no_patch_on_attempt.get(i.attempt)) is not None:
            raise FailureClass.NO_PATCH.error(f"no patch ({kind})", {}, {NO_PATCH_KIND: kind})
        assert i.patch_ref is not None
        return ProposalResult(
            patch_ref=i.patch_ref,
            summary=i.summary,
            files_changed=["cart.py"],
            prompt_tokens=i.prompt_tokens,
            completion_tokens=i.completion_tokens,
            model=i.model,
        )

    @activity.defn(name=steps.READ_REVIEW.name)
    async def read_review(i: ReadReviewInput) -> ReviewRead:
        s.calls.append(("read_review", i))
        return ReviewRead(
            review_id=i.review_id,
            reviewer="rev",
            state="CHANGES_REQUESTED",
            body="name the rule in a comment",
            commit_id=CANDIDATE,
            comments=[ReviewComment(path="cart.py", line=12, body="say why line_total")],
        )

    @activity.defn(name=steps.REQUEST_REVIEW.name)
    async def request_review(i: RequestReviewInput) -> None:
        s.calls.append(("request_review", i))

    return {
        TaskQueue.FORGE: [
            read_review,
            request_review,
            read_report,
            ensure_ticket,
            update_ticket,
            publish_branch,
            ensure_draft_pr,
            ensure_comment,
            read_pr,
            read_branch,
            merge,
        ],
        TaskQueue.ENVIRONMENTS: [
            prepare_spec,
            provision,
            teardown,
            verify,
            capture_head,
            rebuild_on_base,
            run_baseline,
            cleanup_run,
            build,
            agent_run,
            record_run,
            reproduction_seed,
            reproduce_in_sandbox,
            reproduce_in_environment,
            draft_context,
        ],
        TaskQueue.BROWSER: [prepare_procedure, reproduce],
        TaskQueue.MODEL: [propose, agent_turn, agent_tools, agent_record, agent_conclude, draft_procedure],
    }


@dataclass
class Harness:
    client: Client
    script: Script
    started: list[str] = field(default_factory=list)

    async def start(self, issue: int | None = None, **policy: Any) -> str:
        issue = issue or (uuid.uuid4().int % 1_000_000) + 1
        wf_id = f"repair:acme/shop#{issue}"
        self.started.append(wf_id)
        await self.client.start_workflow(
            RepairBugWorkflow.run,
            RepairInput(repository="acme/shop", issue_number=issue, policy=RunPolicy.fast().model_copy(update=policy)),
            id=wf_id,
            task_queue=TaskQueue.ORCHESTRATION.value,
            execution_timeout=timedelta(minutes=2),
        )
        return wf_id

    async def state(self, wf_id: str) -> RunState:
        return await self.client.get_workflow_handle(wf_id).query(RepairBugWorkflow.state)

    async def wait_phase(self, wf_id: str, phase: Phase, timeout: float = 30) -> RunState:
        for _ in range(int(timeout * 10)):
            st = await self.state(wf_id)
            if st.phase == phase:
                return st
            await asyncio.sleep(0.1)
        raise AssertionError(f"{wf_id} never reached {phase}; last {st.phase}")

    async def ended(self, wf_id: str, timeout: float = 30) -> WorkflowExecutionStatus | None:
        """The run's status once it is no longer running (or still running after ``timeout``)."""
        handle = self.client.get_workflow_handle(wf_id)
        for _ in range(int(timeout * 10)):
            status = (await handle.describe()).status
            if status != WorkflowExecutionStatus.RUNNING:
                return status
            await asyncio.sleep(0.1)
        return status

    async def terminate_running(self) -> None:
        """End every run this harness started that still runs: the session's server is shared by the process's
        later tests, and one that lists open runs (the reconciler's) would meet a run nobody serves any more."""
        for wf_id in self.started:
            handle = self.client.get_workflow_handle(wf_id)
            with contextlib.suppress(RPCError):
                if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                    await handle.terminate("the test that started it is over")

    async def result(self, wf_id: str) -> RunState:
        final: RunState = await self.client.get_workflow_handle(wf_id, result_type=RunState).result()
        return final


@pytest.fixture
async def harness(temporal_client: Client) -> AsyncIterator[Harness]:
    script = Script()
    async with running(pipeline_workers(temporal_client, doubles(script))):
        harness = Harness(temporal_client, script)
        try:
            yield harness
        finally:
            await harness.terminate_running()


async def approve(
    h: Harness, wf_id: str, sha: str = CANDIDATE, review_id: str = "r1", expires_at: datetime | None = None
) -> Any:
    return await h.client.get_workflow_handle(wf_id).execute_update(
        RepairBugWorkflow.approve,
        Approval(reviewer="rev", head_sha=sha, review_id=review_id, expires_at=expires_at),
        id=f"approve:{review_id}",
    )


async def run_approved(h: Harness) -> tuple[str, RunState]:
    """Start a run, approve the head it asks a review of (:data:`CANDIDATE`) once it waits at review, and wait
    for the run's end: its workflow ID and final state."""
    wf = await h.start()
    await h.wait_phase(wf, Phase.AWAITING_REVIEW)
    await approve(h, wf)
    return wf, await h.result(wf)


async def test_happy_path_merges_the_approved_head_and_cleans_up(harness: Harness) -> None:
    wf = await harness.start()
    st = await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
    assert st.pending_approval is not None and st.pending_approval.head_sha == CANDIDATE
    await approve(harness, wf)
    final = await harness.result(wf)
    assert final.outcome == Outcome.MERGED
    assert final.merged_sha == "m" * 40
    merges = [c for n, c in harness.script.calls if n == "merge"]
    assert [m.approved_sha for m in merges] == [CANDIDATE]
    assert merges[0].op_id == f"{wf}:merge:1"
    ticket = next(c for n, c in harness.script.calls if n == "ensure_ticket")
    assert ticket.op_id == f"{wf}:ticket"
    assert final.cleanup is not None and final.cleanup.complete
    assert harness.script.live_envs == set()


def overlap(spans: dict[str, tuple[float, float]], a: str, b: str) -> bool:
    """Whether the recorded spans of checks ``a`` and ``b`` overlap."""
    (a_start, a_end), (b_start, b_end) = spans[a], spans[b]
    return a_start < b_end and b_start < a_end


async def test_independent_checks_run_side_by_side_and_keep_their_own_verdicts(harness: Harness) -> None:
    """The baseline runs beside the base reproduction, and a candidate's tests beside its reproduction replayed:
    their activities' own recorded spans overlap (each waits for the other to start, so one after the other the
    first would end before the second starts). Each check's verdict is recorded as before; the replay, started
    before the candidate's commit existed, is recorded as of that commit, its stored output too."""
    harness.script.rendezvous = True
    wf = await harness.start()
    await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
    spans = harness.script.spans
    assert overlap(spans, "baseline", "base-reproduce"), spans
    assert overlap(spans, "tests", "candidate-reproduce"), spans
    await approve(harness, wf)
    final = await harness.result(wf)
    assert final.outcome == Outcome.MERGED and final.checks_beside == []
    assert final.reproduction is not None and final.reproduction.status == ReproductionOutcome.REPRODUCED
    assert final.reproduction.revision == BASE
    assert final.baseline is not None and final.baseline.passed
    (candidate,) = final.candidates
    assert candidate.tests_passed and candidate.commit == CANDIDATE and candidate.failure is None
    replay = candidate.replay
    assert replay is not None and replay.status == ReproductionOutcome.NOT_REPRODUCED
    assert replay.revision == CANDIDATE and replay.log_ref is not None and replay.log_ref.revision == CANDIDATE
    asked = [c for n, c in harness.script.calls if n == "reproduce" and c.revision != BASE]
    assert [c.revision for c in asked] == [""]  # run before the commit was made
    kept = [r for r in final.evidence if r.name == replay.log_ref.name]
    assert [r.revision for r in kept] == [CANDIDATE]
    record_history(await harness.client.get_workflow_handle(wf).fetch_history(), "checks-side-by-side")


async def test_a_failing_test_run_cancels_the_candidate_reproduction_which_tears_its_environment_down(
    harness: Harness,
) -> None:
    """The candidate's tests fail while its reproduction runs beside them: the reproduction is cancelled, its
    environment torn down at once (not left to the run's cleanup), and the candidate's verdict is its tests'
    (no replay recorded, nothing twice)."""
    harness.script.tests_fail_beside_reproduction = True
    final = await harness.result(await harness.start(max_repair_attempts=1))
    assert final.outcome == Outcome.REPAIR_BUDGET_EXHAUSTED, final.outcome_detail
    (candidate,) = final.candidates
    assert candidate.tests_passed is False and candidate.replay is None
    assert candidate.failure is not None and candidate.failure.startswith("tests failed")
    names = harness.script.names()
    env = f"{final.workflow_id}:env-{candidate_label(candidate)}:1"
    teardowns = [n for n, (name, c) in enumerate(harness.script.calls) if name == "teardown" and c.env_id == env]
    assert len(teardowns) == 1 and names.index("reproduce_cancelled") < teardowns[0] < names.index("cleanup_run")
    asked = [c for n, c in harness.script.calls if n == "reproduce" and c.revision != BASE]
    assert len(asked) == 1
    assert len({(r.sha256, r.name) for r in final.evidence}) == len(final.evidence)


async def answered(harness: Harness, wf: str, step: steps.Step[Any, Any]) -> int:
    """The index in the run's history of the first answer (completed or failed) to an activity of ``step``."""
    events = [e async for e in harness.client.get_workflow_handle(wf).fetch_history_events()]
    scheduled = {
        e.event_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == step.name
    }
    for n, e in enumerate(events):
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            answer = e.activity_task_completed_event_attributes.scheduled_event_id
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            answer = e.activity_task_failed_event_attributes.scheduled_event_id
        else:
            continue
        if answer in scheduled:
            return n
    raise AssertionError(f"{step.name} was never answered")


async def test_a_broken_setup_ends_the_run_on_the_environments_cause_though_the_baseline_failed_on_it_first(
    harness: Harness,
) -> None:
    """The recipe's setup fails: the baseline beside the base reproduction answers first that its setup failed,
    then the base's provisioning fails on the same command. The run ends as it did when the baseline ran after
    the reproduction: on the environment's cause, its log `environment.log`; the baseline is no result of the
    run (not recorded, its log not among the evidence), the model never asked, everything cleaned up."""
    harness.script.baseline_setup_fails = harness.script.base_env_setup_fails = True
    wf = await harness.start()
    final = await harness.result(wf)
    assert await answered(harness, wf, steps.RUN_BASELINE) < await answered(harness, wf, steps.PROVISION)
    assert final.outcome == Outcome.NEEDS_HUMAN_TRIAGE, final.outcome_detail
    assert "could not be set up" in final.outcome_detail and "its output is in environment.log" in final.outcome_detail
    assert final.triage is not None and final.triage.reason == TriageReason.ENVIRONMENT_NOT_SET_UP
    failed = final.triage.environment
    assert failed is not None and failed.log_ref is not None and failed.log_ref.name == "environment.log", failed
    assert final.reproduction is not None and final.reproduction.status == ReproductionOutcome.APP_NOT_READY
    assert final.baseline is None and final.phase == Phase.DONE
    assert "baseline-tests.log" not in {r.name for r in final.evidence}
    closing = [c for n, c in harness.script.calls if n == "update_ticket"][-1]
    assert "environment.log" in closing.body and "baseline-tests.log" not in closing.body, closing.body
    assert "propose" not in harness.script.names() and "agent_turn" not in harness.script.names()
    assert final.cleanup is not None and final.cleanup.complete
    record_history(await harness.client.get_workflow_handle(wf).fetch_history(), "checks-side-by-side-setup-fails")


async def test_a_baseline_whose_setup_failed_beside_a_reproduction_that_showed_the_bug_ends_the_run_after_it(
    harness: Harness,
) -> None:
    """Only the baseline's setup fails (the base's environment is set up and the bug reproduces): the baseline's
    answer, held while the reproduction ran, is then the run's: recorded, its log the triage's, the run ended in
    the baseline's phase before any model request, as when the baseline ran after the reproduction."""
    harness.script.baseline_setup_fails = True
    final = await harness.result(await harness.start())
    assert final.outcome == Outcome.NEEDS_HUMAN_TRIAGE, final.outcome_detail
    assert "tests cannot run on the base revision" in final.outcome_detail
    assert final.reproduction is not None and final.reproduction.status == ReproductionOutcome.REPRODUCED
    assert final.baseline is not None and not final.baseline.runnable
    assert final.triage is not None and final.triage.reason == TriageReason.ENVIRONMENT_NOT_SET_UP
    assert final.triage.environment is not None and final.triage.environment.log_ref is not None
    assert final.triage.environment.log_ref.name == "baseline-tests.log"
    assert "baseline-tests.log" in {r.name for r in final.evidence}
    assert "propose" not in harness.script.names() and "agent_turn" not in harness.script.names()
    assert final.cleanup is not None and final.cleanup.complete


async def test_report_that_does_not_reproduce_needs_triage_and_opens_no_pr(harness: Harness) -> None:
    harness.script.reproduces_on_base = False
    final = await harness.result(await harness.start())
    assert final.outcome == Outcome.NEEDS_HUMAN_TRIAGE
    assert "did not reproduce" in final.outcome_detail
    assert "ensure_draft_pr" not in harness.script.names()
    assert "propose" not in harness.script.names()
    # The closing ticket update is the last effect; the run then stores its record.
    assert harness.script.names()[-2:] == ["update_ticket", "record_run"]


@pytest.mark.parametrize(
    ("baseline", "said"),
    [((False, False), "cannot run on the base revision"), ((True, False), "already fail on the base revision")],
)
async def test_tests_that_cannot_run_or_fail_on_the_base_end_in_triage_before_any_model_call(
    harness: Harness, baseline: tuple[bool, bool], said: str
) -> None:
    harness.script.baseline = baseline
    final = await harness.result(await harness.start())
    assert final.outcome == Outcome.NEEDS_HUMAN_TRIAGE
    assert said in final.outcome_detail
    assert final.baseline is not None and (final.baseline.runnable, final.baseline.passed) == baseline
    assert "propose" not in harness.script.names()
    assert [c.op_id for n, c in harness.script.calls if n == "baseline"] == [f"{final.workflow_id}:baseline"]
    assert any(p.phase == Phase.BASELINE for p in final.timeline)
    assert final.cleanup is not None and final.cleanup.complete


async def test_a_recipe_without_start_ends_in_triage_naming_what_to_add_before_any_reproduction(
    harness: Harness,
) -> None:
    """The base's provisioning fails because the recipe declares no ``start``: the run ends in triage with the
    environment reason, saying the recipe declares none and the hint; provisioned once (not retried), nothing
    reproduced, no model asked, cleaned up. The baseline runs beside the base's provisioning (its result is the
    run's own record), so it may have run."""
    harness.script.no_app = True
    final = await harness.result(await harness.start())
    assert final.outcome == Outcome.NEEDS_HUMAN_TRIAGE, final.outcome_detail
    assert final.outcome_detail.endswith("so the report was not tried: durafix.yaml declares no `start`")
    assert final.triage is not None and final.triage.reason == TriageReason.ENVIRONMENT_NOT_SET_UP
    failed = final.triage.environment
    assert failed is not None and (failed.stage, failed.command, failed.cause) == ("start", "", "no-app")
    assert "add `start`" in failed.hint and "reproduce with a command or test" in failed.hint
    assert harness.script.names().count("provision") == 1
    assert not {"reproduce", "propose"} & set(harness.script.names())
    closing = [c for n, c in harness.script.calls if n == "update_ticket"][-1]
    assert "failed: durafix.yaml declares no `start`" in closing.body and "hint: this reproduction" in closing.body
    assert final.cleanup is not None and final.cleanup.complete


async def approved_run(harness: Harness, **policy: Any) -> RunState:
    """Start a run, approve it at the review wait, and wait for its end."""
    wf = await harness.start(**policy)
    await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
    await approve(harness, wf)
    return await harness.result(wf)


async def test_a_failing_base_with_per_test_results_is_repaired_and_judged_against_those_results(
    harness: Harness,
) -> None:
    harness.script.baseline, harness.script.baseline_cases = (True, False), True
    final = await approved_run(harness)
    assert final.outcome == Outcome.MERGED
    assert final.baseline is not None and final.baseline.cases_ref is not None
    verifies = [c for n, c in harness.script.calls if n == "verify"]
    assert verifies and all(v.baseline_cases_ref == final.baseline.cases_ref for v in verifies)


async def test_the_policy_asking_for_a_regression_test_fails_a_candidate_without_one(harness: Harness) -> None:
    harness.script.proven_from_attempt = 2
    final = await approved_run(harness, require_regression_test=True)
    assert final.outcome == Outcome.MERGED
    assert [c.verification for c in final.candidates] == ["failed", "passed"]
    assert final.candidates[0].failure is not None and "no regression test" in final.candidates[0].failure
    proposals = [c for n, c in harness.script.calls if n == "propose"]
    assert "no regression test" in proposals[1].previous_failures[0]
    last = final.candidates[1].regression
    assert last is not None and last.status == ProofStatus.PROVEN


async def test_without_the_policy_a_candidate_without_a_regression_test_passes(harness: Harness) -> None:
    harness.script.proven_from_attempt = 99
    final = await approved_run(harness)
    assert final.outcome == Outcome.MERGED and [c.verification for c in final.candidates] == ["passed"]
    assert final.candidates[0].regression is not None
    assert final.candidates[0].regression.status == ProofStatus.NO_TESTS


async def test_repair_that_never_verifies_exhausts_the_budget(harness: Harness) -> None:
    harness.script.fixes_on_attempt = None
    final = await harness.result(await harness.start(max_repair_attempts=2))
    assert final.outcome == Outcome.REPAIR_BUDGET_EXHAUSTED
    assert [c.verification for c in final.candidates] == ["failed", "failed"]
    assert "publish_branch" not in harness.script.names()
    proposals = [c for n, c in harness.script.calls if n == "propose"]
    assert proposals[1].previous_failures and "still reproduces" in proposals[1].previous_failures[0]


async def test_same_approval_twice_is_recorded_once(harness: Harness) -> None:
    wf = await harness.start()
    await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
    first = await approve(harness, wf, review_id="42")
    second = await approve(harness, wf, review_id="42")
    assert first == second
    final = await harness.result(wf)
    assert final.outcome == Outcome.MERGED
    assert harness.script.names().count("merge") == 1


async def test_approval_of_another_head_is_refused(harness: Harness) -> None:
    wf = await harness.start()
    await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
    with pytest.raises(WorkflowUpdateFailedError):
        await approve(harness, wf, sha="b" * 40, review_id="x")
    st = await harness.state(wf)
    assert st.phase == Phase.AWAITING_REVIEW and st.approval is None
    await harness.client.get_workflow_handle(wf).signal(
        RepairBugWorkflow.reject, Rejection(reviewer="rev", reason="no")
    )
    final = await harness.result(wf)
    assert final.outcome == Outcome.REJECTED


async def test_moved_head_after_approval_is_verified_before_a_renewed_review(harness: Harness) -> None:
    harness.script.merge_answers = [MergeStatus.HEAD_MOVED, MergeStatus.MERGED]
    wf = await harness.start()
    await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
    await approve(harness, wf)
    st = await review_of(harness, wf, MOVED)
    # The renewed review names the new head and its own evidence, never the old digest.
    assert st.pending_approval is not None and st.pending_approval.evidence_digest == "f" * 64
    assert st.publish is not None and st.publish.commit == MOVED and st.publish.evidence_digest == "f" * 64
    assert [(p.head_sha, p.status.value, p.source) for p in st.head_pushes] == [(MOVED, "passed", "merge")]
    pushed = st.candidates[-1]
    assert pushed.pushed_head == MOVED and pushed.commit == MOVED and pushed.verification.value == "passed"
    names = harness.script.names()
    assert names.index("capture_head") < names.index("merge") + 10
    verified = [c for n, c in harness.script.calls if n == "verify" and ":head-verify:" in c.op_id]
    assert [v.op_id for v in verified] == [f"{wf}:head-verify:{MOVED}"]
    assert any(c.candidate_commit == MOVED for n, c in harness.script.calls if n == "build_evidence")
    keys = [c.key for n, c in harness.script.calls if n == "ensure_comment"]
    assert f"{wf}:evidence:{MOVED}" in keys and f"{wf}:head-verified:{MOVED}" in keys
    # An approval naming the old digest is refused; one of the new head and digest merges.
    with pytest.raises(WorkflowUpdateFailedError):
        await harness.client.get_workflow_handle(wf).execute_update(
            RepairBugWorkflow.approve,
            Approval(reviewer="rev", head_sha=MOVED, review_id="r2", evidence_digest="e" * 64),
            id="approve:r2-old-digest",
        )
    assert [m.approved_sha for n, m in harness.script.calls if n == "merge"] == [CANDIDATE]
    await approve(harness, wf, sha=MOVED, review_id="r2")
    final = await harness.result(wf)
    assert final.outcome == Outcome.MERGED
    assert [m.approved_sha for n, m in harness.script.calls if n == "merge"] == [CANDIDATE, MOVED]


async def test_moved_head_after_approval_that_fails_is_never_offered(harness: Harness) -> None:
    harness.script.merge_answers = [MergeStatus.HEAD_MOVED]
    harness.script.pushed_head_fails = True
    wf, final = await run_approved(harness)
    assert final.outcome == Outcome.NEEDS_HUMAN_TRIAGE
    assert MOVED[:12] in final.outcome_detail and "failed verification" in final.outcome_detail
    assert [(p.head_sha, p.status.value) for p in final.head_pushes] == [(MOVED, "failed")]
    assert [m.approved_sha for n, m in harness.script.calls if n == "merge"] == [CANDIDATE]
    comments = {c.key: c.body for n, c in harness.script.calls if n == "ensure_comment"}
    assert "tests failed" in comments[f"{wf}:head-failed:{MOVED}"]
    assert f"{wf}:evidence:{MOVED}" not in comments
    notes = [c.body for n, c in harness.script.calls if n == "update_ticket"]
    assert "failed verification" in notes[-1]


async def test_head_moved_signal_is_verified_once_and_other_prs_and_own_heads_are_ignored(harness: Harness) -> None:
    wf = await harness.start()
    await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
    handle = harness.client.get_workflow_handle(wf)
    await handle.signal(RepairBugWorkflow.head_moved, HeadPush(pr_number=4, head_sha=MOVED, source="webhook:x"))
    await handle.signal(RepairBugWorkflow.head_moved, HeadPush(pr_number=3, head_sha=CANDIDATE, source="webhook:y"))
    harness.script.head = MOVED
    push = HeadPush(pr_number=3, head_sha=MOVED, before=CANDIDATE, pusher="maint", source="webhook:z")
    await handle.signal(RepairBugWorkflow.head_moved, push)
    await handle.signal(RepairBugWorkflow.head_moved, push)
    st = await review_of(harness, wf, MOVED)
    assert [(p.head_sha, p.pusher, p.status.value) for p in st.head_pushes] == [(MOVED, "maint", "passed")]
    await handle.signal(RepairBugWorkflow.head_moved, push)
    await approve(harness, wf, sha=MOVED, review_id="r2")
    final = await harness.result(wf)
    assert final.outcome == Outcome.MERGED
    assert [c.head_sha for n, c in harness.script.calls if n == "capture_head"] == [MOVED]
    assert [m.approved_sha for n, m in harness.script.calls if n == "merge"] == [MOVED]


async def test_approval_of_a_head_the_run_never_verified_has_it_verified_first(harness: Harness) -> None:
    harness.script.head = MOVED
    harness.script.pushed_head_fails = True
    wf = await harness.start()
    await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
    ack = await harness.client.get_workflow_handle(wf).execute_update(
        RepairBugWorkflow.approve,
        Approval(reviewer="rev", head_sha=MOVED, review_id="r1", source="webhook", pr_number=3),
        id="approve:r1",
    )
    assert not ack.accepted and "verifies it first" in ack.detail
    final = await harness.result(wf)
    assert final.outcome == Outcome.NEEDS_HUMAN_TRIAGE and final.approval is None
    assert [(p.head_sha, p.source, p.status.value) for p in final.head_pushes] == [
        (MOVED, "approval:webhook", "failed")
    ]
    assert "merge" not in harness.script.names()


async def test_a_moved_base_is_verified_again_before_the_approved_head_merges(harness: Harness) -> None:
    harness.script.base_now = "e" * 40
    wf, final = await run_approved(harness)
    assert final.outcome == Outcome.MERGED
    names = harness.script.names()
    assert names.index("read_branch") < names.index("rebuild_on_base") < names.index("merge")
    verified = [c for n, c in harness.script.calls if n == "verify" and ":base-verify:" in c.op_id]
    assert [(v.base_revision, v.parent_commit) for v in verified] == [("e" * 40, None)]
    assert any(
        c.base_revision == "e" * 40 for n, c in harness.script.calls if n == "provision" and "base-eeee" in c.op_id
    )
    assert final.publish is not None and final.publish.verified_base == "e" * 40
    assert [m.approved_sha for n, m in harness.script.calls if n == "merge"] == [CANDIDATE]
    keys = [c.key for n, c in harness.script.calls if n == "ensure_comment"]
    assert f"{wf}:evidence:{CANDIDATE}:base-{'e' * 40}" in keys
    assert "publish_branch" not in names[names.index("rebuild_on_base") :]


async def test_a_base_the_change_conflicts_with_is_said_and_never_merged_around(harness: Harness) -> None:
    harness.script.base_now = "e" * 40
    harness.script.rebuild = RebuiltOnBase(conflict=True, detail="conflicts in cart.py")
    wf, final = await run_approved(harness)
    assert final.outcome == Outcome.NEEDS_HUMAN_TRIAGE and "conflicts in cart.py" in final.outcome_detail
    assert "merge" not in harness.script.names()
    keys = [c.key for n, c in harness.script.calls if n == "ensure_comment"]
    assert f"{wf}:base-conflict:{'e' * 40}" in keys


async def test_a_rebuilt_change_that_differs_is_pushed_and_reviewed_again(harness: Harness) -> None:
    harness.script.base_now = "e" * 40
    harness.script.rebuild = RebuiltOnBase(conflict=False, same_change=False)
    wf = await harness.start()
    await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
    await approve(harness, wf)
    st = await review_of(harness, wf, "b" * 40)
    assert st.approval is None and st.publish is not None and st.publish.verified_base == "e" * 40
    push = [c for n, c in harness.script.calls if n == "publish_branch"][-1]
    assert (push.base_revision, push.expected_old, push.expected_commit) == ("e" * 40, CANDIDATE, "b" * 40)
    assert "merge" not in harness.script.names()
    await approve(harness, wf, sha="b" * 40, review_id="r2")
    final = await harness.result(wf)
    assert final.outcome == Outcome.MERGED
    assert [m.approved_sha for n, m in harness.script.calls if n == "merge"] == ["b" * 40]


async def test_expired_approval_is_refused_before_it_enters_history(harness: Harness) -> None:
    wf = await harness.start()
    await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await approve(harness, wf, expires_at=datetime.now(UTC) - timedelta(minutes=1))
    assert "approval expired at" in str(refused.value.cause)
    st = await harness.state(wf)
    assert st.phase == Phase.AWAITING_REVIEW and st.approval is None


async def test_approval_that_expires_before_the_merge_asks_again_for_the_same_head(harness: Harness) -> None:
    # The approval stands for 4 s (time enough to be accepted on a busy machine); the PR's re-read after it
    # takes 6 s, so the approval has lapsed by the time the merge would be made.
    harness.script.read_pr_delays_s = [6.0]
    wf = await harness.start()
    await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
    await approve(harness, wf, expires_at=datetime.now(UTC) + timedelta(seconds=4))
    for _ in range(300):
        st = await harness.state(wf)
        if st.phase == Phase.AWAITING_REVIEW and "read_pr" in harness.script.names():
            break
        await asyncio.sleep(0.1)
    assert st.phase == Phase.AWAITING_REVIEW and st.approval is None
    assert st.pending_approval is not None and st.pending_approval.head_sha == CANDIDATE
    assert "merge" not in harness.script.names()
    notes = [c.body for n, c in harness.script.calls if n == "update_ticket"]
    assert any("expired at" in body and "renewed review needed" in body for body in notes)

    await approve(harness, wf, review_id="r2")
    final = await harness.result(wf)
    assert final.outcome == Outcome.MERGED and final.approval is not None and final.approval.review_id == "r2"
    assert [m.approved_sha for n, m in harness.script.calls if n == "merge"] == [CANDIDATE]


async def test_cancellation_cleans_up_and_reports_cancelled(harness: Harness) -> None:
    wf = await harness.start()
    await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
    handle = harness.client.get_workflow_handle(wf)
    await handle.cancel()
    assert await harness.ended(wf) == WorkflowExecutionStatus.CANCELED
    st = await harness.state(wf)
    assert st.outcome == Outcome.CANCELLED
    assert "cleanup_run" in harness.script.names()
    assert harness.script.live_envs == set()
    assert [m.step.value for m in st.cancellation] == [
        "cancellation-requested",
        "stopping-active-work",
        "preserving-required-evidence",
        "cleaning-owned-resources",
        "cancelled",
    ]
    notes = [c.body for n, c in harness.script.calls if n == "update_ticket"]
    assert any("evidence kept in the store" in body for body in notes[:-1])
    # The final update rewrites the ticket's one comment: the note must survive it.
    assert "outcome: **cancelled**" in notes[-1] and "evidence kept in the store" in notes[-1]


async def test_cancellation_wins_over_an_activity_that_completes_after_it(harness: Harness) -> None:
    harness.script.hold_reproduce = asyncio.Event()
    wf = await harness.start()
    await harness.wait_phase(wf, Phase.REPRODUCE)
    for _ in range(100):
        if "reproduce" in harness.script.names():
            break
        await asyncio.sleep(0.1)
    handle = harness.client.get_workflow_handle(wf)
    await handle.cancel()
    # Only once the server recorded the request for the activity's cancellation does the activity finish.
    for _ in range(100):
        events = [e.event_type async for e in handle.fetch_history_events()]
        if EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED in events:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"the activity's cancellation was never requested: {events}")
    harness.script.hold_reproduce.set()
    assert await harness.ended(wf) == WorkflowExecutionStatus.CANCELED
    st = await harness.state(wf)
    assert st.outcome == Outcome.CANCELLED and st.cancellation[-1].step.value == "cancelled"
    # The late "reproduced" result was not acted on: no repair, nothing published, everything cleaned up.
    assert st.reproduction is None
    assert not {"propose", "verify", "publish_branch", "ensure_draft_pr"} & set(harness.script.names())
    assert "cleanup_run" in harness.script.names() and harness.script.live_envs == set()
    record_history(await handle.fetch_history(), "cancelled-after-late-completion")


async def test_a_cancellation_during_a_child_attempt_takes_its_state_back_and_cleans_up(harness: Harness) -> None:
    harness.script.hold_turn = asyncio.Event()
    wf = await harness.start()
    await asyncio.wait_for(harness.script.hold_turn.wait(), 60)
    assert runs.running_attempts(await runs.handle_for(harness.client, wf).describe()) == [attempt_workflow_id(wf, 1)]
    await harness.client.get_workflow_handle(wf).cancel()
    assert await harness.ended(wf) == WorkflowExecutionStatus.CANCELED
    st = await harness.state(wf)
    assert st.outcome == Outcome.CANCELLED and st.cancellation[-1].step.value == "cancelled"
    # The attempt ended by itself, cancelled, and gave back what it had done: its first turn is the run's.
    child = await harness.client.get_workflow_handle(attempt_workflow_id(wf, 1)).describe()
    assert child.status == WorkflowExecutionStatus.COMPLETED
    assert [u.calls for u in st.budgets.attempts if u.attempt == 1] == [1], st.budgets
    assert not {"verify", "publish_branch", "ensure_draft_pr"} & set(harness.script.names())
    assert "cleanup_run" in harness.script.names() and harness.script.live_envs == set()


async def test_permanent_step_failure_ends_in_triage_with_cleanup(harness: Harness) -> None:
    harness.script.fail_spec = True
    final = await harness.result(await harness.start())
    assert final.outcome == Outcome.NEEDS_HUMAN_TRIAGE
    assert "Permanent" in final.outcome_detail and "durafix.yaml is missing" in final.outcome_detail
    assert harness.script.names().count("prepare_spec") == 1  # non-retryable: tried once
    assert "cleanup_run" in harness.script.names()


async def test_our_machinery_failing_is_said_to_be_that_not_a_verdict_on_the_report(harness: Harness) -> None:
    harness.script.spec_transport_down = True
    two_tries = RunPolicy.fast().environment.model_copy(update={"max_attempts": 2})
    final = await harness.result(await harness.start(environment=two_tries))
    assert final.outcome == Outcome.NEEDS_HUMAN_TRIAGE
    assert final.outcome_detail.startswith("durafix itself failed during provision after its retries (Transient:")
    assert "says nothing about the report" in final.outcome_detail
    assert harness.script.names().count("prepare_spec") == 2
    last_ticket = [c for n, c in harness.script.calls if n == "update_ticket"][-1]
    assert "durafix itself failed" in last_ticket.body and "has finished with this report" in last_ticket.body


async def test_cleanup_that_cannot_complete_names_what_remains(harness: Harness) -> None:
    harness.script.reproduces_on_base = False
    harness.script.stuck_resource = "durafix-abc123"
    wf = await harness.start()
    final = await harness.result(wf)
    assert final.outcome == Outcome.CLEANUP_INCOMPLETE
    assert final.cleanup is not None and not final.cleanup.complete
    assert final.cleanup.remaining == ["container:durafix-abc123"]
    assert "needs-human-triage" in final.outcome_detail and "durafix-abc123" in final.outcome_detail
    record_history(await harness.client.get_workflow_handle(wf).fetch_history(), "cleanup-incomplete")


async def test_review_that_never_comes_ends_at_the_review_deadline(harness: Harness) -> None:
    final = await harness.result(await harness.start(review_timeout_s=2.0))
    assert final.outcome == Outcome.REJECTED
    assert "review deadline" in final.outcome_detail
    assert "merge" not in harness.script.names()
    assert final.cleanup is not None and final.cleanup.complete


async def test_a_repair_attempt_is_a_sequence_of_recorded_steps_threading_transcript_and_patch(
    harness: Harness,
) -> None:
    """Turn, tool batch, turn, conclusion: each step gets the references the previous one returned, the
    operation IDs name attempt and turn, and each turn's tokens are charged to the run once."""
    harness.script.fixes_on_attempt = 2
    final = await approved_run(harness)
    assert final.outcome == Outcome.MERGED
    model_steps = [
        (n, c) for n, c in harness.script.calls if n in {"propose", "agent_turn", "agent_tools", "agent_conclude"}
    ]
    wf = final.workflow_id
    assert [(n, c.op_id) for n, c in model_steps] == [
        (n, f"{wf}:repair:{k}{suffix}")
        for k in (1, 2)
        for n, suffix in [
            ("propose", ":turn-1"),
            ("agent_tools", ":tools-1"),
            ("agent_turn", ":turn-2"),
            ("agent_conclude", ""),
        ]
    ]
    for k in (1, 2):
        first, tools, second, conclude = (c for _, c in model_steps[4 * (k - 1) : 4 * k])
        assert first.transcript_ref is None and tools.transcript_ref == ref(f"transcript-{k}-1")
        assert tools.patch_ref is None and [c.name for c in tools.calls] == ["write_file"]
        assert second.transcript_ref == ref(f"transcript-{k}-1-tools")
        assert (
            conclude.patch_ref == ref(f"patch-{k}", ArtifactKind.PATCH) and conclude.summary == "multiply by quantity"
        )
        assert (conclude.prompt_tokens, conclude.completion_tokens) == (100, 20)
    assert "still reproduces" in model_steps[4][1].previous_failures[0]
    assert (final.budgets.model_prompt_tokens, final.budgets.model_completion_tokens) == (200, 40)
    assert [c.patch_ref for c in final.candidates] == [
        ref("patch-1", ArtifactKind.PATCH),
        ref("patch-2", ArtifactKind.PATCH),
    ]


async def test_refusals_no_op_patches_and_invalid_tool_calls_are_counted_apart_with_each_attempts_tokens(
    harness: Harness,
) -> None:
    """Attempt 1's patch is refused, attempt 2's edits cancel out, attempt 3 fixes it; every tool batch has
    one call answered with an error. Each is counted apart, and the tokens are kept per attempt and call."""
    harness.script.no_patch_on_attempt = {1: "refused", 2: "no-op"}
    harness.script.invalid_tool_calls = 1
    harness.script.fixes_on_attempt = 3
    final = await approved_run(harness)

    assert final.outcome == Outcome.MERGED
    b = final.budgets
    assert b.repair_attempts_used == 3 and [c.attempt for c in final.candidates] == [3]
    assert (b.refusals, b.no_op_patches, b.invalid_tool_calls, b.transport_retries) == (1, 1, 3, 0)
    assert [(u.attempt, u.calls, u.prompt_tokens, u.completion_tokens, u.invalid_tool_calls) for u in b.attempts] == [
        (k, 2, 100, 20, 1) for k in (1, 2, 3)
    ]
    assert [(c.attempt, c.turn) for c in b.recent_calls] == [(k, t) for k in (1, 2, 3) for t in (1, 2)]
    assert (b.model_prompt_tokens, b.model_completion_tokens, b.model) == (300, 60, "m")


async def request_changes(h: Harness, wf_id: str, head: str, review_id: str = "41") -> None:
    """A permitted reviewer's changes_requested review of ``head``, as the webhook receiver signals it."""
    await h.client.get_workflow_handle(wf_id).signal(
        RepairBugWorkflow.reject,
        Rejection(
            reviewer="rev",
            reason="name the rule",
            source="webhook",
            pr_number=3,
            changes_requested=True,
            review_id=review_id,
            head_sha=head,
        ),
    )


async def review_of(h: Harness, wf_id: str, head: str) -> RunState:
    """The run's state once it asks for a review of ``head``; fails if it ends first or takes over 30 s."""
    for _ in range(300):
        st = await h.state(wf_id)
        if st.pending_approval is not None and st.pending_approval.head_sha == head:
            return st
        if st.outcome is not None:
            break
        await asyncio.sleep(0.1)
    raise AssertionError(f"{wf_id} never awaited a review of {head}; last {st!r}")


async def test_a_request_for_changes_revises_on_top_of_the_head_and_the_revision_merges(harness: Harness) -> None:
    wf = await harness.start()
    await review_of(harness, wf, CANDIDATE)
    await request_changes(harness, wf, CANDIDATE)
    st = await review_of(harness, wf, revised(1))
    assert st.budgets.revisions_used == 1 and st.publish is not None and st.publish.commit == revised(1)
    calls = harness.script.calls
    assert [c.review_id for n, c in calls if n == "read_review"] == [41]
    opening = [c for n, c in calls if n == "propose" and c.revision == 1]
    assert len(opening) == 1
    assert "name the rule in a comment" in opening[0].review_feedback
    assert "cart.py:12: say why line_total" in opening[0].review_feedback
    first_tools = next(c for n, c in calls if n == "agent_tools" and c.op_id == f"{wf}:revision:1:tools-1")
    assert first_tools.patch_ref is not None and first_tools.patch_ref.name == "patch-1"
    verify = [c for n, c in calls if n == "verify"][-1]
    assert (verify.op_id, verify.parent_commit) == (f"{wf}:revision-verify:1", CANDIDATE)
    pushes = [c for n, c in calls if n == "publish_branch"]
    assert [(p.op_id, p.expected_old, p.parent_commit, p.expected_commit) for p in pushes] == [
        (f"{wf}:push", None, None, CANDIDATE),
        (f"{wf}:revision-push:1", CANDIDATE, CANDIDATE, revised(1)),
    ]
    assert pushes[0].branch == pushes[1].branch
    prs = [c for n, c in calls if n == "ensure_draft_pr"]
    assert [(p.op_id, p.branch) for p in prs] == [
        (f"{wf}:pr", pushes[0].branch),
        (f"{wf}:revision-pr:1", pushes[0].branch),
    ]
    assert "revision 1 as rev asked" not in prs[0].body and f"revision 1 as rev asked: `{revised(1)}`" in prs[1].body
    keys = [c.key for n, c in calls if n == "ensure_comment"]
    assert f"{wf}:evidence:{CANDIDATE}" in keys and f"{wf}:evidence:{revised(1)}" in keys
    assert f"{wf}:revision:1" in keys
    assert [c.reviewers for n, c in calls if n == "request_review"] == [["rev"]]
    await approve(harness, wf, sha=revised(1), review_id="r2")
    final = await harness.result(wf)
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    assert [c.approved_sha for n, c in calls if n == "merge"] == [revised(1)]
    handle = harness.client.get_workflow_handle(wf)
    record_history(await handle.fetch_history(), "revision-on-review")


async def test_a_request_for_changes_after_the_revision_budget_is_spent_rejects_and_says_so(harness: Harness) -> None:
    wf = await harness.start(revisions_max=1)
    await review_of(harness, wf, CANDIDATE)
    await request_changes(harness, wf, CANDIDATE)
    await review_of(harness, wf, revised(1))
    await request_changes(harness, wf, revised(1), review_id="42")
    final = await harness.result(wf)
    assert final.outcome == Outcome.REJECTED
    assert "revision budget (1) was spent" in final.outcome_detail
    said = [c for n, c in harness.script.calls if n == "ensure_comment" and c.key == f"{wf}:revisions-spent"]
    assert len(said) == 1 and "revision budget (1 revision(s)) is spent" in said[0].body
    assert len([c for n, c in harness.script.calls if n == "publish_branch"]) == 2


async def test_a_revision_that_fails_verification_keeps_the_head_under_review(harness: Harness) -> None:
    harness.script.revision_fails = True
    wf = await harness.start()
    await review_of(harness, wf, CANDIDATE)
    await request_changes(harness, wf, CANDIDATE)
    for _ in range(300):
        st = await harness.state(wf)
        if st.budgets.revisions_used == 1 and st.pending_approval is not None:
            break
        await asyncio.sleep(0.1)
    assert st.pending_approval is not None and st.pending_approval.head_sha == CANDIDATE
    calls = harness.script.calls
    failed = [c for n, c in calls if n == "ensure_comment" and c.key == f"{wf}:revision-failed:1"]
    assert len(failed) == 1 and "tests failed" in failed[0].body and CANDIDATE in failed[0].body
    assert len([c for n, c in calls if n == "publish_branch"]) == 1
    # A late request for changes of another head is not a revision request for this one.
    await request_changes(harness, wf, revised(1), review_id="43")
    await approve(harness, wf, sha=CANDIDATE, review_id="r3")
    final = await harness.result(wf)
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    assert final.budgets.revisions_used == 1


async def test_a_reject_command_after_a_revision_still_rejects(harness: Harness) -> None:
    wf = await harness.start()
    await review_of(harness, wf, CANDIDATE)
    await request_changes(harness, wf, CANDIDATE)
    await review_of(harness, wf, revised(1))
    await harness.client.get_workflow_handle(wf).signal(
        RepairBugWorkflow.reject, Rejection(reviewer="maintainer", reason="not this way", source="cli")
    )
    final = await harness.result(wf)
    assert final.outcome == Outcome.REJECTED
    assert final.outcome_detail == "rejected by maintainer: not this way"
    assert final.budgets.revisions_used == 1


async def test_a_turns_calls_run_in_order_each_where_it_runs_and_each_run_sees_the_edits_before_it(
    harness: Harness,
) -> None:
    """An edit, the reproduction on the workspace, the tests, another edit: a workspace batch, the run's own
    provision / reproduce / teardown on base + the patch so far (its result appended by model.agent_record),
    env.agent_run on the same patch, then a second batch, all in that order."""
    harness.script.turn_one_calls = ["write_file", "run_reproduction", "run_tests", "replace_in_file"]
    wf = await harness.start()
    await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
    calls = harness.script.calls
    first = next(k for k, (n, _) in enumerate(calls) if n == "agent_tools")
    turn = [
        (n, c)
        for n, c in calls[first:]
        if n in ("agent_tools", "provision", "reproduce", "teardown", "agent_record", "agent_run")
    ][:7]
    assert [n for n, _ in turn] == [
        "agent_tools",
        "provision",
        "reproduce",
        "teardown",
        "agent_record",
        "agent_run",
        "agent_tools",
    ]
    batch, provision, _, _, record, run, second = (c for _, c in turn)
    assert [c.name for c in batch.calls] == ["write_file"] and batch.op_id == f"{wf}:repair:1:tools-1-1"
    assert provision.op_id == f"{wf}:env-agent-1-1-2:1" and provision.patch_ref.name == "patch-1"
    assert [(r.id, r.content) for r in record.results] == [("c2", "the bug still shows on your workspace")]
    assert run.op_id == f"{wf}:repair:1:run-1-3" and run.call.id == "c3" and run.patch_ref.name == "patch-1"
    assert run.transcript_ref.name == "transcript-1-1-record"
    assert [c.name for c in second.calls] == ["replace_in_file"] and second.op_id == f"{wf}:repair:1:tools-1-4"
    assert second.transcript_ref.name == "transcript-1-1-run"
    state = await harness.state(wf)
    assert any(r.name == f"run-{wf}:repair:1:run-1-3" for r in state.evidence)  # the run's output is recorded


def host_calls(h: Harness, name: str) -> list[Any]:
    return [c for n, c in h.script.calls if n == name]


def host_worker(harness: Harness, host: str) -> Worker:
    """A worker polling ``host``'s queue with the environment steps a host holds."""
    acts = {
        fn.__name__: fn
        for fn in doubles(harness.script)[TaskQueue.BROWSER] + doubles(harness.script)[TaskQueue.ENVIRONMENTS]
    }
    return Worker(
        harness.client,
        task_queue=host_queue(host),
        activities=[acts["reproduce"], acts["reproduce_in_environment"], acts["teardown"], acts["cleanup_run"]],
    )


async def test_an_environment_on_a_host_is_reproduced_torn_down_and_cleaned_up_on_that_hosts_queue(
    harness: Harness,
) -> None:
    """The steps reaching an environment stamped with a host run on that host's queue (a worker polling it), and
    the run's cleanup asks that host too."""
    harness.script.provision_hosts = ["here"]
    async with host_worker(harness, "here"):
        wf = await harness.start()
        st = await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
        await approve(harness, wf)
        final = await harness.result(wf)
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    assert final.cleanup is not None and final.cleanup.complete
    assert st.environment is not None
    history = [e async for e in harness.client.get_workflow_handle(wf).fetch_history_events()]
    queues = [
        (
            e.activity_task_scheduled_event_attributes.activity_type.name,
            e.activity_task_scheduled_event_attributes.task_queue.name,
        )
        for e in history
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert (steps.REPRODUCE.name, host_queue("here")) in queues
    assert (steps.TEARDOWN.name, host_queue("here")) in queues
    assert (steps.CLEANUP_RUN.name, host_queue("here")) in queues
    assert (steps.CLEANUP_RUN.name, TaskQueue.ENVIRONMENTS.value) in queues
    assert len(host_calls(harness, "cleanup_run")) == 2
    record_history(await harness.client.get_workflow_handle(wf).fetch_history(), "host-affinity")


async def test_an_environment_on_a_host_that_never_answers_is_provisioned_again_and_the_cleanup_names_the_host(
    harness: Harness,
) -> None:
    """No worker polls the first environment's host: its reproduction times out waiting, the environment is
    provisioned again (anywhere), the run goes on, and its cleanup ends incomplete naming the host."""
    harness.script.provision_hosts = ["gone"]
    wf = await harness.start(host_start_s=1.0)
    await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
    await approve(harness, wf)
    final = await harness.result(wf)
    assert final.outcome == Outcome.CLEANUP_INCOMPLETE, final.outcome_detail
    assert final.merged_sha == "m" * 40
    assert final.cleanup is not None and "host:gone" in final.cleanup.remaining, final.cleanup
    assert any("host gone did not take" in e for e in final.cleanup.errors), final.cleanup
    provisions = [c.op_id for c in host_calls(harness, "provision")]
    assert provisions[:2] == [f"{wf}:env-base:1", f"{wf}:env-base:2"], provisions


async def test_a_host_bound_step_whose_worker_dies_more_than_twice_is_sent_to_the_live_host_again(
    harness: Harness,
) -> None:
    """Three tries of the base reproduction on a live host are lost with their worker process (WorkerLost, as the
    host's supervisor fails them): more than the two tries a host-bound send has. The reproduction is sent to the
    host again, within the step's own attempts (4), and the run goes on with the same environment; a worker
    killed twice on a live host is no reason to end the run or to provision elsewhere."""
    harness.script.provision_hosts = ["here"]
    harness.script.reproduce_lost = 3
    async with host_worker(harness, "here"):
        wf, final = await run_approved(harness)
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    base = [c for c in host_calls(harness, "reproduce") if c.revision == BASE]
    assert len(base) == 4 and {c.op_id for c in base} == {f"{wf}:reproduce-base:1"}, base
    assert [c.op_id for c in host_calls(harness, "provision")][:1] == [f"{wf}:env-base:1"]
    assert f"{wf}:env-base:2" not in [c.op_id for c in host_calls(harness, "provision")]
    history = [e async for e in harness.client.get_workflow_handle(wf).fetch_history_events()]
    sends = [
        e.activity_task_scheduled_event_attributes
        for e in history
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == steps.REPRODUCE.name
    ]
    assert [a.task_queue.name for a in sends[:2]] == [host_queue("here")] * 2, sends
    record_history(await harness.client.get_workflow_handle(wf).fetch_history(), "host-step-worker-lost-sent-again")


async def test_a_host_bound_step_lost_more_often_than_its_attempts_ends_the_run_saying_so(harness: Harness) -> None:
    """The step's own attempts bound the sends: four lost tries of a four-attempt step end the run in triage."""
    harness.script.provision_hosts = ["here"]
    harness.script.reproduce_lost = 4
    async with host_worker(harness, "here"):
        wf = await harness.start()
        final = await harness.result(wf)
    assert final.outcome == Outcome.NEEDS_HUMAN_TRIAGE, final.outcome_detail
    assert "worker process died" in (final.outcome_detail or ""), final.outcome_detail
    assert len([c for c in host_calls(harness, "reproduce") if c.revision == BASE]) == 4


async def test_a_host_bound_step_that_times_out_after_a_lost_try_takes_the_host_for_gone(harness: Harness) -> None:
    """One try lost with its worker, then the next one on the same host stops beating: the send's failure is a
    heartbeat timeout (whose own cause names the lost try before it). That is a silent host, not a lost worker:
    the environment is provisioned anew, not sent to the host again."""
    harness.script.provision_hosts = ["here"]
    harness.script.reproduce_lost = 1
    harness.script.reproduce_silent_after_lost = True
    async with host_worker(harness, "here"):
        wf = await harness.start()
        await harness.wait_phase(wf, Phase.AWAITING_REVIEW, timeout=90)
    provisions = [c.op_id for c in host_calls(harness, "provision")]
    assert provisions[:2] == [f"{wf}:env-base:1", f"{wf}:env-base:2"], provisions
    base = [c.op_id for c in host_calls(harness, "reproduce") if c.revision == BASE]
    assert base == [f"{wf}:reproduce-base:1"] * 2 + [f"{wf}:reproduce-base:2"], base


async def test_a_test_reproduction_seeds_every_attempt_and_the_agent_is_told_to_keep_the_test(
    harness: Harness,
) -> None:
    """A run whose reproduction is a test writes its files on the base once, before the first attempt; each
    attempt starts from that patch, and its first turn names the test the fix must make pass."""
    harness.script.procedure_kind = ReproductionKind.TEST
    harness.script.fixes_on_attempt = 2
    final = await approved_run(harness)

    assert final.outcome == Outcome.MERGED, final.outcome_detail
    names = harness.script.names()
    assert names.count("reproduction_seed") == 1
    assert names.index("reproduction_seed") < names.index("propose")
    (seed_input,) = [c for n, c in harness.script.calls if n == "reproduction_seed"]
    assert seed_input.procedure_ref == ref("procedure", ArtifactKind.PROCEDURE)
    assert seed_input.op_id == f"{final.workflow_id}:reproduction-seed"
    seed = ref("seed", ArtifactKind.PATCH)
    assert final.reproduction_kind == "test"
    assert final.reproduction_seed is not None and final.reproduction_seed.patch_ref == seed
    assert seed in final.evidence
    tools = [c for n, c in harness.script.calls if n == "agent_tools"]
    assert [(c.attempt, c.patch_ref) for c in tools] == [(1, seed), (2, seed)]  # both attempts start from it
    firsts = [c for n, c in harness.script.calls if n == "propose"]
    assert [c.seed_tests for c in firsts] == [["tests/test_issue.py"]] * 2
    record_history(
        await harness.client.get_workflow_handle(final.workflow_id).fetch_history(), "test-reproduction-seeded"
    )


async def test_a_prose_report_gets_drafts_run_on_the_base_until_one_reproduces_and_that_one_is_the_runs(
    harness: Harness,
) -> None:
    """No block: the spec and the repository's facts first, then a draft that does not show the bug on the base is
    sent back with what its run found, and the second, which does, is the run's reproduction (its run on the base
    is the base reproduction: no other is made) and seeds the repair with its test."""
    harness.script.prose_report = True
    final = await approved_run(harness)

    assert final.outcome == Outcome.MERGED, final.outcome_detail
    names = harness.script.names()
    assert names.index("prepare_spec") < names.index("draft_context") < names.index("draft_procedure")
    drafts = [c for n, c in harness.script.calls if n == "draft_procedure"]
    assert [d.op_id for d in drafts] == [f"{final.workflow_id}:draft-procedure:{n}" for n in (1, 2)]
    assert drafts[0].kinds == [ReproductionKind.COMMAND, ReproductionKind.TEST] and drafts[0].previous == []
    (refused,) = drafts[1].previous
    assert refused.yaml == "draft 1" and refused.refusal.startswith(
        f"ran on the base revision {BASE[:12]}: not_reproduced"
    )
    base_runs = [c.op_id for n, c in harness.script.calls if n == "reproduce" and c.revision == BASE]
    assert base_runs == [f"{final.workflow_id}:reproduce-draft-1:1", f"{final.workflow_id}:reproduce-draft-2:1"]
    assert final.drafting is not None and final.drafting.accepted == 2
    assert [r.status for r in final.drafting.rounds] == [
        ReproductionOutcome.NOT_REPRODUCED,
        ReproductionOutcome.REPRODUCED,
    ]
    assert final.reproduction is not None and final.reproduction.procedure_ref == ref("draft-2", ArtifactKind.PROCEDURE)
    (seed,) = [c for n, c in harness.script.calls if n == "reproduction_seed"]
    assert seed.procedure_ref == ref("draft-2", ArtifactKind.PROCEDURE)
    tickets = [c.body for n, c in harness.script.calls if n == "update_ticket"]
    said = "reproduced with the test tests/test_issue_2.py, drafted from your report after 1 draft(s) that did not"
    assert said in tickets[-1]
    assert final.budgets.model_prompt_tokens >= 20
    record_history(
        await harness.client.get_workflow_handle(final.workflow_id).fetch_history(),
        "drafted-reproduction-refused-then-accepted",
    )


async def test_a_prose_report_whose_drafts_never_reproduce_ends_in_triage_saying_what_the_last_found(
    harness: Harness,
) -> None:
    harness.script.prose_report = True
    harness.script.drafts_not_reproducing = 3
    wf = await harness.start()
    final = await harness.result(wf)

    assert final.outcome == Outcome.NEEDS_HUMAN_TRIAGE, final.outcome_detail
    assert "none of the 3 reproductions drafted from the report showed the bug" in final.outcome_detail
    assert "the test tests/test_issue_3.py" in final.outcome_detail
    assert final.triage is not None and final.triage.reason == TriageReason.NOT_REPRODUCED
    assert len([n for n in harness.script.names() if n == "draft_procedure"]) == 3
    assert not {"propose", "run_baseline", "reproduction_seed"} & set(harness.script.names())


async def test_a_browser_reproduction_asks_for_no_seed(harness: Harness) -> None:
    final = await approved_run(harness)

    assert final.outcome == Outcome.MERGED
    assert "reproduction_seed" not in harness.script.names()
    assert final.reproduction_seed is None


async def test_a_command_reproduction_against_the_app_is_provisioned_reproduced_on_its_host_and_torn_down(
    harness: Harness,
) -> None:
    """A command reproduction with ``app: true`` takes the browser's place between provision and teardown, on the
    host that holds the environment; an environment found gone is torn down and provisioned anew once. No browser
    reproduction and no sandbox-only reproduction is run."""
    harness.script.procedure_kind, harness.script.procedure_app = ReproductionKind.COMMAND, True
    harness.script.environment_gone = 1
    harness.script.provision_hosts = ["here", "here", "here"]
    async with host_worker(harness, "here"):
        wf, final = await run_approved(harness)
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    assert final.reproduction_kind == "command" and final.reproduction_app
    env_steps = [
        (n, c.op_id if n != "teardown" else c.env_id)
        for n, c in harness.script.calls
        if n in ("provision", "reproduce_in_environment", "teardown", "reproduce")
    ]
    assert env_steps[:7] == [
        ("provision", f"{wf}:env-base:1"),
        ("reproduce_in_environment", f"{wf}:reproduce-base:1"),
        ("teardown", f"{wf}:env-base:1"),
        ("provision", f"{wf}:env-base:2"),
        ("reproduce_in_environment", f"{wf}:reproduce-base:2"),
        ("teardown", f"{wf}:env-base:2"),
        ("provision", f"{wf}:env-candidate-1:1"),
    ]
    assert env_steps[7:9] == [
        ("reproduce_in_environment", f"{wf}:reproduce-candidate-1:1"),
        ("teardown", f"{wf}:env-candidate-1:1"),
    ]
    assert "reproduce" not in harness.script.names()
    ran = [c for n, c in harness.script.calls if n == "reproduce_in_environment"]
    assert all(c.spec_ref == ref("spec", ArtifactKind.SPEC) for c in ran)
    assert [c.environment.op_id for c in ran] == [f"{wf}:env-base:1", f"{wf}:env-base:2", f"{wf}:env-candidate-1:1"]
    assert final.reproduction is not None and final.reproduction.status == ReproductionOutcome.REPRODUCED
    assert final.cleanup is not None and final.cleanup.complete and not harness.script.live_envs
    history = [e async for e in harness.client.get_workflow_handle(wf).fetch_history_events()]
    queues = {
        (
            e.activity_task_scheduled_event_attributes.activity_type.name,
            e.activity_task_scheduled_event_attributes.task_queue.name,
        )
        for e in history
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    assert (steps.REPRODUCE_IN_ENVIRONMENT.name, host_queue("here")) in queues
    assert (steps.REPRODUCE_IN_ENVIRONMENT.name, TaskQueue.ENVIRONMENTS.value) not in queues
    record_history(await harness.client.get_workflow_handle(wf).fetch_history(), "command-reproduction-against-app")


async def test_a_command_reproduction_against_the_app_of_a_recipe_without_start_ends_as_a_browser_one_does(
    harness: Harness,
) -> None:
    """``app: true`` with a recipe that declares no ``start``: provisioning says so, and the run ends in triage
    (environment not set up, cause ``no-app``) with nothing reproduced, as a browser procedure's run does."""
    harness.script.procedure_kind, harness.script.procedure_app = ReproductionKind.COMMAND, True
    harness.script.no_app = True
    final = await harness.result(await harness.start())
    assert final.outcome == Outcome.NEEDS_HUMAN_TRIAGE, final.outcome_detail
    assert final.triage is not None and final.triage.reason == TriageReason.ENVIRONMENT_NOT_SET_UP
    failed = final.triage.environment
    assert failed is not None and (failed.stage, failed.cause) == ("start", "no-app")
    assert harness.script.names().count("provision") == 1
    assert not {"reproduce", "reproduce_in_environment", "propose"} & set(harness.script.names())
    assert final.cleanup is not None and final.cleanup.complete
