"""The workflow's input and the answers of its update handlers."""

from __future__ import annotations

from pydantic import BaseModel, Field

from pipeline.flow.carry import ReviewCarry
from pipeline.policies import RunPolicy


class PinnedReport(BaseModel):
    """The report as it read when the run was triggered (the webhook payload's issue), which the run uses
    instead of what the issue says by the time the run reads it: whoever can edit the issue cannot change
    what a permitted user asked durafix to work on."""

    title: str
    body: str
    author: str = ""
    triggered_by: str = ""


class RepairInput(BaseModel):
    """What starts a run: where the report lives, and the policy the run keeps for its whole life.

    ``report``: the text pinned at the trigger; None (runs started before pinning, and ``durafix start``)
    means the text read at intake."""

    repository: str
    issue_number: int
    base_branch: str = "main"
    trigger: str = "cli"
    policy: RunPolicy = Field(default_factory=RunPolicy)
    environment_provider: str | None = None
    report: PinnedReport | None = None
    # Set only by the run itself when its review wait continues as new: the state it continues with.
    resume: ReviewCarry | None = None


class ApprovalAck(BaseModel):
    accepted: bool
    detail: str
