"""The contract between the workflow and its activities: every step declared once.

A :class:`Step` names an activity, its task queue, its input and output models, the pattern of its
operation ID and its timeout class. The workflow's phases call ``ctx.step(STEP, arg)``
(:class:`pipeline.flow.context.RunContext`) and get the declared output type back; the adapters in
``pipeline/activities/`` register their implementations under ``STEP.name``; a test checks that the worker
registers every step on its queue with exactly these annotations. So the workflow never imports a provider
(PyGithub, Playwright, Docker, the openai SDK), and a call site cannot disagree with its activity.

Activity names and payload shapes are recorded in workflow histories: change one only behind
``workflow.patched``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field, model_validator

from browser.results import ReproductionStatus
from environments.interface import CleanupReport, EnvironmentHandle
from environments.reproduction import ReproductionKind
from evidence.interface import ArtifactRef
from pipeline.policies import TimeoutClass
from pipeline.state import EnvironmentFailureFact, RegressionFact, ReproductionFact, RunState
from repair.context import EarlierAttempt
from repair.procedure_draft import BROWSER_ONLY, DraftRound, RepositoryFacts
from reviews.approval_policy import ApprovalPolicy


class TaskQueue(StrEnum):
    """One queue per capability, so each can be scaled on hosts that have what it needs."""

    ORCHESTRATION = "durafix-orchestration"
    FORGE = "durafix-forge"
    ENVIRONMENTS = "durafix-environments"
    BROWSER = "durafix-browser"
    MODEL = "durafix-model"


# ---- forge (pipeline/activities/forge.py) -------------------------------------------------------------------


class ReadReportInput(BaseModel):
    repository: str
    issue_number: int
    base_branch: str


class ReportInfo(BaseModel):
    title: str
    body: str
    author: str
    base_revision: str
    clone_url: str


class EnsureTicketInput(BaseModel):
    op_id: str
    repository: str
    issue_number: int
    title: str
    body: str


class TicketResult(BaseModel):
    issue_number: int
    comment_id: int | None
    url: str


class UpdateTicketInput(BaseModel):
    repository: str
    issue_number: int
    comment_id: int | None
    op_id: str
    body: str
    # The run's closing update, sent after its cleanup: the one ticket write the run's tombstone does not fence.
    closing: bool = False


class PublishBranchInput(BaseModel):
    op_id: str
    run_id: str
    repository: str
    clone_url: str
    branch: str
    base_revision: str
    patch_ref: ArtifactRef
    expected_commit: str
    message: str
    commit_timestamp: int
    expected_old: str | None = None
    # A revision's commit is stacked on the head under review (``None``: on the base revision).
    parent_commit: str | None = None


class PublishResult(BaseModel):
    commit: str
    pushed: bool


class EnsureDraftPrInput(BaseModel):
    op_id: str
    run_id: str
    repository: str
    branch: str
    base: str
    title: str
    body: str


class PullInfo(BaseModel):
    number: int
    url: str
    head_sha: str
    state: str
    draft: bool
    merged: bool
    merge_commit_sha: str | None = None
    mergeable: bool | None = None


class EnsureCommentInput(BaseModel):
    repository: str
    number: int
    key: str
    body: str


class CommentResult(BaseModel):
    comment_id: int
    created: bool


class ReadPullInput(BaseModel):
    repository: str
    number: int


class ReadReviewInput(BaseModel):
    repository: str
    number: int
    review_id: int


class ReviewComment(BaseModel):
    path: str
    line: int | None = None
    body: str


class ReviewRead(BaseModel):
    """A review as the forge holds it now: who, what state, on which head, its text and its line comments."""

    review_id: int
    reviewer: str
    state: str
    body: str
    commit_id: str | None
    comments: list[ReviewComment] = Field(default_factory=list)


class RequestReviewInput(BaseModel):
    repository: str
    number: int
    reviewers: list[str]


class MergeInput(BaseModel):
    """What to merge, and the approval it is merged on: the merge activity checks that approval's authority on
    the forge (the APPROVED reviews of ``approved_sha`` by as many reviewers as ``approval_policy`` requires and
    admits), or, for an operator's approval (``source`` other than ``webhook``), that the worker allows operator
    approvals."""

    op_id: str
    repository: str
    number: int
    approved_sha: str
    reviewer: str = ""
    source: str = "webhook"
    review_id: str | None = None
    # The run's approval policy (``RunPolicy.approval_policy``); None (recorded before policies were carried,
    # or a run without one): the merging worker's configured policy.
    approval_policy: ApprovalPolicy | None = None


class MergeStatus(StrEnum):
    MERGED = "merged"
    HEAD_MOVED = "head_moved"
    NOT_MERGEABLE = "not_mergeable"
    ALREADY_MERGED = "already_merged"
    # Nothing on the forge approves this head (no permitted reviewer's APPROVED review of it, or it was
    # dismissed), and no operator approval is allowed: nothing was merged; the run asks for a review.
    NOT_APPROVED = "not_approved"


class MergeOutcome(BaseModel):
    status: MergeStatus
    merged_sha: str | None = None
    detail: str = ""


# ---- environments and evidence (pipeline/activities/environments.py) ---------------------------------


class PrepareSpecInput(BaseModel):
    run_id: str
    op_id: str
    repository: str
    clone_url: str
    base_revision: str


class ProvisionInput(BaseModel):
    run_id: str
    op_id: str
    spec_ref: ArtifactRef
    patch_ref: ArtifactRef | None = None
    provider: str | None = None
    # The base the patch applies to, when not the spec's (a candidate rebuilt on a moved base branch).
    base_revision: str | None = None


class VerifyInput(BaseModel):
    """``baseline_cases_ref``: the baseline's test cases, when the recipe names a ``test_report``: the candidate
    then passes if it fails no test that passes on the base."""

    run_id: str
    op_id: str
    spec_ref: ArtifactRef
    patch_ref: ArtifactRef
    message: str
    commit_timestamp: int
    baseline_cases_ref: ArtifactRef | None = None
    # A revision's commit is stacked on the head under review (``None``: on the base revision).
    parent_commit: str | None = None
    # The base the patch applies to, when not the spec's (a candidate rebuilt on a moved base branch).
    base_revision: str | None = None


class VerifyResult(BaseModel):
    """``regression``: the regression proof, run when the tests passed (``None`` from workers that predate it)."""

    commit: str
    tree: str
    tests_passed: bool
    test_summary: str
    test_output_ref: ArtifactRef
    bundle_ref: ArtifactRef
    regression: RegressionFact | None = None


class BaselineInput(BaseModel):
    run_id: str
    op_id: str
    spec_ref: ArtifactRef


class BaselineResult(BaseModel):
    """The recipe's tests on the base revision. ``runnable`` is false when they could not run at all (setup
    failed, the test command was not found or not executable, a timeout): a recipe error, not a test result."""

    runnable: bool
    passed: bool
    summary: str
    test_output_ref: ArtifactRef
    cases_ref: ArtifactRef | None = None
    # The command it failed on, when it could not run, or failed with a recognised cause (the network).
    environment_failure: EnvironmentFailureFact | None = None


class CleanupRunInput(BaseModel):
    run_id: str


class CaptureHeadInput(BaseModel):
    """A head of the run's PR that the run did not push: fetched from the forge and stored as its change from
    ``base_revision`` (the run's base), the patch a verification takes."""

    run_id: str
    spec_ref: ArtifactRef
    head_sha: str
    base_revision: str


class HeadCaptured(BaseModel):
    """``patch_ref``: ``git diff --binary base..head`` (stored by content, so capturing the same head twice gives
    the same reference); ``tree``: the head's tree, which base + patch must rebuild."""

    head_sha: str
    patch_ref: ArtifactRef
    tree: str
    parents: list[str]
    message: str
    committed_at: int
    descends_from_base: bool
    empty: bool


class RebuildOnBaseInput(BaseModel):
    """The head under review, made on ``old_base``, rebuilt on the base branch's new head ``new_base``."""

    run_id: str
    spec_ref: ArtifactRef
    head_sha: str
    old_base: str
    new_base: str


class RebuiltOnBase(BaseModel):
    """``conflict``: the change does not apply on the new base (``detail`` says where). Otherwise ``patch_ref``
    is the rebuilt change (diff new base..merged tree, by content) and ``same_change`` whether it is the same
    change as the head's (equal patch IDs)."""

    conflict: bool
    detail: str = ""
    patch_ref: ArtifactRef | None = None
    tree: str | None = None
    same_change: bool = False


class ReadBranchInput(BaseModel):
    repository: str
    branch: str


class BranchHead(BaseModel):
    """``sha``: the branch's head now (``None``: the branch does not exist)."""

    sha: str | None


class BuildEvidenceInput(BaseModel):
    run_id: str
    repository: str
    issue_number: int
    base_revision: str
    candidate_commit: str
    procedure_ref: ArtifactRef
    base_reproduction: list[ArtifactRef]
    candidate_reproduction: list[ArtifactRef]
    base_status: str
    candidate_status: str
    patch_ref: ArtifactRef
    test_output_ref: ArtifactRef
    tests_passed: bool
    spec_ref: ArtifactRef
    test_summary: str = ""
    baseline_passed: bool | None = None
    baseline_summary: str = ""
    baseline_output_ref: ArtifactRef | None = None
    regression: RegressionFact | None = None


class EvidenceResult(BaseModel):
    manifest_ref: ArtifactRef
    report_ref: ArtifactRef
    digest: str
    report_url: str
    links: dict[str, str] = Field(default_factory=dict)


# ---- browser (pipeline/activities/browser.py) -----------------------------------------------------------------


class PrepareProcedureInput(BaseModel):
    run_id: str
    report_body: str


class ProcedureResult(BaseModel):
    """``missing``: the report has no procedure block at all (so one may be drafted from its prose). ``kind``: the
    stored reproduction's kind (:class:`environments.reproduction.ReproductionKind`): ``browser`` runs against the
    provisioned app, ``command`` and ``test`` in the sandbox (:data:`REPRODUCE_IN_SANDBOX`)."""

    procedure_ref: ArtifactRef | None
    error: str | None = None
    missing: bool = False
    drafted: bool = False
    kind: ReproductionKind = ReproductionKind.BROWSER
    # A command reproduction that runs against the provisioned app (``app: true``,
    # :data:`REPRODUCE_IN_ENVIRONMENT`) rather than in a fresh sandbox.
    app: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # A drafted reproduction: the YAML the model submitted (for the ticket: "reproduced with this test, drafted
    # from your report"); empty for one the report carried.
    drafted_yaml: str = ""
    # The reproduction in a few words (environments.reproduction.describe), e.g. "the test tests/test_x.py".
    described: str = ""


class ReproduceInput(BaseModel):
    run_id: str
    op_id: str
    revision: str
    procedure_ref: ArtifactRef
    environment: EnvironmentHandle
    readiness_path: str = "/"
    # The run's recovery spec, for the origins its recipe lets the browser reach besides the app's
    # (``browser_origins``). Absent (a run scheduled before it was passed): the app's origin only.
    spec_ref: ArtifactRef | None = None


class ReproduceResult(BaseModel):
    status: ReproductionStatus
    detail: str
    artifacts: list[ArtifactRef]
    trace_refs: list[ArtifactRef]
    screenshot_refs: list[ArtifactRef]
    video_refs: list[ArtifactRef] = []
    log_ref: ArtifactRef | None = None
    runs: int


class SandboxReproduceInput(BaseModel):
    """A command or test reproduction run on a fresh workspace of ``spec_ref``'s base (or ``base_revision``) plus
    ``patch_ref`` (none: the base itself), as :class:`ProvisionInput` names them; ``revision`` is the commit the
    workspace stands for, which the stored outputs are tagged with."""

    run_id: str
    op_id: str
    revision: str
    procedure_ref: ArtifactRef
    spec_ref: ArtifactRef
    patch_ref: ArtifactRef | None = None
    base_revision: str | None = None


class EnvironmentReproduceInput(BaseModel):
    """A command reproduction with ``app: true`` run in the provisioned ``environment`` (which ``provision`` built
    from ``spec_ref`` for its ``op_id``); ``revision`` is the commit it stands for, which the stored outputs are
    tagged with."""

    run_id: str
    op_id: str
    revision: str
    procedure_ref: ArtifactRef
    environment: EnvironmentHandle
    spec_ref: ArtifactRef


# ---- model (pipeline/activities/model.py) --------------------------------------------------------------------


class DraftProcedureInput(BaseModel):
    """``kinds``: the reproductions the recipe can run (browser only, as before other kinds existed, when not
    given); ``facts``: what the drafter is told of the repository; ``previous``: earlier drafts that were valid
    but did not show the bug on the base, with what their run found (the conversation is rebuilt from them)."""

    run_id: str
    op_id: str
    issue_title: str
    issue_body: str
    kinds: list[ReproductionKind] = Field(default_factory=lambda: list(BROWSER_ONLY))
    facts: RepositoryFacts | None = None
    previous: list[DraftRound] = Field(default_factory=list)


class DraftContextInput(BaseModel):
    run_id: str
    op_id: str
    spec_ref: ArtifactRef


class DraftContext(BaseModel):
    """What a drafter of the run's reproduction is told: the kinds its recipe can run and facts of the repository
    at the base revision (:func:`repair.procedure_draft.repository_facts`)."""

    kinds: list[ReproductionKind]
    facts: RepositoryFacts


class ReproductionSeedInput(BaseModel):
    """``procedure_ref``: the run's stored reproduction; a ``test`` one with ``files`` is written on the base
    revision (``spec_ref``'s) and stored as the patch the repair attempts start from."""

    run_id: str
    op_id: str
    spec_ref: ArtifactRef
    procedure_ref: ArtifactRef


class ReproductionSeedResult(BaseModel):
    """``patch_ref``: the reproduction's files as a patch against the base revision, None when there is nothing
    to seed (a browser or command reproduction, or a test one that writes no files); ``files`` the paths it
    adds, ``tests`` the tests the reproduction names."""

    patch_ref: ArtifactRef | None = None
    files: list[str] = Field(default_factory=list)
    tests: list[str] = Field(default_factory=list)
    refused: str = Field(default="", description="why the files were not written (e.g. a link on their path)")


class ProposePatchInput(BaseModel):
    run_id: str
    op_id: str
    attempt: int
    spec_ref: ArtifactRef
    issue_title: str
    issue_body: str
    previous_failures: list[str] = Field(default_factory=list)
    token_budget: int


class ProposalResult(BaseModel):
    """``log_ref``: what an external agent CLI printed, stored redacted (``model.agent_command`` only)."""

    patch_ref: ArtifactRef
    summary: str
    files_changed: list[str]
    prompt_tokens: int
    completion_tokens: int
    model: str
    log_ref: ArtifactRef | None = None


class AgentToolCall(BaseModel):
    """One function call a model turn asked for: its ID, its name, and ``arguments``, a reference to the JSON
    text the model wrote (``durafix-arguments:sha256:<hex>:<chars>``, :mod:`pipeline.activities.agent_calls`),
    never the text itself: that stays in the stored transcript, whose last answer asked for the call, and may
    be a whole file (``write_file``). Results recorded before references hold the text itself."""

    id: str
    name: str
    arguments: str


class AgentTurnInput(BaseModel):
    """One model request of a stepped attempt. ``transcript_ref`` is the transcript so far (``None`` on the
    attempt's first turn: the opening messages are built from the report and, when the workflow passes
    them, the run's facts: the base reproduction, the spec's test command, the baseline, and the earlier
    attempts; without them, from ``previous_failures``); ``token_budget`` is what the attempt may still
    spend. Those facts are carried by the first turn's input only (see ``_opening_facts_once``)."""

    run_id: str
    op_id: str
    attempt: int
    turn: int
    issue_title: str = ""
    issue_body: str = ""
    previous_failures: list[str] = Field(default_factory=list)
    transcript_ref: ArtifactRef | None = None
    token_budget: int
    tools: list[str] | None = Field(
        default=None, description="the tools offered (None: the workspace tools, as before the run tools existed)"
    )
    patch_ref: ArtifactRef | None = Field(default=None, description="the patch so far (a compaction states it)")
    compact_above_chars: int | None = Field(
        default=None, description="compact the transcript from durable facts once it is longer (None: never)"
    )
    # A revision of the candidate under review (0: a repair attempt) and what the review asked for; both only
    # shape the opening messages.
    revision: int = 0
    review_feedback: str = ""
    # The run's facts the first turn's message carries (repair.context); runs recorded before sent none.
    spec_ref: ArtifactRef | None = None
    reproduction: ReproductionFact | None = None
    baseline_summary: str | None = None
    earlier_attempts: list[EarlierAttempt] = Field(default_factory=list)
    # The reproduction's tests the attempt's workspace starts with (its seed patch): kept, and passing after.
    seed_tests: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _opening_facts_once(self) -> AgentTurnInput:
        """The opening facts travel with the first turn alone. Once a transcript exists they are in it (its
        opening messages, which compaction keeps), so a later turn's input drops them: a caller may build
        every turn's input alike, and history still holds the report and the facts once per attempt."""
        if self.transcript_ref is not None:
            for name in _OPENING_FACTS:
                setattr(self, name, type(self).model_fields[name].get_default(call_default_factory=True))
        return self


# Read only when the opening messages are built (the first turn): a later turn carries their defaults.
_OPENING_FACTS = (
    "issue_title",
    "issue_body",
    "previous_failures",
    "review_feedback",
    "spec_ref",
    "reproduction",
    "baseline_summary",
    "seed_tests",
    "earlier_attempts",
)


class AgentTurnResult(BaseModel):
    """The transcript with the model's answer appended, the calls it asked for, and the tokens it cost (every
    try of the step). ``summary`` is set when the answer asked for no call: the attempt is done.
    ``transport_retries``: the step's earlier tries that failed on the transport (429, 5xx, a timeout)."""

    transcript_ref: ArtifactRef
    calls: list[AgentToolCall]
    summary: str | None = None
    prompt_tokens: int
    completion_tokens: int
    model: str
    transport_retries: int = 0


class AgentWorkspaceInput(BaseModel):
    """Where a step of a stepped attempt's turn works: on base + ``patch_ref`` (the patch so far; ``None``:
    nothing changed yet), with the attempt's transcript so far."""

    run_id: str
    op_id: str
    attempt: int
    turn: int
    spec_ref: ArtifactRef
    transcript_ref: ArtifactRef
    patch_ref: ArtifactRef | None = None


class AgentToolsInput(AgentWorkspaceInput):
    """The calls of one turn, to run on base + ``patch_ref`` (the patch so far; ``None``: nothing changed yet)."""

    calls: list[AgentToolCall]


class AgentToolsResult(BaseModel):
    """The transcript with the calls' results appended, the patch after them (``None``: still no change), and
    the summary when ``finish`` was called. ``invalid_calls``: the calls answered ``error: ...`` (unknown
    tool, unusable arguments, a refused path or edit)."""

    transcript_ref: ArtifactRef
    patch_ref: ArtifactRef | None = None
    files_changed: list[str] = Field(default_factory=list)
    summary: str | None = None
    invalid_calls: int = 0


class AgentRunInput(AgentWorkspaceInput):
    """One run-tool call of a stepped attempt (``run_tests`` or ``run``), on base + the patch so far."""

    call: AgentToolCall


class AgentRunResult(BaseModel):
    """The transcript with the call's result appended; ``output_ref`` the command's stored (redacted) output,
    ``None`` when it did not run (refused, or ``interrupted``: an earlier try had started it and was lost)."""

    transcript_ref: ArtifactRef
    output_ref: ArtifactRef | None = None
    interrupted: bool = False
    refused: bool = Field(default=False, description="answered ``error: ...`` before anything ran")


class AgentToolResult(BaseModel):
    id: str
    content: str


class AgentRecordInput(BaseModel):
    """Results of calls the workflow carried out itself (``run_reproduction``), appended to the transcript."""

    run_id: str
    attempt: int
    turn: int
    transcript_ref: ArtifactRef
    results: list[AgentToolResult]


class AgentConcludeInput(BaseModel):
    """The end of a stepped attempt: its patch judged and stored as the attempt's proposal. The token counts
    are the attempt's (already charged by the workflow turn by turn) and are only passed through."""

    run_id: str
    op_id: str
    attempt: int
    spec_ref: ArtifactRef
    patch_ref: ArtifactRef | None = None
    transcript_ref: ArtifactRef | None = None
    summary: str
    prompt_tokens: int
    completion_tokens: int
    model: str


class AgentCommandInput(ProposePatchInput):
    """One repair attempt by an external agent CLI (``engine: command``): the CLI runs once in a sandboxed
    workspace at the base revision, and what it changed there is judged as the attempt's proposal.
    ``token_budget`` is what the attempt may spend (the model proxy refuses requests past it). Its fields are
    the one-shot proposal's."""


# ---- the run's record (pipeline/activities/run_record.py) ---------------------------------------------


class RecordRunInput(BaseModel):
    """The run's whole state once it ended, to be stored as its record."""

    state: RunState


# Responses a stepped attempt may take without finishing (as many as the engine's own loop allows).
AGENT_MAX_TURNS = 30


# ---- the declarations -------------------------------------------------------------------------------

In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out")


@dataclass(frozen=True)
class Step(Generic[In, Out]):
    """One activity as the workflow calls it.

    ``op_id`` is the pattern of the operation ID the input carries (``None`` for reads and for steps whose
    effect is keyed by their own input, such as a comment key); ``timeouts`` picks the run policy's
    :class:`~pipeline.policies.StepTimeouts`.
    """

    name: str
    queue: TaskQueue
    input: type[In]
    output: type[Out]
    timeouts: TimeoutClass
    op_id: str | None = None

    @property
    def waits_for_cancellation(self) -> bool:
        """Long work must acknowledge a cancellation (through its heartbeat) before the workflow moves on
        to cleanup; forge calls are short and conditional, so they are abandoned at once."""
        return self.queue != TaskQueue.FORGE


Q, T = TaskQueue, TimeoutClass

READ_REPORT = Step("forge.read_report", Q.FORGE, ReadReportInput, ReportInfo, T.FORGE)
ENSURE_TICKET = Step("forge.ensure_ticket", Q.FORGE, EnsureTicketInput, TicketResult, T.FORGE, "<wf>:ticket")
UPDATE_TICKET = Step("forge.update_ticket", Q.FORGE, UpdateTicketInput, type(None), T.FORGE, "<wf>:ticket")
PUBLISH_BRANCH = Step("forge.publish_branch", Q.FORGE, PublishBranchInput, PublishResult, T.FORGE, "<wf>:push")
ENSURE_DRAFT_PR = Step("forge.ensure_draft_pr", Q.FORGE, EnsureDraftPrInput, PullInfo, T.FORGE, "<wf>:pr")
ENSURE_COMMENT = Step("forge.ensure_comment", Q.FORGE, EnsureCommentInput, CommentResult, T.FORGE)
READ_PR = Step("forge.read_pr", Q.FORGE, ReadPullInput, PullInfo, T.FORGE)
READ_REVIEW = Step("forge.read_review", Q.FORGE, ReadReviewInput, ReviewRead, T.FORGE)
REQUEST_REVIEW = Step("forge.request_review", Q.FORGE, RequestReviewInput, type(None), T.FORGE)
READ_BRANCH = Step("forge.read_branch", Q.FORGE, ReadBranchInput, BranchHead, T.FORGE)
MERGE = Step("forge.merge", Q.FORGE, MergeInput, MergeOutcome, T.FORGE, "<wf>:merge:<n>")

PREPARE_SPEC = Step("env.prepare_spec", Q.ENVIRONMENTS, PrepareSpecInput, ArtifactRef, T.ENVIRONMENT, "<wf>:spec")
PROVISION = Step(
    "env.provision", Q.ENVIRONMENTS, ProvisionInput, EnvironmentHandle, T.ENVIRONMENT, "<wf>:env-<label>:<n>"
)
TEARDOWN = Step("env.teardown", Q.ENVIRONMENTS, EnvironmentHandle, CleanupReport, T.ENVIRONMENT)
VERIFY_CANDIDATE = Step(
    "env.verify_candidate", Q.ENVIRONMENTS, VerifyInput, VerifyResult, T.ENVIRONMENT, "<wf>:verify:<attempt>"
)
REPRODUCE_IN_SANDBOX = Step(
    "env.reproduce_in_sandbox",
    Q.ENVIRONMENTS,
    SandboxReproduceInput,
    ReproduceResult,
    T.ENVIRONMENT,
    "<wf>:reproduce-<label>:<n>",
)
REPRODUCE_IN_ENVIRONMENT = Step(
    "env.reproduce_in_environment",
    Q.ENVIRONMENTS,
    EnvironmentReproduceInput,
    ReproduceResult,
    T.ENVIRONMENT,
    "<wf>:reproduce-<label>:<n>",
)
RUN_BASELINE = Step("env.run_baseline", Q.ENVIRONMENTS, BaselineInput, BaselineResult, T.ENVIRONMENT, "<wf>:baseline")
CAPTURE_HEAD = Step("env.capture_head", Q.ENVIRONMENTS, CaptureHeadInput, HeadCaptured, T.ENVIRONMENT)
REBUILD_ON_BASE = Step("env.rebuild_on_base", Q.ENVIRONMENTS, RebuildOnBaseInput, RebuiltOnBase, T.ENVIRONMENT)
CLEANUP_RUN = Step("env.cleanup_run", Q.ENVIRONMENTS, CleanupRunInput, CleanupReport, T.ENVIRONMENT)
BUILD_EVIDENCE = Step("evidence.build", Q.ENVIRONMENTS, BuildEvidenceInput, EvidenceResult, T.ENVIRONMENT)
RECORD_RUN = Step("evidence.record_run", Q.ENVIRONMENTS, RecordRunInput, ArtifactRef, T.ENVIRONMENT)

PREPARE_PROCEDURE = Step("browser.prepare_procedure", Q.BROWSER, PrepareProcedureInput, ProcedureResult, T.BROWSER)
REPRODUCE = Step(
    "browser.reproduce", Q.BROWSER, ReproduceInput, ReproduceResult, T.BROWSER, "<wf>:reproduce-<label>:<n>"
)

DRAFT_PROCEDURE = Step(
    "model.draft_procedure", Q.MODEL, DraftProcedureInput, ProcedureResult, T.MODEL, "<wf>:draft-procedure"
)
PROPOSE_PATCH = Step(
    "model.propose_patch", Q.MODEL, ProposePatchInput, ProposalResult, T.MODEL, "<wf>:repair:<attempt>"
)
AGENT_TURN = Step(
    "model.agent_turn", Q.MODEL, AgentTurnInput, AgentTurnResult, T.MODEL, "<wf>:repair:<attempt>:turn-<n>"
)
AGENT_TOOLS = Step(
    "model.agent_tools", Q.MODEL, AgentToolsInput, AgentToolsResult, T.MODEL, "<wf>:repair:<attempt>:tools-<n>"
)
AGENT_RUN = Step(
    "env.agent_run", Q.ENVIRONMENTS, AgentRunInput, AgentRunResult, T.ENVIRONMENT, "<wf>:repair:<attempt>:run-<n>-<k>"
)
AGENT_RECORD = Step("model.agent_record", Q.MODEL, AgentRecordInput, ArtifactRef, T.MODEL)
AGENT_CONCLUDE = Step(
    "model.agent_conclude", Q.MODEL, AgentConcludeInput, ProposalResult, T.MODEL, "<wf>:repair:<attempt>"
)
AGENT_COMMAND = Step(
    "model.agent_command", Q.MODEL, AgentCommandInput, ProposalResult, T.MODEL, "<wf>:repair:<attempt>"
)

REPRODUCTION_SEED = Step(
    "env.reproduction_seed",
    Q.ENVIRONMENTS,
    ReproductionSeedInput,
    ReproductionSeedResult,
    T.ENVIRONMENT,
    "<wf>:reproduction-seed",
)

DRAFT_CONTEXT = Step(
    "env.draft_context", Q.ENVIRONMENTS, DraftContextInput, DraftContext, T.ENVIRONMENT, "<wf>:draft-context"
)

STEPS: tuple[Step[Any, Any], ...] = (
    READ_REPORT,
    ENSURE_TICKET,
    UPDATE_TICKET,
    PUBLISH_BRANCH,
    ENSURE_DRAFT_PR,
    ENSURE_COMMENT,
    READ_PR,
    READ_REVIEW,
    READ_BRANCH,
    REQUEST_REVIEW,
    MERGE,
    PREPARE_SPEC,
    PROVISION,
    TEARDOWN,
    VERIFY_CANDIDATE,
    REPRODUCE_IN_SANDBOX,
    REPRODUCE_IN_ENVIRONMENT,
    CAPTURE_HEAD,
    REBUILD_ON_BASE,
    RUN_BASELINE,
    CLEANUP_RUN,
    BUILD_EVIDENCE,
    RECORD_RUN,
    PREPARE_PROCEDURE,
    REPRODUCE,
    DRAFT_PROCEDURE,
    PROPOSE_PATCH,
    AGENT_TURN,
    AGENT_TOOLS,
    AGENT_RUN,
    AGENT_RECORD,
    AGENT_CONCLUDE,
    AGENT_COMMAND,
    REPRODUCTION_SEED,
    DRAFT_CONTEXT,
)
