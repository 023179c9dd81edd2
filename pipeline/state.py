"""The run's typed execution facts: what the workflow knows, returned by its ``state`` query.

Only facts live here (IDs, revisions, statuses, counters, references with sha256); traces, logs, patches and
screenshots live in the evidence store and appear here as :class:`ArtifactRef`.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import AwareDatetime, BaseModel, Field, computed_field, model_validator

from browser.results import ReproductionStatus
from environments.regression import ProofStatus
from environments.reproduction import ReproductionKind
from evidence.interface import ArtifactRef

WORKFLOW_VERSION = 1


class Phase(StrEnum):
    INTAKE = "intake"
    TICKET = "ticket"
    PROCEDURE = "procedure"
    PROVISION = "provision"
    REPRODUCE = "reproduce"
    BASELINE = "baseline"
    REPAIR = "repair"
    VERIFY = "verify"
    PUBLISH = "publish"
    AWAITING_REVIEW = "awaiting-review"
    MERGE = "merge"
    CLEANUP = "cleanup"
    DONE = "done"


class Outcome(StrEnum):
    MERGED = "merged"
    REJECTED = "rejected"
    NEEDS_HUMAN_TRIAGE = "needs-human-triage"
    REPAIR_BUDGET_EXHAUSTED = "repair-budget-exhausted"
    CANCELLED = "cancelled"
    CLEANUP_INCOMPLETE = "cleanup-incomplete"
    AMBIGUOUS_NEEDS_HUMAN = "ambiguous-needs-human"


class ReproductionOutcome(StrEnum):
    """What a reproduction on one revision found: the browser's verdict, or that the app never became ready
    (a finding about the revision, so the procedure never ran)."""

    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not_reproduced"
    INCONCLUSIVE = "inconclusive"
    APP_NOT_READY = "app_not_ready"

    @classmethod
    def _missing_(cls, value: object) -> ReproductionOutcome | None:
        # Runs recorded before the statuses were enums spelled it with hyphens.
        return cls.APP_NOT_READY if value == "app-not-ready" else None

    @classmethod
    def of(cls, status: ReproductionStatus) -> ReproductionOutcome:
        return cls(status.value)


class VerificationStatus(StrEnum):
    PENDING = "pending"
    PASSED = "passed"
    FAILED = "failed"


class EnvironmentState(StrEnum):
    """The last thing the run knows of its current environment."""

    READY = "ready"
    GONE = "gone"
    TORN_DOWN = "torn-down"


class CleanupStatus(StrEnum):
    COMPLETE = "complete"
    """Everything the run owned is gone."""
    INCOMPLETE = "incomplete"
    """Cleanup ran and named resources it could not remove."""
    FAILED = "failed"
    """Cleanup itself failed: what remains is unknown (``durafix resources --run`` tells)."""


class TicketFact(BaseModel):
    op_id: str
    issue_number: int
    comment_id: int | None = None
    url: str


class EnvironmentFact(BaseModel):
    env_id: str
    provider: str
    op_id: str
    revision: str
    spec_ref: ArtifactRef
    base_url: str
    last_status: EnvironmentState
    # What isolated the environment's commands (EnvironmentHandle.sandbox); "unsandboxed" is said on the ticket.
    sandbox: str = ""
    # The worker host holding it (EnvironmentHandle.host, pipeline/hosts.py); empty: any host reaches it.
    host: str = ""


class EnvironmentFailureFact(BaseModel):
    """The recipe command an environment failed on (:class:`environments.diagnosis.FailedCommand`), where its
    stored log is, and the recognised cause with its hint (:func:`environments.diagnosis.diagnose`; empty when
    none was recognised). ``stage``: ``setup``, ``start`` or ``fixtures`` (provisioning), ``tests`` (the
    baseline). ``exit_code`` ``None``: it timed out, or (``start``) it ran but never became ready. ``log_url``: a
    link to the stored log a reviewer's browser opens (the evidence store's, as the evidence comment links)."""

    stage: str
    command: str
    exit_code: int | None = None
    log_ref: ArtifactRef | None = None
    log_url: str = ""
    cause: str = ""
    hint: str = ""


class TriageReason(StrEnum):
    """Why a run ended ``needs-human-triage`` before any repair, as a kind (:class:`TriageFact`)."""

    ENVIRONMENT_NOT_SET_UP = "environment-not-set-up"
    """The base revision's environment could not be set up (a setup command failed, the app never became ready,
    its fixtures failed) or its tests could not run: the report was never tried; the recipe (or the worker) is
    what to fix."""
    NOT_REPRODUCED = "not-reproduced"
    """The procedure ran on the base revision and did not show the bug."""
    INCONCLUSIVE = "inconclusive"
    """The procedure's runs on the base revision disagreed."""
    BASELINE_FAILS = "baseline-fails"
    """The recipe's tests already fail on the base revision."""


