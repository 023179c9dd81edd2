"""The model proxy reserves an attempt's budget: a hostile agent CLI cannot spend past it or flood it.

Everything runs over real sockets: the proxy (:mod:`repair.model_proxy`) in front of the scripted
OpenAI-compatible server (:mod:`infra.modelserver`), which honours ``max_tokens`` (its answers are cut to
it, ``usage.completion_tokens`` never above it) and records every request it served with the usage it
charged. The attacks: 20 concurrent requests against a 1,000-token budget, a ``max_tokens`` far past the
budget, a prompt denser than the proxy's estimate, an endpoint that answers without ``usage`` or not at
all, a request that waits behind one in flight, a flood of connections, and bodies that are too big,
unsized or chunked.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from infra.modelserver.server import ScriptedModelServer
from repair.model_proxy import ModelProxy
from tests.support.modelserver import Serve, inject_fault, recorded, serve
from tests.support.served import QuietHandler

__all__ = ["serve"]

MODEL = "budget-model"
# 400 words: far longer than any answer a 1,000-token budget leaves room for, so every answer is cut.
LONG_ANSWER = " ".join(f"word{i}" for i in range(400))
SCRIPT: dict[str, Any] = {
    "model": MODEL,
    "api_key": "real-upstream-key",
    "conversations": [{"name": "long", "turns": [{"content": LONG_ANSWER}]}],
}
PROMPT = "Please describe the cart module and what its total function computes for an empty cart."


def messages(text: str = PROMPT) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are a helpful agent."}, {"role": "user", "content": text}]


def post(proxy: ModelProxy, body: dict[str, Any], timeout: float = 60) -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{proxy.port}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {proxy.key}"},
        timeout=timeout,
    )


def served(server: ScriptedModelServer) -> list[dict[str, Any]]:
    """The chat requests the upstream recorded (its own log, read over its admin endpoint)."""
    return [r for r in recorded(server) if r["path"] == "/v1/chat/completions"]


def charged(records: list[dict[str, Any]]) -> int:
    """What the upstream's log says it charged: prompt + completion of every answer with a usage."""
    return sum(r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] for r in records if "usage" in r)


@pytest.fixture
def upstream(serve: Serve) -> ScriptedModelServer:
    return serve(SCRIPT)


@pytest.fixture
def proxy(upstream: ScriptedModelServer) -> Iterator[ModelProxy]:
    with ModelProxy(upstream.base_url, "real-upstream-key", MODEL, token_budget=1000, op_id="op-budget") as p:
        yield p


