"""The scripted server answers chat completions in OpenAI's shape, turn by turn, over real HTTP."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.support.modelserver import Serve, tool_turn

AUTH = {"Authorization": "Bearer test-key"}

SCRIPT: dict[str, Any] = {
    "model": "scripted-test",
    "conversations": [
        {
            "name": "second-attempt",
            "match": {"system": r"attempt: 2\b"},
            "turns": [{"content": "second attempt answer"}],
        },
        {
            "name": "cart",
            "match": {"user": "(?i)cart total"},
            "turns": [
                {"content": "Looking first.", **tool_turn("read_file", path="cart.py")},
                {"content": "All done here."},
            ],
        },
    ],
}


def chat(base_url: str, messages: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    body = {"model": "scripted-test", "messages": messages, **extra}
    return httpx.post(f"{base_url}/chat/completions", json=body, headers=AUTH, timeout=10)


def opening(system: str = "attempt: 1", user: str = "The cart total is wrong") -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def test_answer_has_openai_shape_with_tool_calls_and_word_counted_usage(serve: Serve) -> None:
    server = serve(SCRIPT)
    answer = chat(server.base_url, opening())
    assert answer.status_code == 200
    body = answer.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert isinstance(body["created"], int)
    assert body["model"] == "scripted-test"
    (choice,) = body["choices"]
    assert choice["index"] == 0
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["role"] == "assistant"
    assert message["content"] == "Looking first."
    (call,) = message["tool_calls"]
    assert call["type"] == "function"
    assert call["id"].startswith("call_")
    assert call["function"]["name"] == "read_file"
    assert json.loads(call["function"]["arguments"]) == {"path": "cart.py"}
    # prompt: "attempt: 1" (2 words) + "The cart total is wrong" (5); completion: 2 + "read_file" + 2 argument words
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}


def test_same_request_gets_the_same_answer(serve: Serve) -> None:
    server = serve(SCRIPT)
    first, second = chat(server.base_url, opening()).json(), chat(server.base_url, opening()).json()
    assert first["id"] == second["id"]
    assert first["choices"] == second["choices"]


def test_max_tokens_cuts_the_answer_and_its_usage(serve: Serve) -> None:
    server = serve(SCRIPT)
    whole = chat(server.base_url, opening()).json()
    assert whole["usage"]["completion_tokens"] > 2

    cut = chat(server.base_url, opening(), max_tokens=1).json()
    assert cut["choices"][0]["message"]["content"] == "Looking"
    assert "tool_calls" not in cut["choices"][0]["message"]  # the call no longer fits whole: dropped
    assert cut["choices"][0]["finish_reason"] == "length"
    assert cut["usage"]["completion_tokens"] == 1

    # The smaller of max_tokens and max_completion_tokens holds; a limit the answer fits in changes nothing.
    assert (
        chat(server.base_url, opening(), max_tokens=50, max_completion_tokens=2).json()["usage"]["completion_tokens"]
        == 2
    )
    fits = chat(server.base_url, opening(), max_tokens=whole["usage"]["completion_tokens"]).json()
    kept, full = fits["choices"][0], whole["choices"][0]
    assert kept["message"]["content"] == full["message"]["content"] and kept["finish_reason"] == "tool_calls"
    assert [c["function"] for c in kept["message"]["tool_calls"]] == [
        c["function"] for c in full["message"]["tool_calls"]
    ]
    assert fits["usage"] == whole["usage"]


def test_turn_is_chosen_by_the_number_of_assistant_messages(serve: Serve) -> None:
    server = serve(SCRIPT)
    first = chat(server.base_url, opening()).json()["choices"][0]["message"]
    followup = [
        *opening(),
        {"role": "assistant", "content": first["content"], "tool_calls": first["tool_calls"]},
        {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "def compute_total(): ..."},
    ]
    body = chat(server.base_url, followup).json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "All done here.", "refusal": None}
    assert body["choices"][0]["finish_reason"] == "stop"


def test_system_prompt_marker_selects_the_conversation(serve: Serve) -> None:
    server = serve(SCRIPT)
    body = chat(server.base_url, opening(system="attempt: 2")).json()
    assert body["choices"][0]["message"]["content"] == "second attempt answer"


def test_unmatched_request_is_a_400_that_says_why(serve: Serve) -> None:
    server = serve(SCRIPT)
    answer = chat(server.base_url, opening(user="Checkout button does nothing"))
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "script_unmatched"
    assert "no conversation in the script matches" in error["message"]
    assert "Checkout button does nothing" in error["message"]


def test_request_beyond_the_last_turn_is_a_400(serve: Serve) -> None:
    server = serve(SCRIPT)
    messages = [*opening(), {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]
    answer = chat(server.base_url, messages)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "script_exhausted"


def test_missing_bearer_token_is_a_401(serve: Serve) -> None:
    server = serve(SCRIPT)
    answer = httpx.post(
        f"{server.base_url}/chat/completions", json={"model": "scripted-test", "messages": opening()}, timeout=10
    )
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "invalid_api_key"


def test_script_api_key_rejects_other_tokens(serve: Serve) -> None:
    server = serve({**SCRIPT, "api_key": "the-right-key"})
    assert chat(server.base_url, opening()).status_code == 401
    right = httpx.post(
        f"{server.base_url}/chat/completions",
        json={"model": "scripted-test", "messages": opening()},
        headers={"Authorization": "Bearer the-right-key"},
        timeout=10,
    )
    assert right.status_code == 200


def test_unknown_model_is_a_404(serve: Serve) -> None:
    server = serve(SCRIPT)
    answer = httpx.post(
        f"{server.base_url}/chat/completions", json={"model": "gpt-x", "messages": opening()}, headers=AUTH, timeout=10
    )
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "model_not_found"


def test_streaming_requests_are_refused(serve: Serve) -> None:
    server = serve(SCRIPT)
    assert chat(server.base_url, opening(), stream=True).status_code == 400


def test_openai_sdk_parses_the_answer_and_lists_the_model(serve: Serve) -> None:
    server = serve(SCRIPT)
    client = openai.OpenAI(base_url=server.base_url, api_key="test-key", max_retries=0)
    completion = client.chat.completions.create(
        model="scripted-test",
        messages=[{"role": "system", "content": "attempt: 1"}, {"role": "user", "content": "cart total"}],
    )
    calls = completion.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls if c.type == "function"] == ["read_file"]
    assert completion.usage is not None and completion.usage.total_tokens > 0
    assert [m.id for m in client.models.list()] == ["scripted-test"]


def test_invalid_script_is_refused_at_start(serve: Serve) -> None:
    with pytest.raises(ValueError, match="turns"):
        serve({"conversations": [{"name": "empty", "turns": []}]})