class TriageFact(BaseModel):
    """The typed reason of a ``needs-human-triage`` ending (``outcome_detail`` says it in words); ``environment``:
    the failed command, when one is known: for :attr:`TriageReason.ENVIRONMENT_NOT_SET_UP`, and for
    :attr:`TriageReason.BASELINE_FAILS` when the failing tests' log shows a recognised cause (the network)."""

    reason: TriageReason
    environment: EnvironmentFailureFact | None = None


class ReproductionFact(BaseModel):
    op_id: str
    revision: str
    status: ReproductionOutcome
    procedure_ref: ArtifactRef
    trace_refs: list[ArtifactRef] = Field(default_factory=list)
    screenshot_refs: list[ArtifactRef] = Field(default_factory=list)
    video_refs: list[ArtifactRef] = Field(default_factory=list)
    log_ref: ArtifactRef | None = None
    detail: str = ""
    # ``app_not_ready``: the command the environment failed on, when the provider named it.
    environment_failure: EnvironmentFailureFact | None = None


class ReproductionSeedFact(BaseModel):
    """The reproduction's test files written on the base revision, as a patch every repair attempt starts from
    (so the candidate, its pull request and its regression proof hold the test): ``patch_ref`` the stored
    patch, ``files`` the paths it adds, ``tests`` the tests the reproduction names (the agent is told to keep
    them passing)."""

    op_id: str
    patch_ref: ArtifactRef
    files: list[str]
    tests: list[str] = Field(default_factory=list)


class DraftRoundFact(BaseModel):
    """One reproduction the model drafted from the report's prose, and what running it on the base found."""

    round: int
    procedure_ref: ArtifactRef
    kind: ReproductionKind
    described: str = ""
    status: ReproductionOutcome | None = None
    detail: str = ""


class DraftingFact(BaseModel):
    """The report had no reproduction: the model drafted one, each draft ran on the base, and the first that
    showed the bug was accepted (``accepted``: its round; None while drafting, or when none did)."""

    rounds: list[DraftRoundFact] = Field(default_factory=list)
    max_rounds: int = 0
    accepted: int | None = None

    @property
    def accepted_round(self) -> DraftRoundFact | None:
        return next((r for r in self.rounds if r.round == self.accepted), None)


class BaselineFact(BaseModel):
    """The recipe's tests on the base revision, run once before any repair attempt. ``cases_ref``: its test cases
    (stored JSON, :class:`environments.test_results.TestCases`) when the recipe names a ``test_report``."""

    op_id: str
    runnable: bool
    passed: bool
    summary: str
    test_output_ref: ArtifactRef
    cases_ref: ArtifactRef | None = None


class RegressionFact(BaseModel):
    """The regression proof of one candidate (:func:`environments.regression.prove_regression`): the patch's
    test files run on the base without the fix; ``fixed_cases`` fail there and pass on the candidate."""

    status: ProofStatus
    summary: str
    test_files: list[str] = Field(default_factory=list)
    fixed_cases: list[str] = Field(default_factory=list)
    base_output_ref: ArtifactRef | None = None
    candidate_output_ref: ArtifactRef | None = None

    @property
    def refs(self) -> list[ArtifactRef]:
        return [ref for ref in (self.base_output_ref, self.candidate_output_ref) if ref is not None]