def raw_request(port: int, head: str, body: bytes = b"") -> tuple[int, dict[str, Any]]:
    """Send ``head`` (request line and headers, without the blank line) and ``body`` on a raw socket; the
    status and JSON body of the answer. The socket's write side stays open: the answer must come without
    the proxy waiting for more."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode() + b"\r\n\r\n" + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    header, _, payload = data.partition(b"\r\n\r\n")
    status = int(header.split(b" ", 2)[1])
    return status, json.loads(payload)


def test_twenty_concurrent_requests_spend_at_most_the_budget(upstream: ScriptedModelServer, proxy: ModelProxy) -> None:
    start = threading.Barrier(20)
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def fire(i: int) -> None:
        # Half ask for far more than the budget, half set no limit at all.
        body: dict[str, Any] = {"model": "whatever", "messages": messages()}
        if i % 2:
            body["max_tokens"] = 100_000
        start.wait()
        answer = post(proxy, body)
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=fire, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    records = served(upstream)
    ok = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code != 200]
    assert len(answers) == 20 and ok and refused
    # The upstream's own log: at most the budget spent, and exactly what the proxy counted.
    assert charged(records) <= 1000
    assert charged(records) == proxy.spent == proxy.prompt_tokens + proxy.completion_tokens
    assert len(records) == len(ok) == proxy.requests
    assert all(r["status"] == 200 for r in records)
    assert proxy.overrun == 0 and proxy.reserved == 0
    # Every answer was cut to the clamped limit the upstream was sent, and none asked for 100,000.
    for r in records:
        assert r["usage"]["completion_tokens"] <= r["body"]["max_tokens"] < 1000
        assert r["body"]["model"] == MODEL
    # Every refusal is the budget's, OpenAI-shaped, and says how many tokens were left.
    left = 1000 - proxy.spent
    for a in refused:
        assert a.status_code == 429
        error = a.json()["error"]
        assert error["type"] == "budget_exhausted"
        assert f"{left} of 1000 tokens left" in error["message"]
    assert proxy.exhausted.is_set()


def test_max_tokens_is_clamped_to_what_is_left_and_n_divides_it(
    upstream: ScriptedModelServer, proxy: ModelProxy
) -> None:
    first = post(proxy, {"model": MODEL, "messages": messages(), "max_tokens": 50_000, "n": 2})
    assert first.status_code == 200
    second = post(proxy, {"model": MODEL, "messages": messages(), "max_completion_tokens": 50_000})
    assert second.status_code == 200
    third = post(proxy, {"model": MODEL, "messages": messages(), "max_tokens": 5, "n": None})
    assert third.status_code == 200
    fourth = post(proxy, {"model": MODEL, "messages": messages(), "max_tokens": None})
    assert fourth.status_code == 200

    one, two, three, four = served(upstream)
    # n=2 choices share what is left: each may have at most half of it after the prompt.
    assert 0 < one["body"]["max_tokens"] * 2 <= 1000 - one["usage"]["prompt_tokens"]
    spent_before_two = charged([one])
    assert "max_tokens" not in two["body"]  # a request that sets max_completion_tokens keeps its own field
    assert 0 < two["body"]["max_completion_tokens"] <= 1000 - spent_before_two - two["usage"]["prompt_tokens"]
    assert three["body"]["max_tokens"] == 5 and three["usage"]["completion_tokens"] == 5  # a smaller limit stays
    assert 0 < four["body"]["max_tokens"] <= 1000 - charged([one, two, three]) - four["usage"]["prompt_tokens"]
    assert charged([one, two, three, four]) == proxy.spent <= 1000
    assert proxy.overrun == 0


def test_invalid_limits_are_refused_and_never_reach_the_upstream(
    upstream: ScriptedModelServer, proxy: ModelProxy
) -> None:
    for bad in ({"max_tokens": -5}, {"max_tokens": "900"}, {"n": 0}, {"max_completion_tokens": True}):
        answer = post(proxy, {"model": MODEL, "messages": messages(), **bad})
        assert answer.status_code == 400
        assert answer.json()["error"]["type"] == "invalid_request_error"
    # A lone surrogate escape is valid JSON but no Unicode: refused, answered, not a dropped connection.
    lone = b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}'
    answer = httpx.post(
        f"http://127.0.0.1:{proxy.port}/v1/chat/completions",
        content=lone,
        headers={"Authorization": f"Bearer {proxy.key}", "Content-Type": "application/json"},
        timeout=60,
    )
    assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_request_error"
    assert served(upstream) == []
    assert proxy.spent == 0


def test_a_prompt_denser_than_the_estimate_is_charged_and_raises_later_estimates(
    upstream: ScriptedModelServer,
) -> None:
    # The scripted server counts a token per word: "a a a ..." is a token per 2 bytes, denser than 3.
    dense = {"model": MODEL, "messages": messages(" ".join(["a"] * 600))}
    with ModelProxy(upstream.base_url, "real-upstream-key", MODEL, token_budget=3000, op_id="op-dense") as proxy:
        assert post(proxy, {**dense, "max_tokens": 10}).status_code == 200
        first_overrun = proxy.overrun
        assert first_overrun > 0  # the estimate (bytes / 3) was below the real prompt: the excess is counted
        assert post(proxy, {**dense, "max_tokens": 10}).status_code == 200
        assert proxy.overrun == first_overrun  # the second estimate used the first answer's density
        answers = [post(proxy, dense) for _ in range(4)]
        records = served(upstream)
        assert [a.status_code for a in answers][-1] == 429
        assert answers[-1].json()["error"]["type"] == "budget_exhausted"
        assert charged(records) == proxy.spent <= 3000
        assert proxy.overrun == first_overrun
        assert len(records) == proxy.requests == 2 + sum(a.status_code == 200 for a in answers)


def test_an_error_answer_without_usage_is_not_charged(upstream: ScriptedModelServer, proxy: ModelProxy) -> None:
    inject_fault(upstream, status=500)
    failed = post(proxy, {"model": MODEL, "messages": messages()})
    assert failed.status_code == 500
    assert proxy.spent == 0 and proxy.reserved == 0
    assert post(proxy, {"model": MODEL, "messages": messages()}).status_code == 200
    assert proxy.spent == charged(served(upstream)) > 0


class _NoUsage(QuietHandler):
    """An upstream that answers every request 200 with a whole answer and no ``usage``."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        raw = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]}).encode()
        self.answer(200, raw, ("Content-Type", "application/json"))


def test_an_answer_without_usage_costs_its_whole_reservation() -> None:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _NoUsage)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{upstream.server_address[1]}/v1"
        with ModelProxy(base, "real-upstream-key", MODEL, token_budget=1000, op_id="op-nousage") as proxy:
            assert post(proxy, {"model": MODEL, "messages": messages(), "max_tokens": 100}).status_code == 200
            first = proxy.spent
            assert first > 100 and proxy.completion_tokens == 100  # the prompt's estimate + the whole limit
            # Uncounted answers cannot go on for ever: the budget runs out after a few.
            statuses = [post(proxy, {"model": MODEL, "messages": messages()}).status_code for _ in range(3)]
            assert statuses[-1] == 429 and proxy.spent <= 1000 and proxy.exhausted.is_set()
    finally:
        upstream.shutdown()
        upstream.server_close()


