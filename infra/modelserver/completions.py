"""Reading chat-completion requests and writing answers in OpenAI's exact response shape.

Token counts are deterministic so budgets can be tested: one token per whitespace-separated word. A prompt
counts the words of every message's text and of the arguments of every tool call it carries; a completion
counts its text plus each tool call's name and arguments.

A request's ``max_tokens`` / ``max_completion_tokens`` (the smaller, when both are set) is honoured as a real
endpoint honours it: an answer that would be longer is cut to that many tokens (the text to its first words;
a tool call that no longer fits whole is dropped) with ``finish_reason: "length"``, so its
``usage.completion_tokens`` never exceeds the limit.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any

from infra.modelserver.script import Turn


def count_tokens(text: str) -> int:
    return len(text.split())


def _text_of(content: object) -> str:
    """A message's text, whether ``content`` is a string or a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def first_text(messages: list[dict[str, Any]], role: str) -> str:
    """The text of the first message with ``role`` ("" when there is none)."""
    return next((_text_of(m.get("content")) for m in messages if m.get("role") == role), "")


# A compacted transcript (durafix's ``repair.compaction``) states on this line how many turns it dropped.
_COMPACTED = re.compile(r"^durafix-compacted-turns: (\d+)$", re.MULTILINE)


def assistant_turns(messages: list[dict[str, Any]]) -> int:
    """The assistant messages a request holds, plus those a compaction of its transcript dropped."""
    dropped = 0
    for m in messages:
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            found = _COMPACTED.search(m["content"])
            dropped += int(found.group(1)) if found else 0
    return dropped + sum(1 for m in messages if m.get("role") == "assistant")


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    total = 0
    for m in messages:
        total += count_tokens(_text_of(m.get("content")))
        for call in m.get("tool_calls") or []:
            total += count_tokens(str(call.get("function", {}).get("arguments", "")))
    return total


def answer_limit(request: dict[str, Any]) -> int | None:
    """The completion-token limit a request sets (``max_tokens`` / ``max_completion_tokens``), if any."""
    limits = [
        v
        for v in (request.get("max_tokens"), request.get("max_completion_tokens"))
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0
    ]
    return min(limits) if limits else None


def completion_body(
    model: str, turn: Turn, turn_index: int, request_digest: str, prompt: int, limit: int | None = None
) -> dict[str, Any]:
    """The ``chat.completion`` object answering with ``turn``, cut to ``limit`` completion tokens if given.

    IDs derive from the request body's digest, so the same request always gets the same answer.
    """
    left = limit
    content = turn.content
    truncated = False
    if content is not None and left is not None:
        words = content.split()
        if len(words) > left:
            content, truncated = " ".join(words[:left]), True
        left -= min(len(words), left)
    completion = count_tokens(content or "")
    tool_calls: list[dict[str, Any]] = []
    for i, call in enumerate(turn.tool_calls):
        args = json.dumps(call.arguments, ensure_ascii=False)
        cost = count_tokens(call.name) + count_tokens(args)
        if left is not None:
            if cost > left:
                truncated = True
                break
            left -= cost
        completion += cost
        tool_calls.append(
            {
                "id": f"call_{turn_index}_{i}_{request_digest[:12]}",
                "type": "function",
                "function": {"name": call.name, "arguments": args},
            }
        )
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": f"chatcmpl-{request_digest[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "length" if truncated else "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error envelope, which the openai SDK turns into the exception's ``message`` and ``code``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
