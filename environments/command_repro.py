"""Running a ``command`` or ``test`` reproduction (:mod:`environments.reproduction`) in a workspace's sandbox, and
judging it: the same verdict as a browser procedure's (:func:`browser.results.verdict`: reproduced only when
every run completed and showed the bug, not reproduced only when every run completed without it, anything else
inconclusive).

Each run is one script handed to the caller's :data:`SandboxRun` (a provider's ``run_checks``: the recipe's
setup first on the first run, then the script in the sandbox with no network and no secrets beyond the
operator's allowlist). The script writes the reproduction's ``files``, then runs each command under coreutils'
``timeout`` with stdin empty, its stdout, stderr and exit status going to ``.durafix-repro/run-<n>/`` in the
workspace; it stops at the first command before the last that does not exit 0. Nothing of the report reaches a
shell outside the sandbox: commands and file contents are quoted into the script, which only the sandbox runs.

What the script leaves is read back as untrusted bytes (:mod:`environments.untrusted_files`: no link followed,
regular files only, capped), and so is a file a ``file`` check reads. Exit status 124 is read as a command
killed at its timeout (coreutils' convention), so a command that exits 124 itself is taken as timed out too.

A ``test`` reproduction runs the recipe's ``test_subset`` with the tests in place of ``{ids}`` or ``{files}``;
with the recipe's ``test_report`` each run is judged per test case (the failing cases are named), else by the
exit status. The recipe's test report is removed before each run, so no earlier report is read as this run's.
"""

from __future__ import annotations

import base64
import shlex
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, Field

from browser.patterns import search
from browser.results import AssertionOutcome, ReproductionStatus, RunOutcome, verdict
from environments.interface import NOT_RUNNABLE_EXIT_CODES, AppRecipe, TestRunResult
from environments.progress import ignore
from environments.regression import forget_report
from environments.reproduction import (
    OUTPUT_DIR,
    CommandProcedure,
    OutputCheck,
    ReproductionKind,
    SandboxProcedure,
    TestProcedure,
)
from environments.test_results import CaseOutcome, ReportError, read_workspace_report
from environments.untrusted_files import UntrustedFileError, read_beneath_cut

SandboxRun = Callable[[str, Path, bool, float], TestRunResult]
"""Runs ``command`` (a script) in the workspace's sandbox, logging to the path, after the recipe's setup when the
flag says so, killed after the timeout in seconds; raises :class:`environments.checks.SetupError` when that
setup fails."""

# What is kept of each stream and read of a checked file: enough for any check, small enough for evidence.
MAX_OUTPUT_BYTES = 256_000
# coreutils' timeout: the exit status of a command it stopped, and how long it waits before killing it.
TIMEOUT_EXIT = 124
KILL_AFTER_S = 5
# The script's own exit statuses: its output directory, or a file, could not be written.
_NO_OUTPUT_DIR = 90
_FILE_NOT_WRITTEN = 91
# Beyond the commands' own timeouts: writing files, the shell, and the sandbox starting and ending.
_SCRIPT_SLACK_S = 30.0
MAX_NAMED_TESTS = 50

Progress = Callable[[str], None]


class StepRecord(BaseModel):
    """One command of one run: ``exit_code`` None when it was stopped at its timeout or never ran."""

    command: str
    exit_code: int | None = None
    timed_out: bool = False
    ran: bool = True
    stdout: str = ""
    stderr: str = ""
    stdout_cut: bool = False
    stderr_cut: bool = False


class CommandRunRecord(BaseModel):
    """One run of the reproduction: its commands (one for a test reproduction: the test command), the checks
    on the last one, and for a test reproduction with a report, the test cases by outcome."""

    run: int
    steps: list[StepRecord] = Field(default_factory=list)
    checks: list[AssertionOutcome] = Field(default_factory=list)
    bug_present: bool = False
    failed_step: int | None = None
    error: str | None = None
    failing_tests: list[str] = Field(default_factory=list)
    passing_tests: list[str] = Field(default_factory=list)
    test_counts: str = ""
    duration_s: float = 0.0

    def outcome(self) -> RunOutcome:
        return RunOutcome(
            run=self.run,
            bug_present=self.bug_present,
            failed_step=self.failed_step,
            error=self.error,
            assertions=self.checks,
            duration_s=self.duration_s,
        )


