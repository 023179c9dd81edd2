"""Every API request is recorded (JSONL in the data dir, readable over HTTP), without the API key."""

from __future__ import annotations

import json
from typing import Any

import httpx

from infra.modelserver.server import ScriptedModelServer
from tests.support.modelserver import Serve, inject_fault, recorded

SCRIPT: dict[str, Any] = {"conversations": [{"name": "greeting", "turns": [{"content": "hi"}]}]}
BODY = {"model": "durafix-scripted", "messages": [{"role": "user", "content": "hello"}]}


def test_requests_are_recorded_with_outcome_and_without_the_key(serve: Serve) -> None:
    server = serve(SCRIPT)
    headers = {"Authorization": "Bearer secret-key", "X-Durafix-Op-Id": "repair:o/r#1:repair:1"}
    httpx.post(f"{server.base_url}/chat/completions", json=BODY, headers=headers, timeout=10)
    inject_fault(server, status=500)
    httpx.post(f"{server.base_url}/chat/completions", json=BODY, headers=headers, timeout=10)
    httpx.get(f"{server.base_url}/models", timeout=10)

    records = recorded(server)
    assert [(r["seq"], r["method"], r["path"], r["status"]) for r in records] == [
        (1, "POST", "/v1/chat/completions", 200),
        (2, "POST", "/v1/chat/completions", 500),
        (3, "GET", "/v1/models", 401),
    ]
    assert records[0]["body"] == BODY
    assert (records[0]["conversation"], records[0]["turn"]) == ("greeting", 0)
    assert records[0]["headers"]["x-durafix-op-id"] == "repair:o/r#1:repair:1"
    assert records[1]["fault"] == {"status": 500, "count": 1}
    on_disk = (server.data_dir / "requests.jsonl").read_text()
    assert "secret-key" not in on_disk
    assert [json.loads(line) for line in on_disk.splitlines()] == records


def test_restarted_server_keeps_appending_to_the_same_log(serve: Serve) -> None:
    first = serve(SCRIPT)
    httpx.post(f"{first.base_url}/chat/completions", json=BODY, headers={"Authorization": "Bearer k"}, timeout=10)
    first.stop()
    second = ScriptedModelServer(first.script_path, first.data_dir)
    second.start()
    try:
        httpx.post(f"{second.base_url}/chat/completions", json=BODY, headers={"Authorization": "Bearer k"}, timeout=10)
        assert [r["seq"] for r in recorded(second)] == [1, 2]
    finally:
        second.stop()
