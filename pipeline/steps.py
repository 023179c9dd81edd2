"""The contract between the workflow and its activities: names, task queues, inputs and outputs.

The workflow calls activities by name with these models, so it never imports a provider (PyGithub,
Playwright, Docker, the openai SDK). Each capability package implements its names in ``activities.py``.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from environments.interface import CleanupReport, EnvironmentHandle
from evidence.interface import ArtifactRef


class TaskQueue(StrEnum):
    """One queue per capability, so each can be scaled on hosts that have what it needs."""

    ORCHESTRATION = "durafix-orchestration"
    FORGE = "durafix-forge"
    ENVIRONMENTS = "durafix-environments"
    BROWSER = "durafix-browser"
    MODEL = "durafix-model"


# ---- forge (reviews/activities.py) -------------------------------------------------------------------


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


class MergeInput(BaseModel):
    op_id: str
    repository: str
    number: int
    approved_sha: str


class MergeStatus(StrEnum):
    MERGED = "merged"
    HEAD_MOVED = "head_moved"
    NOT_MERGEABLE = "not_mergeable"
    ALREADY_MERGED = "already_merged"


class MergeOutcome(BaseModel):
    status: MergeStatus
    merged_sha: str | None = None
    detail: str = ""


# ---- environments (environments/activities.py) -------------------------------------------------------


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


class VerifyInput(BaseModel):
    run_id: str
    op_id: str
    spec_ref: ArtifactRef
    patch_ref: ArtifactRef
    message: str
    commit_timestamp: int


class VerifyResult(BaseModel):
    commit: str
    tree: str
    tests_passed: bool
    test_summary: str
    test_output_ref: ArtifactRef
    bundle_ref: ArtifactRef


class CleanupRunInput(BaseModel):
    run_id: str


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


class EvidenceResult(BaseModel):
    manifest_ref: ArtifactRef
    report_ref: ArtifactRef
    digest: str
    report_url: str
    links: dict[str, str] = Field(default_factory=dict)


# ---- browser (browser/activities.py) -----------------------------------------------------------------


class PrepareProcedureInput(BaseModel):
    run_id: str
    report_body: str


class ProcedureResult(BaseModel):
    """``missing``: the report has no procedure block at all (so one may be drafted from its prose)."""

    procedure_ref: ArtifactRef | None
    error: str | None = None
    missing: bool = False
    drafted: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ReproduceInput(BaseModel):
    run_id: str
    op_id: str
    revision: str
    procedure_ref: ArtifactRef
    environment: EnvironmentHandle
    readiness_path: str = "/"


class ReproduceResult(BaseModel):
    status: str
    detail: str
    artifacts: list[ArtifactRef]
    trace_refs: list[ArtifactRef]
    screenshot_refs: list[ArtifactRef]
    video_refs: list[ArtifactRef] = []
    log_ref: ArtifactRef | None = None
    runs: int


# ---- model (repair/activities.py) --------------------------------------------------------------------


class DraftProcedureInput(BaseModel):
    run_id: str
    op_id: str
    issue_title: str
    issue_body: str


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
    patch_ref: ArtifactRef
    summary: str
    files_changed: list[str]
    prompt_tokens: int
    completion_tokens: int
    model: str


__all__ = [
    "CleanupReport",
    "EnvironmentHandle",
]