def test_a_request_sent_but_never_answered_costs_its_reservation(serve: Serve) -> None:
    upstream = serve(SCRIPT)
    with ModelProxy(
        upstream.base_url, "real-upstream-key", MODEL, token_budget=1000, op_id="op-timeout", timeout_s=0.5
    ) as proxy:
        inject_fault(upstream, delay_s=120)
        answer = post(proxy, {"model": MODEL, "messages": messages(), "max_tokens": 200})
        assert answer.status_code == 502 and answer.json()["error"]["type"] == "upstream_error"
        assert proxy.completion_tokens == 200 and proxy.prompt_tokens > 0 and proxy.reserved == 0


def hold_one_request(upstream: ScriptedModelServer, proxy: ModelProxy) -> threading.Thread:
    """Start a request the upstream holds (a long delay fault); return once the proxy has it in flight."""
    inject_fault(upstream, delay_s=120)
    held = threading.Thread(target=lambda: post(proxy, {"model": MODEL, "messages": messages()}, timeout=180))
    held.start()
    in_flight = threading.Event()
    while not in_flight.wait(0.02):
        if proxy.reserved > 0:
            in_flight.set()
        assert held.is_alive()
    return held


def assert_refused_behind_the_one_in_flight(serve: Serve, refusal: str, **limits: Any) -> None:
    """With one request held in flight by the upstream, the next gets 429 ``refusal`` and never reaches it."""
    upstream = serve(SCRIPT)
    with ModelProxy(upstream.base_url, "real-upstream-key", MODEL, token_budget=1000, **limits) as proxy:
        held = hold_one_request(upstream, proxy)
        second = post(proxy, {"model": MODEL, "messages": messages()})
        assert second.status_code == 429
        assert second.json()["error"]["type"] == refusal
        log = upstream.data_dir / "requests.jsonl"
        upstream.stop()  # releases the held request
        held.join()
        assert len(log.read_text().splitlines()) == 1  # the refused request never reached the upstream


def test_a_second_request_waits_a_bounded_time_behind_the_one_in_flight(serve: Serve) -> None:
    assert_refused_behind_the_one_in_flight(serve, "request_in_flight", op_id="op-wait", wait_s=0.5)


def test_a_flood_of_connections_is_refused_beyond_the_pending_limit(serve: Serve) -> None:
    assert_refused_behind_the_one_in_flight(serve, "too_many_requests", op_id="op-flood", max_pending=1)


def test_an_oversized_body_gets_413_before_it_is_read_and_never_reaches_the_upstream(
    upstream: ScriptedModelServer,
) -> None:
    with ModelProxy(
        upstream.base_url, "real-upstream-key", MODEL, token_budget=1000, op_id="op-body", max_body_bytes=4096
    ) as proxy:
        auth = f"Authorization: Bearer {proxy.key}"
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{auth}\r\nContent-Type: application/json"
        # Only the headers are sent: the refusal comes without the proxy waiting for a byte of the body.
        status, body = raw_request(proxy.port, f"{head}\r\nContent-Length: {2 * 1024 * 1024}")
        assert status == 413 and body["error"]["type"] == "request_too_large"
        # A client that sends the whole oversized body still reads the refusal.
        big = post(proxy, {"model": MODEL, "messages": messages("x" * 2 * 1024 * 1024)})
        assert big.status_code == 413
        just_over = post(proxy, {"model": MODEL, "messages": messages("y" * 4096)})
        assert just_over.status_code == 413
        # No Content-Length, a chunked body, a forged or doubled Content-Length: refused, unread.
        assert raw_request(proxy.port, head)[0] == 411
        chunked = f"{head}\r\nTransfer-Encoding: chunked"
        assert raw_request(proxy.port, chunked, b"5\r\nhello\r\n0\r\n\r\n")[0] == 411
        assert raw_request(proxy.port, f"{head}\r\nContent-Length: 12abc")[0] == 400
        assert raw_request(proxy.port, f"{head}\r\nContent-Length: -1")[0] == 400
        assert raw_request(proxy.port, f"{head}\r\nContent-Length: 10\r\nContent-Length: 10")[0] == 400
        # A body shorter than its Content-Length is refused once the client ends it.
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock:
            sock.sendall(f"{head}\r\nContent-Length: 1000\r\n\r\n{{}}".encode())
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(65536).startswith(b"HTTP/1.0 400")
        assert served(upstream) == []
        assert proxy.requests == 0
        # A body under the cap goes through.
        assert post(proxy, {"model": MODEL, "messages": messages()}).status_code == 200
        assert len(served(upstream)) == 1


def test_a_wrong_key_is_refused_before_the_body_is_read(upstream: ScriptedModelServer, proxy: ModelProxy) -> None:
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer guessed\r\nContent-Length: 1000"
    status, body = raw_request(proxy.port, head)
    assert status == 401 and body["error"]["type"] == "invalid_api_key"
    assert served(upstream) == []
