"""One repair attempt cut into steps: a model turn, a batch of tool calls, each a pure function of its inputs.

The attempt's state is its transcript (the chat messages so far) plus the patch so far against the base
revision. A caller that stores both after every step (the workflow does, by content in the evidence store)
can resume an attempt after any step on any host:

- :func:`model_turn` sends the transcript once and returns it with the model's answer appended, the tool
  calls asked for, and the tokens the answer cost. It is not idempotent at the model; a caller re-sends it
  only when its answer was never recorded (the call was in flight when a worker died).
- :func:`tool_batch` carries out the calls on a workspace and returns the ``tool`` messages. Every tool is
  a read of the workspace or an edit of it (:mod:`repair.tools`), so running a batch again on a workspace
  rebuilt at the batch's pre-state (base + the patch before the batch) gives the same messages and the same
  patch: a batch is replay-safe by construction.

:class:`~repair.openai_engine.OpenAIToolEngine` runs the same two functions in one loop in memory.
"""

from __future__ import annotations

import json
from typing import Any, cast

from openai.types.chat import ChatCompletionMessageFunctionToolCall, ChatCompletionMessageParam
from pydantic import BaseModel

from repair.context import RepairContext
from repair.interface import RepairBudgetError, RepairRequest
from repair.openai_calls import ChatEndpoint, TokenUsage, assistant_param, first_message, function_calls
from repair.prompts import system_prompt, user_prompt
from repair.tools import FINISH, parse_arguments, run_tool, tool_schemas
from repair.workspace_tools import ToolRefused, WorkspaceTools

NO_SUMMARY = "(the model gave no summary)"


class ToolCall(BaseModel):
    """One function call the model asked for, as it appears in its answer."""

    id: str
    name: str
    arguments: str


class TurnOutcome(BaseModel):
    """A model turn: the transcript with the answer appended, the calls asked for, and what the answer cost.

    ``summary`` is set when the answer holds no tool call (a model that stops talking is done)."""

    messages: list[dict[str, Any]]
    calls: list[ToolCall]
    summary: str | None
    model: str
    prompt_tokens: int
    completion_tokens: int


class BatchOutcome(BaseModel):
    """A tool batch: one ``tool`` message per call, in order, and the summary when ``finish`` was called."""

    messages: list[dict[str, Any]]
    summary: str | None


def opening_messages(request: RepairRequest, context: RepairContext | None = None) -> list[dict[str, Any]]:
    """The system prompt and user message that open attempt ``request.attempt``, the run's facts in the latter
    when ``context`` is given (deterministic: the same request and context give the same messages)."""
    return [
        {"role": "system", "content": system_prompt(request)},
        {"role": "user", "content": user_prompt(request, context)},
    ]


def model_turn(
    endpoint: ChatEndpoint,
    messages: list[dict[str, Any]],
    *,
    op_id: str,
    token_budget: int,
    usage: TokenUsage | None = None,
) -> TurnOutcome:
    """Send ``messages`` once, the answer's tokens added to ``usage`` (a fresh count when omitted).

    :class:`RepairBudgetError` once ``usage`` exceeds ``token_budget``; the endpoint's classified errors as
    they come. Every error carries ``usage``'s tokens; the outcome carries this answer's alone."""
    usage = usage if usage is not None else TokenUsage()
    before = usage.spent()
    params = cast(list[ChatCompletionMessageParam], messages)
    completion = endpoint.complete(params, tools=tool_schemas(), op_id=op_id, usage=usage)
    if usage.total > token_budget:
        raise RepairBudgetError(f"{usage.total} tokens used; the budget is {token_budget}", **usage.spent())
    message = first_message(completion, usage)
    calls = function_calls(message, usage)
    summary = None if calls else ((message.content or "").strip() or NO_SUMMARY)
    return TurnOutcome(
        messages=[*messages, cast(dict[str, Any], assistant_param(message, calls))],
        calls=[_call(c) for c in calls],
        summary=summary,
        model=completion.model,
        prompt_tokens=usage.prompt - before["prompt_tokens"],
        completion_tokens=usage.completion - before["completion_tokens"],
    )


def tool_batch(workspace: WorkspaceTools, calls: list[ToolCall]) -> BatchOutcome:
    """Carry out ``calls`` in order on ``workspace``; a call that cannot be carried out is answered ``error: ...``."""
    messages: list[dict[str, Any]] = []
    summary: str | None = None
    for call in calls:
        result, finished = _carry_out(workspace, call)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        summary = finished if finished is not None else summary
    return BatchOutcome(messages=messages, summary=summary)


def encode_transcript(messages: list[dict[str, Any]]) -> bytes:
    """The transcript as compact JSON, keys in the order the messages hold them: a resumed turn then sends the
    very bytes an uninterrupted one sends (endpoints may key answers on them, the scripted server's call IDs
    do), and the same transcript is always the same stored content."""
    return json.dumps(messages, separators=(",", ":"), ensure_ascii=False).encode()


def decode_transcript(data: bytes) -> list[dict[str, Any]]:
    messages = json.loads(data)
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError("a transcript is a JSON list of message objects")
    return messages


def _call(call: ChatCompletionMessageFunctionToolCall) -> ToolCall:
    return ToolCall(id=call.id, name=call.function.name, arguments=call.function.arguments)


def _carry_out(workspace: WorkspaceTools, call: ToolCall) -> tuple[str, str | None]:
    """The tool's result text, and the summary when the call was ``finish``."""
    try:
        args = parse_arguments(call.name, call.arguments)
    except ToolRefused as e:
        return f"error: {e}", None
    return run_tool(workspace, call.name, args), args["summary"] if call.name == FINISH else None
