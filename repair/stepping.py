"""One repair attempt cut into steps: a model turn, a batch of tool calls, each a pure function of its inputs.

The attempt's state is its transcript (the chat messages so far) plus the patch so far against the base
revision. A caller that stores both after every step (the workflow does, by content in the evidence store)
can resume an attempt after any step on any host:

- :func:`model_turn` sends the transcript once and returns it with the model's answer appended, the tool
  calls asked for, and the tokens the answer cost. It is not idempotent at the model; a caller re-sends it
  only when its answer was never recorded (the call was in flight when a worker died).
- :func:`tool_batch` carries out workspace-tool calls on a workspace and returns the ``tool`` messages.
  Every such tool is a read of the workspace or an edit of it (:mod:`repair.tools`), so running a batch again
  on a workspace rebuilt at the batch's pre-state (base + the patch before the batch) gives the same
  messages and the same patch: a batch is replay-safe by construction.
- :func:`segments` cuts a turn's calls into such batches and single run-tool calls (``run_tests``, ``run``,
  ``run_reproduction``), which run elsewhere, in the sandbox, and are never repeated behind the model's back.

What a caller records between steps is small whatever the model wrote: a call travels as its ID, its name and
the sha256 and length of its arguments (:func:`arguments_digest`); the arguments themselves (a ``write_file``
holds a whole file) are read back from the stored transcript, whose last answer asked for the call
(:func:`call_in_transcript`). Summaries are cut to :data:`MAX_SUMMARY_CHARS` (:func:`bounded_summary`).

:class:`~repair.openai_engine.OpenAIToolEngine` runs the same two functions in one loop in memory.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel

from repair.context import RepairContext
from repair.interface import RepairBudgetError, RepairError, RepairRequest
from repair.openai_calls import ChatEndpoint, TokenUsage, assistant_param, first_message, function_calls
from repair.prompts import system_prompt, user_prompt
from repair.tools import EDITS, ERROR_PREFIX, FINISH, RUN_TOOLS, parse_arguments, run_tool, tool_schemas
from repair.workspace_tools import ToolRefused, WorkspaceTools

if TYPE_CHECKING:  # the SDK's types only (repair/openai_calls.py says why the SDK is imported late)
    from openai.types.chat import ChatCompletionMessageFunctionToolCall, ChatCompletionMessageParam

NO_SUMMARY = "(the model gave no summary)"
# A summary becomes the candidate's description (the pull request's text, the run's state): the model may write
# any length, so what leaves the attempt is cut here; the whole text stays in the stored transcript.
MAX_SUMMARY_CHARS = 4_000


class TranscriptMismatch(RepairError):
    """A call's reference names arguments the transcript's last answer does not hold (a transcript that is not
    the one the call was asked in): nothing is carried out, and retrying cannot help."""


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
    """A tool batch: one ``tool`` message per call, in order, and the summary when ``finish`` was called.
    ``invalid_calls``: the calls answered ``error: ...`` (the model asked for something that cannot be done)."""

    messages: list[dict[str, Any]]
    summary: str | None
    invalid_calls: int = 0


def opening_messages(
    request: RepairRequest, context: RepairContext | None = None, tools: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """The system prompt and user message that open attempt ``request.attempt``, the run's facts in the latter
    when ``context`` is given, the former telling which run tools are offered (``tools``; default: the
    workspace tools only). Deterministic: the same request, context and offer give the same messages."""
    kind = context.reproduction.kind if context is not None and context.reproduction is not None else "browser"
    runs = [t for t in tools or () if t in RUN_TOOLS]
    return [
        {"role": "system", "content": system_prompt(request, runs=runs, reproduction_kind=kind)},
        {"role": "user", "content": user_prompt(request, context)},
    ]


def model_turn(
    endpoint: ChatEndpoint,
    messages: list[dict[str, Any]],
    *,
    op_id: str,
    token_budget: int,
    usage: TokenUsage | None = None,
    tools: Sequence[str] | None = None,
) -> TurnOutcome:
    """Send ``messages`` once, offering ``tools`` (default: the workspace tools), the answer's tokens added to
    ``usage`` (a fresh count when omitted).

    :class:`RepairBudgetError` once ``usage`` exceeds ``token_budget``; the endpoint's classified errors as
    they come. Every error carries ``usage``'s tokens; the outcome carries this answer's alone."""
    usage = usage if usage is not None else TokenUsage()
    before = usage.spent()
    params = cast("list[ChatCompletionMessageParam]", messages)
    completion = endpoint.complete(params, tools=tool_schemas(tools), op_id=op_id, usage=usage)
    if usage.total > token_budget:
        raise RepairBudgetError(f"{usage.total} tokens used; the budget is {token_budget}", **usage.spent())
    message = first_message(completion, usage)
    calls = function_calls(message, usage)
    summary = None if calls else bounded_summary((message.content or "").strip() or NO_SUMMARY)
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
    invalid = 0
    for call in calls:
        result, finished = _carry_out(workspace, call)
        messages.append(tool_message(call.id, result))
        summary = bounded_summary(finished) if finished is not None else summary
        invalid += result.startswith(ERROR_PREFIX)
    return BatchOutcome(messages=messages, summary=summary, invalid_calls=invalid)


def made_edits(messages: list[dict[str, Any]]) -> bool:
    """Whether the transcript holds an edit the workspace carried out (an edit tool's call not answered
    ``error: ...``): an attempt that ends without a patch after one made a no-op patch (its edits cancel out),
    one that never edited declined to change anything."""
    answers = {m.get("tool_call_id"): str(m.get("content", "")) for m in messages if m.get("role") == "tool"}
    for message in (m for m in messages if m.get("role") == "assistant"):
        for call in message.get("tool_calls") or []:
            name = call.get("function", {}).get("name")
            answer = answers.get(call.get("id"))
            if name in EDITS and answer is not None and not answer.startswith(ERROR_PREFIX):
                return True
    return False


@dataclass(frozen=True)
class Segment:
    """Consecutive calls of one turn carried out in one place: ``run`` is ``None`` for workspace tools (one
    batch), else the run tool's name (one call per segment, since each runs on its own)."""

    run: str | None
    calls: list[ToolCall]


