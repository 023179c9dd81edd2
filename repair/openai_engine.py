"""The repair engine: a tool-calling loop against any OpenAI-compatible chat-completions endpoint.

One attempt is one conversation. The model sees the bug report (and why earlier attempts failed), explores
and edits the workspace through the tools in :mod:`repair.tools`, and ends by calling ``finish``; the
proposal is then the workspace's diff against its base revision.

Retries: requests go through :class:`repair.openai_calls.ChatEndpoint`, whose SDK retries are off by default
(``max_retries=0``). A failed request surfaces at once as :class:`~repair.interface.ModelTransientError` or
:class:`~repair.interface.ModelPermanentError` and the activity's Temporal retry policy decides what happens
next: one place owns backoff, attempts are visible in the workflow history, and a ``retry-after`` the endpoint
sent reaches Temporal as the next retry delay instead of being slept through inside an attempt.
A retried attempt starts a new conversation on a freshly rebuilt workspace. The pipeline's stepped attempt
(:mod:`repair.stepping`, driven step by step by the workflow) runs the same turn and tool functions, each
recorded, so a retry there re-sends only the call in flight.

Budgets: every response's ``usage`` is added up; once prompt plus completion tokens exceed the request's
``token_budget``, or ``max_turns`` responses have come back without ``finish``, the attempt stops with
:class:`~repair.interface.RepairBudgetError`. An endpoint that reports no usage is refused, since the budget
could not be kept.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from repair.config import ModelConfig
from repair.interface import (
    NoPatchError,
    RepairBudgetError,
    RepairProposal,
    RepairRequest,
)
from repair.openai_calls import ChatEndpoint, TokenUsage
from repair.patch import workspace_patch
from repair.stepping import model_turn, opening_messages, tool_batch
from repair.workspace_tools import WorkspaceTools


class OpenAIToolEngine:
    """:class:`~repair.interface.RepairEngine` over the openai SDK.

    ``on_turn(n)`` is called after the n-th model response, so a Temporal activity can heartbeat with the
    attempt's progress. Each request carries the attempt's operation ID in the ``X-Durafix-Op-Id`` header,
    so the endpoint's logs can be matched to the run.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        timeout_s: float,
        max_retries: int = 0,
        on_turn: Callable[[int], None] | None = None,
    ) -> None:
        self._endpoint = ChatEndpoint(base_url, api_key, model, timeout_s, max_retries)
        self._on_turn = on_turn

    @classmethod
    def from_config(cls, config: ModelConfig, on_turn: Callable[[int], None] | None = None) -> OpenAIToolEngine:
        return cls(config.base_url, config.api_key, config.model, config.timeout_s, on_turn=on_turn)

    @property
    def endpoint(self) -> ChatEndpoint:
        """The endpoint this engine talks to (the stepped attempt sends its turns through it too)."""
        return self._endpoint

    def propose(self, request: RepairRequest) -> RepairProposal:
        """The whole attempt in memory: :func:`repair.stepping.model_turn` and :func:`repair.stepping.tool_batch`
        in a loop on ``request.workspace``."""
        workspace = WorkspaceTools(Path(request.workspace))
        messages = opening_messages(request)
        usage = TokenUsage()
        turns = tool_calls = 0
        served_by = self._endpoint.model
        summary: str | None = None
        while summary is None:
            if turns >= request.max_turns:
                raise RepairBudgetError(
                    f"the model used all {request.max_turns} turns without finishing", **usage.spent()
                )
            turn = model_turn(
                self._endpoint, messages, op_id=request.op_id, token_budget=request.token_budget, usage=usage
            )
            turns += 1
            if self._on_turn is not None:
                self._on_turn(turns)
            served_by = turn.model
            messages = turn.messages
            summary = turn.summary
            tool_calls += len(turn.calls)
            batch = tool_batch(workspace, turn.calls)
            messages += batch.messages
            summary = batch.summary if batch.summary is not None else summary

        patch, files = workspace_patch(workspace.root)
        if not patch:
            raise NoPatchError(f"the model finished without changing anything: {summary}", **usage.spent())
        return RepairProposal(
            patch=patch,
            summary=summary,
            files_changed=files,
            model=served_by,
            prompt_tokens=usage.prompt,
            completion_tokens=usage.completion,
            turns=turns,
            tool_calls=tool_calls,
        )
