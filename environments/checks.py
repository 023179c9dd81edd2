"""Targeted checks: run a recipe's test command in a workspace and keep what it printed.

The test command runs like any recipe command (built environment, own session, see
:mod:`environments.commands`); on timeout its whole process group is stopped and the run counts as failed.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

from pydantic import BaseModel

from environments.commands import command_env, run_to_completion, tail
from environments.interface import AppRecipe


class TestRunResult(BaseModel):
    """Outcome of one test run. ``exit_code`` is ``None`` when the run timed out and was killed."""

    __test__ = False  # a result model, not a pytest test class

    passed: bool
    exit_code: int | None
    timed_out: bool
    duration_s: float
    output_tail: str
    log_path: Path


def run_tests(ws_path: Path, recipe: AppRecipe, timeout_s: float, *, log_path: Path | None = None) -> TestRunResult:
    """Run ``recipe.test`` in ``ws_path``; passed means exit code 0 within ``timeout_s``.

    The full output goes to ``log_path`` (default: a new temporary file, which the caller owns); the
    result carries its last 4 KB.
    """
    if log_path is None:
        with tempfile.NamedTemporaryFile(prefix="durafix-tests-", suffix=".log", delete=False) as fh:
            log_path = Path(fh.name)
    code, duration = run_to_completion(
        recipe.test,
        cwd=ws_path,
        env=command_env(recipe, marker=f"tests/{uuid.uuid4().hex}"),
        log_path=log_path,
        timeout_s=timeout_s,
    )
    return TestRunResult(
        passed=code == 0,
        exit_code=code,
        timed_out=code is None,
        duration_s=duration,
        output_tail=tail(log_path),
        log_path=log_path,
    )
