"""Requests to an OpenAI-compatible chat-completions endpoint, and how their failures are classified.

The repair engine and the procedure drafter both talk to the model through :class:`ChatEndpoint`, so an
endpoint's failure means the same to either of them.

Retries: the openai SDK's own retries are off by default (``max_retries=0``). A failed request surfaces at
once as :class:`~repair.interface.ModelTransientError` (timeout, no connection, 408/409/429/5xx; with the
``retry_after`` the endpoint sent) or :class:`~repair.interface.ModelPermanentError` (any other status, or an
answer that cannot be used), so the caller's retry policy is the one place that owns backoff. Every failure
carries the tokens counted in the conversation before it.

Idempotency: none at the endpoint. A request spends tokens each time it is sent; the caller's operation ID
travels in the ``X-Durafix-Op-Id`` header so the endpoint's logs can be matched to the run.
"""

from __future__ import annotations

import email.utils
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from opentelemetry import trace

if TYPE_CHECKING:
    # The SDK itself is imported where a request is made: a process that only reads runs' values (the CLI, the
    # receiver, a worker's supervisor) never loads it (about half a second of CPU at each start).
    import openai
    from openai.types.chat import (
        ChatCompletion,
        ChatCompletionMessage,
        ChatCompletionMessageFunctionToolCall,
        ChatCompletionMessageParam,
        ChatCompletionToolChoiceOptionParam,
        ChatCompletionToolUnionParam,
    )

from repair.interface import ModelPermanentError, ModelTransientError

OP_ID_HEADER = "X-Durafix-Op-Id"
TRANSIENT_STATUSES = frozenset({408, 409, 429})
# Spans through the plain OpenTelemetry API: a no-op unless the process installed an SDK.
_tracer = trace.get_tracer("durafix.repair")


class TokenUsage:
    """Tokens one conversation has spent so far, added up from every response's ``usage``."""

    def __init__(self) -> None:
        self.prompt = 0
        self.completion = 0

    @property
    def total(self) -> int:
        return self.prompt + self.completion

    def spent(self) -> dict[str, int]:
        """The counts as the ``prompt_tokens`` / ``completion_tokens`` keywords every repair error takes."""
        return {"prompt_tokens": self.prompt, "completion_tokens": self.completion}


class ChatEndpoint:
    """One model on one OpenAI-compatible endpoint; see the module docstring for retries and failures."""

    def __init__(self, base_url: str, api_key: str, model: str, timeout_s: float, max_retries: int = 0) -> None:
        self.model = model
        self.timeout_s = timeout_s
        import openai

        self._client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=max_retries)

    def complete(
        self,
        messages: Iterable[ChatCompletionMessageParam],
        *,
        tools: Iterable[ChatCompletionToolUnionParam],
        op_id: str,
        usage: TokenUsage,
        tool_choice: ChatCompletionToolChoiceOptionParam | None = None,
    ) -> ChatCompletion:
        """One request, its failure classified and its tokens added to ``usage``. ``tool_choice``: None leaves
        it to the endpoint (the field is not sent).

        An answer without ``usage`` is refused (ModelPermanentError): the tokens it spent could not be counted.
        """
        with _tracer.start_as_current_span("model call", attributes={"model": self.model}) as span:
            completion = self._create(messages, tools, op_id, usage, tool_choice)
            span.set_attribute("prompt_tokens", completion.usage.prompt_tokens if completion.usage else 0)
            span.set_attribute("completion_tokens", completion.usage.completion_tokens if completion.usage else 0)
        if completion.usage is None:
            raise ModelPermanentError(
                "the endpoint reports no token usage, so the tokens spent cannot be counted", **usage.spent()
            )
        usage.prompt += completion.usage.prompt_tokens
        usage.completion += completion.usage.completion_tokens
        return completion

    def _create(
        self,
        messages: Iterable[ChatCompletionMessageParam],
        tools: Iterable[ChatCompletionToolUnionParam],
        op_id: str,
        usage: TokenUsage,
        tool_choice: ChatCompletionToolChoiceOptionParam | None,
    ) -> ChatCompletion:
        """The request itself, its failure classified."""
        import openai

        try:
            return self._client.chat.completions.create(
                model=self.model,
                messages=messages,
                tools=tools,
                tool_choice=openai.omit if tool_choice is None else tool_choice,
                extra_headers={OP_ID_HEADER: op_id},
            )
        except openai.APITimeoutError as e:
            raise ModelTransientError(f"model request timed out after {self.timeout_s:g}s", **usage.spent()) from e
        except openai.APIConnectionError as e:
            raise ModelTransientError(f"cannot reach the model endpoint: {e}", **usage.spent()) from e
        except openai.APIStatusError as e:
            raise _classify_status(e, usage) from e


def _classify_status(error: openai.APIStatusError, usage: TokenUsage) -> ModelTransientError | ModelPermanentError:
    """The repair error an HTTP error status means: 408/409/429/5xx are transient (with the endpoint's
    ``retry_after``), any other status is permanent."""
    status = error.status_code
    text = f"model endpoint answered {status}: {error.message}"
    if status in TRANSIENT_STATUSES or status >= 500:
        return ModelTransientError(
            text, retry_after=retry_after(error.response.headers), status=status, **usage.spent()
        )
    return ModelPermanentError(text, status=status, **usage.spent())


def first_message(completion: ChatCompletion, usage: TokenUsage) -> ChatCompletionMessage:
    """The answer's message; an answer without choices is refused (ModelPermanentError)."""
    if not completion.choices:
        raise ModelPermanentError("the endpoint answered without choices", **usage.spent())
    return completion.choices[0].message


def function_calls(message: ChatCompletionMessage, usage: TokenUsage) -> list[ChatCompletionMessageFunctionToolCall]:
    """The message's tool calls; any that is not a function call is refused (ModelPermanentError), since only
    function tools are ever offered."""
    from openai.types.chat import ChatCompletionMessageFunctionToolCall

    calls = message.tool_calls or []
    functions = [c for c in calls if isinstance(c, ChatCompletionMessageFunctionToolCall)]
    if len(functions) != len(calls):
        raise ModelPermanentError(
            "the endpoint answered with a non-function tool call; only function tools are offered", **usage.spent()
        )
    return functions


def assistant_param(
    message: ChatCompletionMessage, calls: list[ChatCompletionMessageFunctionToolCall]
) -> ChatCompletionMessageParam:
    """The model's answer as it goes back into the conversation, its function calls included."""
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


def retry_after(headers: Mapping[str, str]) -> float | None:
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
