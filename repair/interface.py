"""The repair capability's typed interface: what an engine is asked, what it answers, how it fails.

A :class:`RepairEngine` turns a bug report plus a scratch git working tree at the base revision into a
:class:`RepairProposal` (a unified diff). Contracts:

- ``propose`` has no external effect besides model calls and edits inside ``request.workspace``. It is not
  idempotent at the model (a second call may get another answer and spends tokens again); it is safe to
  retry because the caller rebuilds the workspace from the base revision at the start of every attempt and
  records the proposal it keeps under ``request.op_id``.
- Failures are classified by exception type, so the caller maps them onto retry classes without reading
  messages: :class:`ModelTransientError` is retried (after ``retry_after`` when the endpoint named one);
  :class:`ModelPermanentError`, :class:`RepairBudgetError` and :class:`NoPatchError` are not. Every error
  carries the tokens spent before it, so budgets stay honest across failed calls.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field


class RepairRequest(BaseModel):
    run_id: str
    op_id: str
    attempt: int = Field(ge=1)
    issue_title: str
    issue_body: str
    workspace: str = Field(description="a git working tree at the base revision, which the engine may edit")
    previous_failures: list[str] = Field(
        default_factory=list, description="short summaries of why earlier attempts failed verification"
    )
    max_turns: int = Field(default=30, ge=1)
    token_budget: int = Field(ge=1)
    revision: int = Field(default=0, ge=0, description="a revision of the candidate under review (0: none)")
    review_feedback: str = Field(default="", description="what the review asking for the revision said")


class RepairProposal(BaseModel):
    patch: str = Field(description="unified diff of the workspace against its base revision, new files included")
    summary: str
    files_changed: list[str]
    model: str
    prompt_tokens: int
    completion_tokens: int
    turns: int
    tool_calls: int


class RepairEngine(Protocol):
    def propose(self, request: RepairRequest) -> RepairProposal: ...


class RepairError(Exception):
    """Base of the engine's failures; carries the tokens spent before the failure."""

    def __init__(self, message: str, *, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens


class ModelTransientError(RepairError):
    """Worth retrying: 429 (``retry_after`` seconds when the endpoint said), 408/409/5xx, timeout, no connection."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        status: int | None = None,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        super().__init__(message, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        self.retry_after = retry_after
        self.status = status


class ModelPermanentError(RepairError):
    """Retrying cannot help: 400/401/403/404/422, or an answer the engine cannot use."""

    def __init__(
        self, message: str, *, status: int | None = None, prompt_tokens: int = 0, completion_tokens: int = 0
    ) -> None:
        super().__init__(message, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        self.status = status


class RepairBudgetError(RepairError):
    """The attempt spent its token budget or its turns before the model finished."""


class NoPatchError(RepairError):
    """The model finished without changing anything in the workspace."""