class CandidateFact(BaseModel):
    attempt: int
    op_id: str
    patch_ref: ArtifactRef
    summary: str
    commit_timestamp: int
    commit: str | None = None
    tree: str | None = None
    verification: VerificationStatus = VerificationStatus.PENDING
    tests_passed: bool | None = None
    test_summary: str | None = None
    test_output_ref: ArtifactRef | None = None
    bundle_ref: ArtifactRef | None = None
    regression: RegressionFact | None = None
    replay: ReproductionFact | None = None
    failure: str | None = None
    # A revision on review (n >= 1) stacked on ``parent_commit``, the head under review; 0: a repair attempt.
    revision: int = 0
    parent_commit: str | None = None
    review_id: str | None = None
    reviewer: str | None = None
    # A head pushed to the run's branch by someone else (see :class:`HeadPushFact`): this candidate is that
    # head's change (``patch_ref``: the diff base..head), verified on a fresh workspace whose tree must be the
    # head's own ``tree``; ``commit`` is then the pushed head itself, never a commit of the run.
    pushed_head: str | None = None
    pushed_by: str = ""
    # The base this candidate's patch applies to when it is not the run's: the head under review rebuilt on the
    # base branch's new head (``rebuilt_from``), verified there before merging.
    base_revision: str | None = None
    rebuilt_from: str | None = None


class PublishFact(BaseModel):
    branch: str
    commit: str
    pr_number: int | None = None
    pr_url: str | None = None
    evidence_comment_id: int | None = None
    manifest_ref: ArtifactRef | None = None
    report_ref: ArtifactRef | None = None
    report_url: str | None = None
    evidence_digest: str | None = None
    # The base branch head ``commit`` was last verified on (None: the run's base revision).
    verified_base: str | None = None


class ApprovalRequest(BaseModel):
    """What a reviewer is asked to approve: this PR at this head with this evidence."""

    pr_number: int
    head_sha: str
    evidence_digest: str
    requested_at: datetime


class Approval(BaseModel):
    """A reviewer's decision as data; ``head_sha`` is enforced by the merge.

    ``expires_at`` (optional) bounds how long the decision stands: an expired approval is refused when it
    arrives, and one that expires before the merge is made does not merge (a renewed review is asked for).
    """

    reviewer: str
    head_sha: str
    evidence_digest: str | None = None
    source: str = "cli"
    review_id: str | None = None
    policy_version: int = 1
    expires_at: AwareDatetime | None = None
    pr_number: int | None = None
    """The PR the review was made on (webhook approvals): refused unless it is the run's own PR."""


class Rejection(BaseModel):
    reviewer: str
    reason: str = ""
    source: str = "cli"
    pr_number: int | None = None
    """The PR the review was made on (webhook rejections): ignored unless it is the run's own PR."""
    changes_requested: bool = False
    """A review requesting changes (not a reject command, nor a closed PR): a revision request while the
    revision budget lasts. Absent in signals sent before revisions existed: those reject."""
    review_id: str | None = None
    head_sha: str | None = None
    """The head the review was made on."""


class Withdrawal(BaseModel):
    """A review was dismissed on the forge: the approval it carried (if the run holds it and has not acted on
    it) no longer stands."""

    review_id: str
    reviewer: str
    dismissed_by: str = ""
    pr_number: int | None = None


class HeadPush(BaseModel):
    """The run's PR head moved to ``head_sha`` by someone other than the run (``pull_request`` ``synchronize``,
    or the reconciler finding the forge's head differs from the one the run awaits review of). The run never
    offers an unverified head for approval: it verifies ``head_sha`` first. ``source`` names where it was seen
    (``webhook:<delivery>``, ``reconciler``, ``merge``); the same ``head_sha`` seen twice is acted on once."""

    pr_number: int
    head_sha: str
    before: str | None = None
    pusher: str = ""
    source: str = ""


