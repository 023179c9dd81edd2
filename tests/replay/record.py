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
    return record_history_to(history, HISTORIES, name)


def record_history_to(history: WorkflowHistory, directory: Path, name: str) -> Path | None:
    """:func:`record_history` into ``directory``: for histories that replay on another release of the workflow
    than the current one (``tests/replay/changed-code``), which ``test_replay.py`` must not pick up."""
    if os.environ.get("DURAFIX_RECORD_HISTORIES", "") not in ("1", "true", "yes"):
        return None
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(history.to_json())
    return path
