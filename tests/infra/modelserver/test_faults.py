"""Fault injection: the next N chat requests fail or stall, then the script answers again."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.modelserver import Serve, inject_fault

SCRIPT: dict[str, Any] = {"conversations": [{"name": "any", "turns": [{"content": "fine"}]}]}
AUTH = {"Authorization": "Bearer k"}
BODY = {"model": "durafix-scripted", "messages": [{"role": "user", "content": "hello"}]}


def post(base_url: str, timeout: float = 10) -> httpx.Response:
    return httpx.post(f"{base_url}/chat/completions", json=BODY, headers=AUTH, timeout=timeout)


def test_rate_limit_fault_answers_429_with_retry_after_for_count_requests(serve: Serve) -> None:
    server = serve(SCRIPT)
    inject_fault(server, status=429, count=2, retry_after=3)
    answers = [post(server.base_url) for _ in range(3)]
    assert [a.status_code for a in answers] == [429, 429, 200]
    assert answers[0].headers["Retry-After"] == "3"
    assert answers[0].json()["error"]["code"] == "rate_limit_exceeded"
    assert answers[2].json()["choices"][0]["message"]["content"] == "fine"


def test_server_error_fault_answers_500_once(serve: Serve) -> None:
    server = serve(SCRIPT)
    inject_fault(server, status=500)
    assert [post(server.base_url).status_code for _ in range(2)] == [500, 200]


def test_fault_after_n_lets_that_many_requests_through_first(serve: Serve) -> None:
    server = serve(SCRIPT)
    inject_fault(server, status=500, count=2, after=2)
    inject_fault(server, status=429, after=1)
    assert [post(server.base_url).status_code for _ in range(7)] == [200, 200, 500, 500, 200, 429, 200]


def test_delay_fault_holds_the_request_past_a_client_timeout(serve: Serve) -> None:
    server = serve(SCRIPT)
    inject_fault(server, delay_s=3)
    with pytest.raises(httpx.ReadTimeout):
        post(server.base_url, timeout=0.5)
    assert post(server.base_url).status_code == 200


def test_faults_queue_in_order_and_are_listed(serve: Serve) -> None:
    server = serve(SCRIPT)
    inject_fault(server, status=500)
    inject_fault(server, status=429, count=2)
    pending = httpx.get(f"{server.root_url}/_admin/faults", timeout=10).json()
    assert pending == [{"status": 500, "count": 1}, {"status": 429, "count": 2}]
    assert [post(server.base_url).status_code for _ in range(4)] == [500, 429, 429, 200]


def test_malformed_fault_is_refused(serve: Serve) -> None:
    server = serve(SCRIPT)
    both = httpx.post(f"{server.root_url}/_admin/faults", json={"status": 500, "delay_s": 1}, timeout=10)
    assert both.status_code == 400
    assert post(server.base_url).status_code == 200


def test_stop_releases_a_request_held_by_a_delay_fault(serve: Serve) -> None:
    server = serve(SCRIPT)
    inject_fault(server, delay_s=600)
    with pytest.raises(httpx.ReadTimeout):
        post(server.base_url, timeout=0.3)
    server.stop()
    # stop() joins handler threads, so the held request has been answered and recorded by now.
    (held,) = [json.loads(line) for line in (server.data_dir / "requests.jsonl").read_text().splitlines()]
    assert (held["status"], held["fault"]) == (200, {"delay_s": 600.0, "count": 1})
