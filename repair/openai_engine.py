"""The repair engine: a tool-calling loop against any OpenAI-compatible chat-completions endpoint.

One attempt is one conversation. The model sees the bug report (and why earlier attempts failed), explores
and edits the workspace through the tools in :mod:`repair.tools`, and ends by calling ``finish``; the
proposal is then the workspace's diff against its base revision.

Retries: the openai SDK's own retries are off by default (``max_retries=0``). A failed request surfaces at
once as :class:`ModelTransientError` or :class:`ModelPermanentError` and the activity's Temporal retry policy
decides what happens next: one place owns backoff, attempts are visible in the workflow history, and a
``retry-after`` the endpoint sent reaches Temporal as the next retry delay instead of being slept through
inside an attempt. A retried attempt starts a new conversation on a freshly rebuilt workspace.

Budgets: every response's ``usage`` is added up; once prompt plus completion tokens exceed the request's
``token_budget``, or ``max_turns`` responses have come back without ``finish``, the attempt stops with
:class:`RepairBudgetError`. An endpoint that reports no usage is refused, since the budget could not be kept.
"""

from __future__ import annotations

import email.utils
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

import openai
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessage,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
)

from repair.config import ModelConfig
from repair.interface import (
    ModelPermanentError,
    ModelTransientError,
    NoPatchError,
    RepairBudgetError,
    RepairProposal,
    RepairRequest,
)
from repair.patch import workspace_patch
from repair.prompts import system_prompt, user_prompt
from repair.tools import FINISH, parse_arguments, run_tool, tool_schemas
from repair.workspace_tools import ToolRefused, WorkspaceTools

OP_ID_HEADER = "X-Durafix-Op-Id"
_TRANSIENT_STATUSES = {408, 409, 429}


class _Usage:
    def __init__(self) -> None:
        self.prompt = 0
        self.completion = 0

    @property
    def total(self) -> int:
        return self.prompt + self.completion


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
        self.model = model
        self.timeout_s = timeout_s
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=max_retries)
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
        usage = _Usage()
        turns = tool_calls = 0
        served_by = self.model
        summary: str | None = None
        while summary is None:
            if turns >= request.max_turns:
                raise RepairBudgetError(
                    f"the model used all {request.max_turns} turns without finishing",
                    prompt_tokens=usage.prompt,
                    completion_tokens=usage.completion,
                )
            completion = self._complete(request, messages, usage)
            turns += 1
            if self._on_turn is not None:
                self._on_turn(turns)
            served_by = completion.model
            message = completion.choices[0].message
            calls = self._function_calls(message, usage)
            messages.append(_assistant_param(message, calls))
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
            raise NoPatchError(
                f"the model finished without changing anything: {summary}",
                prompt_tokens=usage.prompt,
                completion_tokens=usage.completion,
            )
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
        self, request: RepairRequest, messages: list[ChatCompletionMessageParam], usage: _Usage
    ) -> ChatCompletion:
        """One model request, its failure classified and its tokens counted against the budget."""
        spent = {"prompt_tokens": usage.prompt, "completion_tokens": usage.completion}
        try:
            completion = self._client.chat.completions.create(
                model=self.model,
                messages=messages,
                tools=tool_schemas(),
                extra_headers={OP_ID_HEADER: request.op_id},
            )
        except openai.APITimeoutError as e:
            raise ModelTransientError(f"model request timed out after {self.timeout_s:g}s", **spent) from e
        except openai.APIConnectionError as e:
            raise ModelTransientError(f"cannot reach the model endpoint: {e}", **spent) from e
        except openai.APIStatusError as e:
            status = e.status_code
            text = f"model endpoint answered {status}: {e.message}"
            if status in _TRANSIENT_STATUSES or status >= 500:
                retry_after = _retry_after(e.response.headers)
                raise ModelTransientError(text, retry_after=retry_after, status=status, **spent) from e
            raise ModelPermanentError(text, status=status, **spent) from e
        if completion.usage is None:
            raise ModelPermanentError("the endpoint reports no token usage, so the budget cannot be kept", **spent)
        usage.prompt += completion.usage.prompt_tokens
        usage.completion += completion.usage.completion_tokens
        if usage.total > request.token_budget:
            raise RepairBudgetError(
                f"{usage.total} tokens used; the budget is {request.token_budget}",
                prompt_tokens=usage.prompt,
                completion_tokens=usage.completion,
            )
        if not completion.choices:
            raise ModelPermanentError(
                "the endpoint answered without choices",
                prompt_tokens=usage.prompt,
                completion_tokens=usage.completion,
            )
        return completion

    @staticmethod
    def _function_calls(message: ChatCompletionMessage, usage: _Usage) -> list[ChatCompletionMessageFunctionToolCall]:
        calls = message.tool_calls or []
        functions = [c for c in calls if isinstance(c, ChatCompletionMessageFunctionToolCall)]
        if len(functions) != len(calls):
            raise ModelPermanentError(
                "the endpoint answered with a non-function tool call; only function tools are offered",
                prompt_tokens=usage.prompt,
                completion_tokens=usage.completion,
            )
        return functions


def _carry_out(workspace: WorkspaceTools, call: ChatCompletionMessageFunctionToolCall) -> tuple[str, str | None]:
    """The tool's result text, and the summary when the call was ``finish``."""
    name = call.function.name
    try:
        args = parse_arguments(name, call.function.arguments)
    except ToolRefused as e:
        return f"error: {e}", None
    return run_tool(workspace, name, args), args["summary"] if name == FINISH else None


def _assistant_param(
    message: ChatCompletionMessage, calls: list[ChatCompletionMessageFunctionToolCall]
) -> ChatCompletionMessageParam:
    if not calls:
        return {"role": "assistant", "content": message.content}
    return {
        "role": "assistant",
        "content": message.content,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in calls
        ],
    }


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the endpoint asked us to wait: ``retry-after-ms``, or ``retry-after`` in seconds or as a date."""
    if (ms := _number(headers.get("retry-after-ms"))) is not None:
        return max(ms / 1000, 0.0)
    value = headers.get("retry-after")
    if not value:
        return None
    if (seconds := _number(value)) is not None:
        return max(seconds, 0.0)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000" parses naive; HTTP dates are UTC
        when = when.replace(tzinfo=UTC)
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None