class SandboxReproduction(BaseModel):
    """What a command or test reproduction found: the verdict and every run's record (stored as evidence, read
    by the report to show base and candidate side by side)."""

    kind: ReproductionKind
    name: str
    status: ReproductionStatus
    detail: str
    runs: list[CommandRunRecord]
    # A test reproduction: the test command each run ran.
    command: str = ""
    duration_s: float = 0.0


def reproduce_in_sandbox(
    ws: Path,
    recipe: AppRecipe,
    procedure: SandboxProcedure,
    run: SandboxRun,
    log_dir: Path,
    *,
    setup: bool = True,
    progress: Progress = ignore,
) -> SandboxReproduction:
    """Run ``procedure`` ``procedure.runs`` times in ``ws`` (set up first when ``setup``) and judge it; each run's
    sandbox output is logged to ``log_dir/reproduction-run-<n>.log``. Raises SetupError when setup fails."""
    started = time.monotonic()
    kind = ReproductionKind(procedure.kind)
    command = ""
    if isinstance(procedure, TestProcedure):
        command = subset_command(recipe, procedure) or ""
        if not command:
            detail = (
                "a test reproduction runs the tests it names with the recipe's `test_subset`, and durafix.yaml "
                "declares none: add one, e.g. `test_subset: python -m pytest {ids}` or `npx jest {files}`"
            )
            return SandboxReproduction(
                kind=kind, name=procedure.name, status=ReproductionStatus.INCONCLUSIVE, detail=detail, runs=[]
            )
    log_dir.mkdir(parents=True, exist_ok=True)
    records: list[CommandRunRecord] = []
    for n in range(1, procedure.runs + 1):
        progress(f"reproduction run {n} of {procedure.runs}: {procedure.name}")
        if isinstance(procedure, TestProcedure):
            records.append(_test_run(ws, recipe, procedure, command, n, run, log_dir, setup and n == 1))
        else:
            records.append(_command_run(ws, procedure, n, run, log_dir, setup and n == 1))
    # What the commands printed stays in the stored record: the detail reaches tickets, history and prompts.
    status, detail = verdict([r.outcome() for r in records], quote_actual=False)
    return SandboxReproduction(
        kind=kind,
        name=procedure.name,
        status=status,
        detail=detail,
        runs=records,
        command=command,
        duration_s=time.monotonic() - started,
    )


def collected_paths(procedure: SandboxProcedure) -> tuple[str, ...]:
    """What a run of ``procedure`` writes that is read afterwards: its output directory and the files its checks
    read (a provider's ``run_checks(collect=...)``; the recipe's test report comes back on its own)."""
    files = [c.path for c in procedure.bug_present if c.path] if isinstance(procedure, CommandProcedure) else []
    return (OUTPUT_DIR, *files)


def subset_command(recipe: AppRecipe, procedure: TestProcedure) -> str | None:
    """The recipe's ``test_subset`` with the tests (shell-quoted) for ``{ids}`` or ``{files}``; None without one."""
    subset = recipe.test_subset
    if not subset:
        return None
    tests = " ".join(shlex.quote(t) for t in procedure.tests)
    return subset.replace("{ids}", tests) if "{ids}" in subset else subset.replace("{files}", tests)


