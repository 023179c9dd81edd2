"""Recording workflow histories for the replay test.

End-to-end tests call :func:`record_history` at the end of each run. With ``DURAFIX_RECORD_HISTORIES=1``
the history is written to ``tests/replay/histories/<name>.json`` (commit it); otherwise nothing is written,
so ordinary test runs never change the tree.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from temporalio.client import WorkflowHistory

from pipeline.ids import attempt_workflow_id

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


def recorded_history(path: Path) -> WorkflowHistory:
    """The history recorded at ``path``, under the workflow ID it ran with where the run's commands name it (a
    child workflow's ID is made from it, and replay compares that ID); under the file's name otherwise."""
    text = path.read_text()
    return WorkflowHistory.from_json(_run_workflow_id(json.loads(text)) or path.stem, text)


def _run_workflow_id(history: dict[str, object]) -> str | None:
    events = history.get("events")
    for event in events if isinstance(events, list) else []:
        started = event.get("startChildWorkflowExecutionInitiatedEventAttributes") if isinstance(event, dict) else None
        if isinstance(started, dict) and isinstance(child := started.get("workflowId"), str):
            run_id, _, attempt = child.rpartition(":attempt-")
            if attempt.isdigit() and attempt_workflow_id(run_id, int(attempt)) == child:
                return run_id
    return None
