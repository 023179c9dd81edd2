"""Recorded histories replay on a compatible change of the workflow (:mod:`tests.replay.changed_workflow`): a
release adding a step behind a new ``workflow.patched`` ID takes over every run the current code recorded.

``histories/`` (runs of the current code, ``awaiting-review-before-change`` among them: a run recorded while it
waited for its review, as a deployment finds it) must replay on the changed code, and so must
``changed-code/``, the runs the changed code recorded (which the current code does not know, so
``test_replay.py`` never reads them). ``tests/recovery/test_engine_restarts.py`` records both.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.replay.changed_workflow import ChangedRepairBug
from tests.replay.record import HISTORIES, recorded_history

CHANGED_CODE = Path(__file__).parent / "changed-code"
CURRENT = sorted(HISTORIES.glob("*.json"))
CHANGED = sorted(CHANGED_CODE.glob("*.json"))


def test_the_waiting_run_and_the_changed_codes_runs_are_recorded() -> None:
    assert (HISTORIES / "awaiting-review-before-change.json") in CURRENT
    assert (HISTORIES / "finished-on-changed-code.json") in CURRENT
    assert CHANGED, f"no histories recorded by the changed code in {CHANGED_CODE}"


async def replay(path: Path, workflow: type) -> None:
    history = recorded_history(path)
    replayer = Replayer(workflows=[workflow], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None


@pytest.mark.parametrize("path", CURRENT, ids=[p.stem for p in CURRENT])
async def test_current_codes_history_replays_on_the_changed_code(path: Path) -> None:
    await replay(path, ChangedRepairBug)


@pytest.mark.parametrize("path", CHANGED, ids=[p.stem for p in CHANGED])
async def test_changed_codes_history_replays_on_the_changed_code(path: Path) -> None:
    await replay(path, ChangedRepairBug)