def script(procedure: SandboxProcedure, run: int, commands: list[tuple[str, float]]) -> str:
    """The run's script: write the files, then each command with its timeout, outputs under the run's directory,
    stopping after the first command before the last that does not exit 0."""
    out = f"{OUTPUT_DIR}/run-{run}"
    lines = [
        "set -u",
        f"rm -rf {OUTPUT_DIR} && mkdir -p {out} || exit {_NO_OUTPUT_DIR}",
    ]
    for path, text in procedure.files.items():
        parent = str(PurePosixPath(path).parent)
        encoded = base64.b64encode(text.encode()).decode()
        make = f"mkdir -p {shlex.quote(parent)} && " if parent != "." else ""
        lines.append(
            f"{make}rm -f {shlex.quote(path)} && printf '%s' {encoded} | base64 -d > {shlex.quote(path)} "
            f"|| exit {_FILE_NOT_WRITTEN}"
        )
    for i, (command, timeout_s) in enumerate(commands, start=1):
        lines.append(
            f"timeout -k {KILL_AFTER_S} {int(timeout_s)} /bin/sh -c {shlex.quote(command)} "
            f"</dev/null >{out}/{i}.out 2>{out}/{i}.err; echo $? >{out}/{i}.exit"
        )
        if i < len(commands):
            lines.append(f'[ "$(cat {out}/{i}.exit)" = 0 ] || exit 0')
    lines.append("exit 0")
    return "\n".join(lines) + "\n"


def _sandboxed(
    ws: Path,
    procedure: SandboxProcedure,
    n: int,
    commands: list[tuple[str, float]],
    run: SandboxRun,
    log_dir: Path,
    setup: bool,
) -> tuple[CommandRunRecord, TestRunResult]:
    """Run the script of run ``n`` and read back what each command left."""
    record = CommandRunRecord(run=n)
    started = time.monotonic()
    budget = sum(t for _, t in commands) + KILL_AFTER_S * len(commands) + _SCRIPT_SLACK_S
    result = run(script(procedure, n, commands), log_dir / f"reproduction-run-{n}.log", setup, budget)
    record.duration_s = time.monotonic() - started
    out = f"{OUTPUT_DIR}/run-{n}"
    for i, (command, _) in enumerate(commands, start=1):
        step = StepRecord(command=command)
        exit_text, _ = _read(ws, f"{out}/{i}.exit", 32)
        if exit_text is None:
            step.ran = False
        else:
            code = exit_text.strip()
            step.exit_code = int(code) if code.isdigit() else None
            step.timed_out = step.exit_code == TIMEOUT_EXIT
            step.stdout, step.stdout_cut = _read_text(ws, f"{out}/{i}.out")
            step.stderr, step.stderr_cut = _read_text(ws, f"{out}/{i}.err")
        record.steps.append(step)
    if result.exit_code == _FILE_NOT_WRITTEN:
        # Not read back from the workspace: the sandbox could have written anything there.
        record.error = f"a file of the reproduction could not be written ({', '.join(sorted(procedure.files))})"
    elif result.exit_code == _NO_OUTPUT_DIR:
        record.error = f"the reproduction's output directory {OUTPUT_DIR} could not be written in the workspace"
    elif result.timed_out:
        record.error = f"the run was stopped after {budget:.0f}s"
    else:
        record.error = _step_error(record.steps)
    if record.error is not None:
        ran = [i for i, s in enumerate(record.steps) if s.ran]
        record.failed_step = ran[-1] if ran else 0
    return record, result


def _step_error(steps: list[StepRecord]) -> str | None:
    """Why the commands did not all run to an exit status (each before the last exiting 0), or None."""
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        if not step.ran:
            return f"command {i + 1} did not run"
        if step.timed_out or step.exit_code is None:
            return f"command {i + 1} ({step.command}) was stopped at its timeout"
        if step.exit_code in NOT_RUNNABLE_EXIT_CODES:
            said = f"exit {step.exit_code}: not found or not executable"
            return f"command {i + 1} ({step.command}) could not run ({said})"
        if not last and step.exit_code != 0:
            said = "every command before the last must exit 0"
            return f"command {i + 1} ({step.command}) exited {step.exit_code}; {said}"
    return None


