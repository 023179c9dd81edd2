"""A recipe's commands in a workspace: its setup, and its test command as a targeted check.

Setup runs in every workspace whose app or tests are used (a provider's before it starts the app, a
verification's before the tests), so ``test`` never has to repeat it. Each command runs like any recipe
command (built environment, own session, see :mod:`environments.commands`); on timeout its whole process
group is stopped. A test command that could not run at all (the shell's 126/127: not executable, not found)
is told apart from one whose tests failed: :attr:`TestRunResult.runnable`.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

from pydantic import BaseModel

from environments.commands import command_env, run_to_completion, tail
from environments.interface import AppRecipe, EnvironmentError, Progress
from environments.processes import stop_owned
from environments.progress import command_text, ignore

# What /bin/sh answers for a command it found but could not execute, and for one it did not find.
NOT_RUNNABLE_EXIT_CODES = (126, 127)


class SetupError(EnvironmentError):
    """A setup command of the recipe failed or timed out; the message holds the log tail."""


def run_setup(
    ws_path: Path,
    recipe: AppRecipe,
    *,
    marker: str,
    log_path: Path,
    timeout_s: float,
    progress: Progress = ignore,
    stop_grace_s: float = 5.0,
) -> None:
    """Run ``recipe.setup`` in order in ``ws_path``, appending to ``log_path``; raise :class:`SetupError` on
    the first command that fails or times out (after stopping everything carrying ``marker``)."""
    for command in recipe.setup:
        progress(f"setup: {command_text(command)}")
        code, _ = run_to_completion(
            command, cwd=ws_path, env=command_env(recipe, marker=marker), log_path=log_path, timeout_s=timeout_s
        )
        if code != 0:
            stop_owned(marker, grace_s=stop_grace_s)
            outcome = "timed out" if code is None else f"exited {code}"
            raise SetupError(f"setup command {command!r} {outcome}:\n{tail(log_path)}")


class TestRunResult(BaseModel):
    """Outcome of one test run. ``exit_code`` is ``None`` when the run timed out and was killed."""

    __test__ = False  # a result model, not a pytest test class

    passed: bool
    exit_code: int | None
    timed_out: bool
    duration_s: float
    output_tail: str
    log_path: Path

    @property
    def runnable(self) -> bool:
        """The test command ran (passing or failing): it did not time out and the shell could execute it."""
        return not self.timed_out and self.exit_code not in NOT_RUNNABLE_EXIT_CODES


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