def segments(calls: Sequence[ToolCall]) -> list[Segment]:
    """``calls`` cut, in order, into workspace batches and single run-tool calls: a run sees every edit asked
    for before it, and no edit asked for after it."""
    out: list[Segment] = []
    for call in calls:
        if call.name in RUN_TOOLS:
            out.append(Segment(call.name, [call]))
        elif out and out[-1].run is None:
            out[-1].calls.append(call)
        else:
            out.append(Segment(None, [call]))
    return out


def arguments_digest(arguments: str) -> str:
    """The sha256 (hex) of a call's arguments text, as UTF-8 (a lone surrogate the model's JSON escaped
    hashes as itself rather than failing)."""
    return hashlib.sha256(arguments.encode("utf-8", "surrogatepass")).hexdigest()


def call_in_transcript(messages: list[dict[str, Any]], call_id: str, name: str, sha256: str) -> ToolCall:
    """The call ``call_id`` of the transcript's last assistant message (the answer of the turn whose calls are
    being carried out: tool results are appended after it, never another answer) with that ``name`` and
    arguments hashing to ``sha256``. The digest decides, not the ID alone: a model may give two calls the same
    ID. :class:`TranscriptMismatch` when no such call is there."""
    answer = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    for call in (answer or {}).get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if (
            call.get("id") == call_id
            and function.get("name") == name
            and isinstance(arguments, str)
            and arguments_digest(arguments) == sha256
        ):
            return ToolCall(id=call_id, name=name, arguments=arguments)
    raise TranscriptMismatch(f"the transcript's last answer holds no {name} call {call_id!r} with arguments {sha256}")


def bounded_summary(summary: str) -> str:
    """``summary`` cut to :data:`MAX_SUMMARY_CHARS`, saying how much was cut (the transcript holds it all)."""
    if len(summary) <= MAX_SUMMARY_CHARS:
        return summary
    cut = len(summary) - MAX_SUMMARY_CHARS
    return f"{summary[:MAX_SUMMARY_CHARS]}\n[{cut} more characters of the summary are in the attempt's transcript]"


def tool_message(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


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
        return f"{ERROR_PREFIX}{e}", None
    return run_tool(workspace, call.name, args), args["summary"] if call.name == FINISH else None
