"""The repair engine: a tool-calling loop against any OpenAI-compatible chat-completions endpoint.

One attempt is one conversation. The model sees the bug report (and why earlier attempts failed), explores
and edits the workspace through the tools in :mod:`repair.tools`, and ends by calling ``finish``; the
proposal is then the workspace's diff against its base revision.

Retries: requests go through :class:`repair.openai_calls.ChatEndpoint`, whose SDK retries are off by default
(``max_retries=0``). A failed request surfaces at once as :class:`~repair.interface.ModelTransientError` or
:class:`~repair.interface.ModelPermanentError` and the activity's Temporal retry policy decides what happens
next: one place owns backoff, attempts are visible in the workflow history, and a ``retry-after`` the endpoint
sent reaches Temporal as the next retry delay instead of being slept through inside an attempt.
A retried attempt starts a new conversation on a freshly rebuilt workspace.

Budgets: every response's ``usage`` is added up; once prompt plus completion tokens exceed the request's
``token_budget``, or ``max_turns`` responses have come back without ``finish``, the attempt stops with
:class:`~repair.interface.RepairBudgetError`. An endpoint that reports no usage is refused, since the budget
could not be kept.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
)

from repair.config import ModelConfig
from repair.interface import (
    NoPatchError,
    RepairBudgetError,
    RepairProposal,
    RepairRequest,
)
from repair.openai_calls import ChatEndpoint, TokenUsage, assistant_param, first_message, function_calls
from repair.patch import workspace_patch
from repair.prompts import system_prompt, user_prompt
from repair.tools import FINISH, parse_arguments, run_tool, tool_schemas
from repair.workspace_tools import ToolRefused, WorkspaceTools


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

    def propose(self, request: RepairRequest) -> RepairProposal:
        workspace = WorkspaceTools(Path(request.workspace))
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": system_prompt(request)},
            {"role": "user", "content": user_prompt(request)},
        ]
        usage = TokenUsage()
        turns = tool_calls = 0
        served_by = self._endpoint.model
        summary: str | None = None
        while summary is None:
            if turns >= request.max_turns:
                raise RepairBudgetError(
                    f"the model used all {request.max_turns} turns without finishing", **usage.spent()
                )
            completion = self._complete(request, messages, usage)
            turns += 1
            if self._on_turn is not None:
                self._on_turn(turns)
            served_by = completion.model
            message = first_message(completion, usage)
            calls = function_calls(message, usage)
            messages.append(assistant_param(message, calls))
            if not calls:
                # A model that stops talking without calling finish is done all the same.
                summary = (message.content or "").strip() or "(the model gave no summary)"
            for call in calls:
                tool_calls += 1
                result, finished = _carry_out(workspace, call)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
                summary = finished if finished is not None else summary

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

    def _complete(
        self, request: RepairRequest, messages: list[ChatCompletionMessageParam], usage: TokenUsage
    ) -> ChatCompletion:
        """One model request (classified as :mod:`repair.openai_calls` says), its tokens held to the budget."""
        completion = self._endpoint.complete(messages, tools=tool_schemas(), op_id=request.op_id, usage=usage)
        if usage.total > request.token_budget:
            raise RepairBudgetError(f"{usage.total} tokens used; the budget is {request.token_budget}", **usage.spent())
        return completion


def _carry_out(workspace: WorkspaceTools, call: ChatCompletionMessageFunctionToolCall) -> tuple[str, str | None]:
    """The tool's result text, and the summary when the call was ``finish``."""
    name = call.function.name
    try:
        args = parse_arguments(name, call.function.arguments)
    except ToolRefused as e:
        return f"error: {e}", None
    return run_tool(workspace, name, args), args["summary"] if name == FINISH else None
