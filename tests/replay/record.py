"""Recording workflow histories for the replay test.

End-to-end tests call :func:`record_history` at the end of each run. With ``DURAFIX_RECORD_HISTORIES=1``
the history is written to ``tests/replay/histories/<name>.json`` (commit it); otherwise nothing is written,
so ordinary test runs never change the tree.
"""

from __future__ import annotations

import os
from pathlib import Path

from temporalio.client import WorkflowHistory

HISTORIES = Path(__file__).parent / "histories"


def record_history(history: WorkflowHistory, name: str) -> Path | None:
    if os.environ.get("DURAFIX_RECORD_HISTORIES", "") not in ("1", "true", "yes"):
        return None
    HISTORIES.mkdir(parents=True, exist_ok=True)
    path = HISTORIES / f"{name}.json"
    path.write_text(history.to_json())
    return path
