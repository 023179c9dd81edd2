"""The workflow's input and the answers of its update handlers."""

from __future__ import annotations

from pydantic import BaseModel, Field

from pipeline.policies import RunPolicy


class RepairInput(BaseModel):
    """What starts a run: where the report lives, and the policy the run keeps for its whole life."""

    repository: str
    issue_number: int
    base_branch: str = "main"
    trigger: str = "cli"
    policy: RunPolicy = Field(default_factory=RunPolicy)
    environment_provider: str | None = None


class ApprovalAck(BaseModel):
    accepted: bool
    detail: str