class DeliveryKind(StrEnum):
    """What a webhook delivery carried to a run (:class:`Delivered`)."""

    APPROVAL = "approval"
    REJECTION = "rejection"
    WITHDRAWAL = "withdrawal"
    REPORT_EDIT = "report-edit"
    HEAD_PUSH = "head-push"
    COMMAND = "command"


class Delivered(BaseModel):
    """One webhook delivery's decision for a run, sent as the ``deliver`` Update whose ID is the delivery's
    GUID (``X-GitHub-Delivery``): Temporal keeps one outcome per Update ID in a run, so a redelivery, or the
    same delivery reaching a second receiver, is handled once and answered with the first handling.

    ``attempt`` is unique per sending (a receiver's nonce): an answer whose record names another attempt
    is the first handling of an earlier sending, i.e. this one is a duplicate. Exactly the field that
    ``kind`` names is set (``command``: the ``/durafix`` command's name, e.g. ``cancel``)."""

    delivery: str
    attempt: str
    kind: DeliveryKind
    sender: str = ""
    approval: Approval | None = None
    rejection: Rejection | None = None
    withdrawal: Withdrawal | None = None
    edit: ReportEdit | None = None
    push: HeadPush | None = None
    command: str | None = None

    @model_validator(mode="after")
    def _carries_its_kind(self) -> Delivered:
        carried = {
            DeliveryKind.APPROVAL: self.approval,
            DeliveryKind.REJECTION: self.rejection,
            DeliveryKind.WITHDRAWAL: self.withdrawal,
            DeliveryKind.REPORT_EDIT: self.edit,
            DeliveryKind.HEAD_PUSH: self.push,
            DeliveryKind.COMMAND: self.command,
        }
        if carried[self.kind] is None:
            raise ValueError(f"a {self.kind.value} delivery must carry its {self.kind.value}")
        return self


class DeliveryRecord(BaseModel):
    """How the run handled one delivery, the first time it arrived: kept in :attr:`RunState.deliveries`."""

    delivery: str
    attempt: str
    kind: DeliveryKind
    what: str
    """What the run did with it (``approval held until the review wait begins``, ``ignored: ...``)."""
    at: datetime
    phase: Phase


class DeliveryAck(BaseModel):
    """The ``deliver`` Update's answer: the delivery's first handling (for a duplicate, an earlier one's)."""

    first: DeliveryRecord

    def duplicate_of(self, delivered: Delivered) -> bool:
        """Whether ``delivered`` was a duplicate: the record is of another sending of the same delivery."""
        return self.first.attempt != delivered.attempt


class HeadPushStatus(StrEnum):
    PENDING = "pending"
    """Seen, not verified yet."""
    VERIFYING = "verifying"
    PASSED = "passed"
    """Verified: offered for review with its own evidence."""
    FAILED = "failed"
    """Failed verification: said on the PR and the ticket, never offered for approval."""
    SUPERSEDED = "superseded"
    """The PR's head had moved on (or back) by the time the run looked at it."""


class HeadPushFact(BaseModel):
    """A head of the run's PR that the run did not push, as the run saw and judged it (``durafix status``)."""

    head_sha: str
    before: str | None = None
    pusher: str = ""
    source: str = ""
    seen_at: datetime
    status: HeadPushStatus = HeadPushStatus.PENDING
    detail: str = ""


class ReportEdit(BaseModel):
    """The report changed after the trigger: noted on the ticket, never taken into the run."""

    editor: str
    fields: list[str]
    at: datetime
    source: str = ""
    """Where it was seen: ``intake`` (the text read then differs from the pinned one) or ``webhook:<delivery>``."""


class ModelCall(BaseModel):
    """One answered model request of a repair attempt (a turn) and what it cost; ``transport_retries``: how
    many times it was sent again after a transport failure (429, 5xx, a timeout) before this answer."""

    attempt: int
    turn: int
    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    transport_retries: int = 0


class AttemptUsage(BaseModel):
    """What one repair attempt's model turns cost, and the invalid tool calls it made."""

    attempt: int
    model: str = ""
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    transport_retries: int = 0
    invalid_tool_calls: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


