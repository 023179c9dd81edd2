"""Starting scripted model servers in tests: a fixture that serves a script (a dict or a file) on a free port."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infra.modelserver.server import ScriptedModelServer

Serve = Callable[[dict[str, Any] | Path], ScriptedModelServer]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """``serve(script)`` starts a server on port 0 for a script dict or file; all are stopped at teardown."""
    started: list[ScriptedModelServer] = []

    def start(script: dict[str, Any] | Path) -> ScriptedModelServer:
        n = len(started)
        if isinstance(script, dict):
            path = tmp_path / f"script-{n}.json"
            path.write_text(json.dumps(script))
        else:
            path = script
        server = ScriptedModelServer(path, tmp_path / f"model-data-{n}")
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def recorded(server: ScriptedModelServer) -> list[dict[str, Any]]:
    """What the server recorded, read over HTTP from its admin endpoint."""
    answer = httpx.get(f"{server.root_url}/_admin/requests", timeout=10)
    answer.raise_for_status()
    records: list[dict[str, Any]] = answer.json()
    return records


def inject_fault(server: ScriptedModelServer, **fault: Any) -> None:
    httpx.post(f"{server.root_url}/_admin/faults", json=fault, timeout=10).raise_for_status()


def tool_turn(name: str, **arguments: Any) -> dict[str, Any]:
    """A script turn making one tool call."""
    return {"tool_calls": [{"name": name, "arguments": arguments}]}
