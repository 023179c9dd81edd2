"""``durafix demo`` on a fresh state directory: the newcomer's first command, as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def demo(state: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "--state-dir", str(state), "demo", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_demo_merges_with_one_of_each_on_the_forge_and_again_when_run_twice(tmp_path: Path) -> None:
    result = demo(tmp_path / "state")
    assert result["outcome"] == "merged", result["detail"]
    assert (result["tickets"], result["prs"], result["evidence_comments"], result["branches"]) == (1, 1, 1, 1)
    assert result["fix_in_merged_commit"] is True
    assert result["approved_sha"] and result["merged_sha"] and result["merged_sha"] != result["approved_sha"]
    kinds = {e["kind"] for e in result["evidence"]}
    assert {"procedure", "trace", "screenshot", "patch", "manifest", "report"} <= kinds
    assert all(len(e["sha256"]) == 64 for e in result["evidence"])
    # The stack was stopped: nothing of the demo keeps running.
    stack = json.loads((tmp_path / "state" / "stack.json").read_text())
    assert stack["services"] == {}

    # The same checkout again: a fresh copy of the sample, so the bug is there to fix once more.
    again = demo(tmp_path / "state")
    assert again["outcome"] == "merged", again["detail"]
    assert again["workflow_id"] != result["workflow_id"]
    assert (again["tickets"], again["prs"], again["evidence_comments"], again["branches"]) == (1, 1, 1, 1)