# How many of the latest answered model calls the run keeps in its state (per-attempt totals keep the rest).
RECENT_CALLS = 12


class Budgets(BaseModel):
    """What the run has spent, and the counts kept apart: a transport failure never spends a repair attempt
    (``transport_retries`` counts the model requests sent again after one, ``outage_waits`` / ``outage_wait_s``
    the durable waits for an endpoint whose step ran out of retries); ``refusals`` (the model declined to
    change anything, or the patch policy refused its patch), ``no_op_patches`` (edits that cancel out) and
    ``invalid_tool_calls`` (calls answered ``error: ...``) are counted apart from the attempts they happen in.

    Tokens: ``model_prompt_tokens`` / ``model_completion_tokens`` are the run's (every model call, procedure
    drafting and failed calls included), ``attempts`` each repair attempt's, ``recent_calls`` the last
    :data:`RECENT_CALLS` answered turns. ``model`` is the model the answers named (a price table's key)."""

    repair_attempts_used: int = 0
    repair_attempts_max: int
    model_prompt_tokens: int = 0
    model_completion_tokens: int = 0
    model_token_budget: int
    reproduction_runs: int = 0
    deadline: datetime | None = None
    model: str = ""
    transport_retries: int = 0
    outage_waits: int = 0
    outage_wait_s: float = 0.0
    refusals: int = 0
    no_op_patches: int = 0
    invalid_tool_calls: int = 0
    attempts: list[AttemptUsage] = Field(default_factory=list)
    recent_calls: list[ModelCall] = Field(default_factory=list)
    revisions_used: int = 0
    revisions_max: int = 0

    @property
    def model_tokens(self) -> int:
        return self.model_prompt_tokens + self.model_completion_tokens

    def attempt_usage(self, attempt: int) -> AttemptUsage:
        """The usage record of ``attempt``, made on first use."""
        for usage in self.attempts:
            if usage.attempt == attempt:
                return usage
        usage = AttemptUsage(attempt=attempt)
        self.attempts.append(usage)
        return usage


class CleanupFact(BaseModel):
    status: CleanupStatus
    removed: int = 0
    remaining: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _from_complete(cls, data: Any) -> Any:
        # Facts recorded before ``status`` carried only ``complete``.
        if isinstance(data, dict) and "status" not in data and "complete" in data:
            failed = not data["complete"] and not data.get("remaining")
            status = CleanupStatus.COMPLETE if data["complete"] else CleanupStatus.INCOMPLETE
            return {**data, "status": CleanupStatus.FAILED if failed else status}
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def complete(self) -> bool:
        return self.status == CleanupStatus.COMPLETE


class CancelStep(StrEnum):
    """Cancellation as a state machine; each step is recorded with the time it was entered."""

    REQUESTED = "cancellation-requested"
    STOPPING_ACTIVE_WORK = "stopping-active-work"
    PRESERVING_EVIDENCE = "preserving-required-evidence"
    CLEANING = "cleaning-owned-resources"
    CANCELLED = "cancelled"
    CLEANUP_INCOMPLETE = "cleanup-incomplete"


class CancelMark(BaseModel):
    step: CancelStep
    at: datetime
    detail: str = ""


class PhaseMark(BaseModel):
    phase: Phase
    at: datetime


# How many of the latest entries of each growing list the run answers with (its ``state`` query, its result):
# the rest are counted in :class:`Omitted` and kept in the run's record in the evidence store (``record_ref``).
SHOWN_DELIVERIES = 50
SHOWN_CANDIDATES = 20
SHOWN_EVIDENCE = 100
SHOWN_HEAD_PUSHES = 20


class Omitted(BaseModel):
    """How many of the earliest entries of each list a bounded :class:`RunState` leaves out: its lists hold the
    latest ones, the run's record (:attr:`RunState.record_ref`) holds them all."""

    deliveries: int = 0
    candidates: int = 0
    evidence: int = 0
    head_pushes: int = 0

    def total(self, name: str, shown: int) -> int:
        """The count of list ``name`` in the whole record, of which ``shown`` are in the bounded state."""
        return shown + int(getattr(self, name))


