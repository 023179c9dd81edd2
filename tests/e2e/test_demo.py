"""``durafix demo`` on a fresh state directory: the newcomer's first command, as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.browser]


def test_demo_merges_with_one_of_each_on_the_forge(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "--state-dir", str(tmp_path / "state"), "demo", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
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