def _command_run(
    ws: Path, procedure: CommandProcedure, n: int, run: SandboxRun, log_dir: Path, setup: bool
) -> CommandRunRecord:
    commands = [(s.run, float(s.timeout_s)) for s in procedure.steps]
    record, _ = _sandboxed(ws, procedure, n, commands, run, log_dir, setup)
    if record.error is None:
        last = record.steps[-1]
        record.checks = [_check(ws, i, check, last) for i, check in enumerate(procedure.bug_present)]
        unread = next((c for c in record.checks if c.holds is None), None)
        if unread is not None:
            record.error = f"{unread.description}: {unread.error}"
        record.bug_present = all(c.holds for c in record.checks)
    return record


def _check(ws: Path, index: int, check: OutputCheck, last: StepRecord) -> AssertionOutcome:
    """One ``bug_present`` check on what the last command left."""
    outcome = AssertionOutcome(index=index, description=check.describe(), holds=None)
    cut = False
    if check.check == "exit_status":
        actual = str(last.exit_code)
    elif check.check == "stdout":
        actual, cut = last.stdout, last.stdout_cut
    elif check.check == "stderr":
        actual, cut = last.stderr, last.stderr_cut
    else:
        assert check.path is not None
        read, cut = _read_text_or_why(ws, check.path)
        if isinstance(read, Exception):
            outcome.error = str(read)
            return outcome
        actual = read
    how, operand = check.comparison
    if how == "equals":
        holds = actual.rstrip() == operand.rstrip()
    elif how == "not_equals":
        holds = actual.rstrip() != operand.rstrip()
    elif how == "contains":
        holds = operand in actual
    else:
        holds = search(operand, actual)
    outcome.holds = holds
    outcome.actual = actual if len(actual) <= 2_000 else actual[:2_000] + "…"
    if cut:
        outcome.error = f"compared with the first {MAX_OUTPUT_BYTES} bytes only"
    return outcome


def _test_run(
    ws: Path,
    recipe: AppRecipe,
    procedure: TestProcedure,
    command: str,
    n: int,
    run: SandboxRun,
    log_dir: Path,
    setup: bool,
) -> CommandRunRecord:
    forget_report(ws, recipe)
    record, _ = _sandboxed(ws, procedure, n, [(command, float(procedure.timeout_s))], run, log_dir, setup)
    if record.error is not None:
        return record
    step = record.steps[0]
    description = f"the tests fail: {', '.join(procedure.tests)}"
    check = AssertionOutcome(index=0, description=description, holds=None)
    record.checks = [check]
    if recipe.test_report:
        try:
            cases = read_workspace_report(ws, recipe.test_report)
        except ReportError as err:
            record.error = check.error = f"{err}; the test command exited {step.exit_code}"
            return record
        record.test_counts = cases.counts()
        record.failing_tests = cases.named(CaseOutcome.FAILED)[:MAX_NAMED_TESTS]
        record.passing_tests = cases.named(CaseOutcome.PASSED)[:MAX_NAMED_TESTS]
        if not cases.cases:
            record.error = check.error = "the test report lists no test case: the named tests did not run"
            return record
        check.holds = bool(record.failing_tests)
        check.actual = f"exit {step.exit_code}; {record.test_counts}"
    else:
        check.holds = step.exit_code != 0
        check.actual = f"exit {step.exit_code}"
    record.bug_present = bool(check.holds)
    return record


def _read(ws: Path, rel: str, limit: int) -> tuple[str | None, bool]:
    """The text of the untrusted file ``rel`` (None when it is missing or refused) and whether it was cut."""
    read, cut = _read_text_or_why(ws, rel, limit)
    return (None, False) if isinstance(read, Exception) else (read, cut)


def _read_text(ws: Path, rel: str) -> tuple[str, bool]:
    read, cut = _read(ws, rel, MAX_OUTPUT_BYTES)
    return read or "", cut


def _read_text_or_why(ws: Path, rel: str, limit: int = MAX_OUTPUT_BYTES) -> tuple[str | UntrustedFileError, bool]:
    try:
        data, cut = read_beneath_cut(ws, rel, max_bytes=limit)
    except UntrustedFileError as err:
        return err, False
    return data.decode(errors="replace"), cut