class RunState(BaseModel):
    """What the workflow knows. The workflow holds every entry of its lists; what it answers with (the ``state``
    query, its result) is :meth:`bounded`: the latest ``SHOWN_*`` of each, the earlier ones counted in
    ``omitted``, and, once the run stored it, ``record_ref``: the whole state as JSON in the evidence store
    (:func:`pipeline.activities.run_record.read_record`)."""

    workflow_id: str
    run_id: str
    workflow_version: int = WORKFLOW_VERSION
    repository: str
    issue_number: int
    base_branch: str
    phase: Phase = Phase.INTAKE
    checks_beside: list[str] = Field(default_factory=list)
    """The checks running side by side now (:mod:`pipeline.flow.side_by_side`), e.g. the base reproduction and
    the baseline tests; the phase is the first one's. Empty otherwise."""
    outcome: Outcome | None = None
    outcome_detail: str = ""
    triage: TriageFact | None = None
    """The typed reason of a ``needs-human-triage`` ending the run can name (see :class:`TriageReason`)."""
    target_revision: str | None = None
    ticket: TicketFact | None = None
    environment: EnvironmentFact | None = None
    reproduction_kind: ReproductionKind = ReproductionKind.BROWSER
    """The kind of the run's reproduction (set when its procedure is stored): ``browser`` against the provisioned
    app; ``command`` and ``test`` in the sandbox, with no app. A state recorded before kinds existed is browser."""
    reproduction_app: bool = False
    """A command reproduction that runs against the provisioned app (``app: true``): provision, then
    ``env.reproduce_in_environment``, then teardown. False for every other reproduction (and states recorded before)."""
    reproduction: ReproductionFact | None = None
    drafting: DraftingFact | None = None
    """The report's reproduction was drafted from its prose (and run on the base, round by round)."""
    baseline: BaselineFact | None = None
    reproduction_seed: ReproductionSeedFact | None = None
    """A test reproduction's files as a patch the repair attempts start from (None: nothing to seed)."""
    candidates: list[CandidateFact] = Field(default_factory=list)
    publish: PublishFact | None = None
    pending_approval: ApprovalRequest | None = None
    approval: Approval | None = None
    report_edits: list[ReportEdit] = Field(default_factory=list)
    deliveries: list[DeliveryRecord] = Field(default_factory=list)
    """Every webhook delivery the run handled (``deliver``), in order, each once."""
    head_pushes: list[HeadPushFact] = Field(default_factory=list)
    merged_sha: str | None = None
    budgets: Budgets
    evidence: list[ArtifactRef] = Field(default_factory=list)
    cleanup: CleanupFact | None = None
    cancellation: list[CancelMark] = Field(default_factory=list)
    timeline: list[PhaseMark] = Field(default_factory=list)

    omitted: Omitted = Field(default_factory=Omitted)
    record_ref: ArtifactRef | None = None

    @property
    def candidate(self) -> CandidateFact | None:
        return self.candidates[-1] if self.candidates else None

    def bounded(self) -> RunState:
        """A copy whose growing lists keep their latest ``SHOWN_*`` entries, the cut ones added to ``omitted``:
        its size no longer grows with the deliveries, pushes and attempts a run sees. ``candidate`` (the latest)
        is unchanged. A pure function of the state (the workflow answers with it deterministically)."""
        cut: dict[str, Any] = {}
        omitted = self.omitted.model_copy()
        for name, keep in (
            ("deliveries", SHOWN_DELIVERIES),
            ("candidates", SHOWN_CANDIDATES),
            ("evidence", SHOWN_EVIDENCE),
            ("head_pushes", SHOWN_HEAD_PUSHES),
        ):
            entries: list[Any] = getattr(self, name)
            if len(entries) > keep:
                cut[name] = entries[-keep:]
                setattr(omitted, name, getattr(omitted, name) + len(entries) - keep)
        return self.model_copy(update={**cut, "omitted": omitted}) if cut else self
