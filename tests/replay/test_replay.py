"""Recorded histories of real runs replay against the current workflow code.

A change that breaks determinism (reordering activities, new commands without ``workflow.patched``) makes a
recorded history diverge, and this test fails. Histories are recorded by the end-to-end tests with
``DURAFIX_RECORD_HISTORIES=1`` (see ``tests/replay/record.py``) and committed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from pipeline import tracing
from pipeline.workflow import RepairBugWorkflow
from tests.replay.record import HISTORIES, recorded_history

RECORDED = sorted(HISTORIES.glob("*.json"))


def test_histories_are_recorded() -> None:
    assert RECORDED, f"no recorded histories in {HISTORIES}"


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
async def test_recorded_history_replays_on_current_code(path: Path) -> None:
    history = recorded_history(path)
    # With the interceptors every worker runs (pipeline/tracing.py): tracing must not change a command.
    replayer = Replayer(
        workflows=[RepairBugWorkflow], data_converter=pydantic_data_converter, interceptors=tracing.interceptors()
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
