"""``durafix check [DIR] [--report ISSUE.md]``: a dry run of DIR's recipe (and of a report's reproduction) on the
local checkout, each stage in the sandbox as a worker runs it, with no forge, no Temporal and no model (see
:mod:`pipeline.recipe_check`). Each stage prints when it starts and how long it took; a failure names its fix
when it is recognised, and the log that holds the whole output.

Exit codes: 0 every stage passed (and, with ``--report``, the report reproduces); 1 the check cannot run here (DIR
is not the root of a git checkout with a commit, no bubblewrap, the browser failed); 2 usage; 3 the report has no
(valid) ``durafix-repro`` block; 4 the recipe is invalid; 5 setup failed; 6 the app did not become ready; 7 the
tests cannot run (not found, not executable, timed out); 8 the tests fail; 9 the report did not reproduce; 10 the
reproduction was inconclusive. When several stages fail, the first of them in that order (recipe, setup, start,
tests, report) gives the code.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import tempfile
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from environments.checks import SetupSettings
from environments.commands import tail
from environments.sandbox import Sandbox, SandboxUnavailableError
from environments.spec import RECIPE_FILE
from pipeline.cli.command import EXIT_USAGE, AddArguments, CliError
from pipeline.config import DurafixConfig
from pipeline.recipe_check import (
    CheckError,
    CheckResult,
    CheckSettings,
    Listener,
    Outcome,
    RecipeCheck,
    StageResult,
    checkout_head,
    uncommitted,
)
from repair.config import ModelConfig

if TYPE_CHECKING:
    from browser.runner import BrowserRunner

EPILOG = """\
stages: recipe (durafix.yaml loads; the report's block parses), setup, start (only when the app is needed: a
browser reproduction, or no reproduction to run and a `start` in the recipe), tests, report (with --report).
The workspace is a fresh tree of DIR's HEAD commit (uncommitted changes and untracked files are not in it);
durafix.yaml is read from DIR's working tree. Logs are kept in a temporary directory the output names;
nothing is written into DIR. A report with no block has its reproduction drafted by the model the worker
would use (OPENAI_BASE_URL, OPENAI_API_KEY, DURAFIX_MODEL), command and test drafts only, each run on the
checked commit until one shows the bug (up to 3); without a model configured it cannot be checked.

exit codes:
  0   every stage passed (with --report: the report reproduces)
  1   the check cannot run here (not a git checkout, no sandbox, the browser failed)
  2   usage
  3   the report has no durafix-repro block and no model is configured to draft one, the model drafted none
      usable, or the block is invalid
  4   the recipe is invalid
  5   setup failed
  6   the app did not become ready
  7   the tests cannot run (not found, not executable, timed out)
  8   the tests fail
  9   the report did not reproduce
  10  the reproduction was inconclusive
"""

LOG_LINES = 8
"""How many of a failed stage's last log lines are shown (the whole log is kept)."""

_SAID = {
    Outcome.PASSED: "check passed",
    Outcome.NO_REPRODUCTION: "the report has no reproduction to run",
    Outcome.RECIPE_INVALID: "the recipe is invalid",
    Outcome.SETUP_FAILED: "setup failed",
    Outcome.APP_NOT_READY: "the app did not become ready",
    Outcome.TESTS_CANNOT_RUN: "the tests cannot run",
    Outcome.TESTS_FAIL: "the tests fail",
    Outcome.NOT_REPRODUCED: "the report did not reproduce",
    Outcome.INCONCLUSIVE: "the reproduction was inconclusive",
}


class Printer(Listener):
    """Says each stage as it starts, its sub-states, and how it ended, on stdout as it happens."""

    def started(self, stage: str, what: str) -> None:
        _say(f"==> {stage}: {what}")

    def progress(self, text: str) -> None:
        _say(f"    {text}")

    def ended(self, result: StageResult) -> None:
        if result.status == "skipped":
            _say(f"--- {result.name}: skipped, {result.summary}")
            return
        word = "ok" if result.status == "passed" else "FAILED"
        _say(f"<== {result.name}: {word} in {result.duration_s:.1f} s: {result.summary}")
        if result.hint:
            _say(f"    fix: {result.hint}")
        if result.log is not None and result.status == "failed":
            if result.log.suffix == ".log":
                lines = tail(result.log, 2_000).splitlines()[-LOG_LINES:]
                if lines:
                    _say("    last lines of the log:")
                    for line in lines:
                        _say(f"      | {line[:200]}")
            _say(f"    log: {result.log}")


def cmd_check(args: argparse.Namespace, config: DurafixConfig) -> int:
    directory = Path(args.dir).resolve()
    if not directory.is_dir():
        raise CliError(f"{args.dir} is not a directory", EXIT_USAGE)
    report = Path(args.report).resolve() if args.report else None
    if report is not None and not report.is_file():
        raise CliError(f"--report {args.report} is not a file", EXIT_USAGE)
    base_tmp = tempfile.gettempdir()
    work_dir = Path(tempfile.mkdtemp(prefix="durafix-check-work-"))
    # Traversable by the unprivileged user Chromium runs as (its home is made in here, see below).
    work_dir.chmod(0o711)
    # Every temporary directory the libraries make for this process (git's empty home, the sandbox's /etc files,
    # Chromium's home) goes under the work directory, which is removed at the end: the process ends with
    # os._exit, so their own atexit removal never runs.
    tempfile.tempdir = str(work_dir)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _check(
            config, directory, report, work_dir, Path(tempfile.mkdtemp(prefix="durafix-check-", dir=base_tmp))
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
        # The check removes it on every way out once it runs; this covers a failure before it does.
        shutil.rmtree(work_dir, ignore_errors=True)


def _check(config: DurafixConfig, directory: Path, report: Path | None, work_dir: Path, log_dir: Path) -> int:
    """The check, its work directory made: everything it makes goes there, and its logs into ``log_dir``."""
    try:
        sandbox = Sandbox.detect(unsandboxed=config.unsandboxed)
        commit = checkout_head(directory)
    except SandboxUnavailableError as err:
        log_dir.rmdir()
        raise CliError(f"the check runs every command in the sandbox, which this host cannot make: {err}") from err
    except CheckError as err:
        log_dir.rmdir()
        raise CliError(str(err)) from err
    caches = config.state_dir.resolve()
    note = f"the worker's caches under {caches}"
    if caches.is_relative_to(directory):
        # The check writes nothing into the checkout: a state directory inside it gets caches of its own.
        caches = work_dir / "state"
        note = f"caches of this check only (the state directory {config.state_dir} is inside {directory})"

    def browser() -> BrowserRunner:
        from browser.runner import BrowserRunner

        return BrowserRunner(sandbox=config.browser_sandbox)

    settings = CheckSettings(
        directory=directory,
        log_dir=log_dir,
        work_dir=work_dir,
        setup=_setup_settings(config, caches),
        sandbox=sandbox,
        browser=browser,
        report=report,
        allowed_secrets=tuple(config.secret_allowlist),
        model=_model(),
    )
    check = RecipeCheck(settings, Printer())
    _say(f"durafix check {directory}" + (f" --report {report}" if report else ""))
    _say(f"    logs: {log_dir} (kept)")
    where = (
        f"in the {sandbox.kind} sandbox"
        if sandbox.sandboxed
        else "unsandboxed, as plain processes (DURAFIX_UNSANDBOXED)"
    )
    _say(f"    setup uses {note}; commands run {where}, on the local provider")
    result = _run(check, directory, commit)
    code = result.code
    if code == Outcome.PASSED:
        _say(f"check passed on {result.commit[:12]}")
    else:
        _say(f"check failed on {result.commit[:12]}: {_SAID[code]} (exit {int(code)}); logs in {log_dir}")
    return int(code)


def _run(check: RecipeCheck, directory: Path, commit: str) -> CheckResult:
    try:
        _say(f"    commit: {commit} (HEAD of {directory}); the workspace is that commit's tree")
        changed = [line[3:] for line in uncommitted(directory)]
        if RECIPE_FILE in changed:
            _say(f"    {RECIPE_FILE}: read from the working tree (not committed as it is)")
        others = [name for name in changed if name != RECIPE_FILE]
        if others:
            shown = ", ".join(others[:8]) + (f" and {len(others) - 8} more" if len(others) > 8 else "")
            _say(f"    not in the workspace (uncommitted): {shown}")
        return check.run()
    except CheckError as err:
        raise CliError(str(err)) from err
    except KeyboardInterrupt:
        _say("interrupted: everything the check started has been stopped and removed")
        raise


def _model() -> ModelConfig | None:
    """The model a report with no block has its reproduction drafted by, as the worker reads it from the
    environment; None when none is configured (the check then says a run would draft one)."""
    try:
        return ModelConfig.from_env()
    except ValueError:
        return None


def _setup_settings(config: DurafixConfig, state: Path) -> SetupSettings:
    """The worker's setup settings (:meth:`pipeline.services.Services.setup`) with its caches under ``state``."""
    from environments.depcache import DependencyCache

    cache = DependencyCache(state / "cache" / "deps", restore=config.dependency_restore)
    return SetupSettings(
        cache=cache if config.dependency_cache else None,
        package_caches=state / "cache" / "packages",
        passthrough=tuple(config.setup_passthrough),
        egress_hosts=tuple(config.setup_egress),
    )


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM is answered like Ctrl-C: the check's cleanup runs before the process ends.
    raise KeyboardInterrupt


def _say(text: str) -> None:
    print(text, flush=True)


def _check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        "A dry run of the repository's recipe, and of a report's reproduction, on this checkout: each stage in "
        "the sandbox as a worker runs it, with no forge, no Temporal and no model."
    )
    parser.epilog = EPILOG
    parser.add_argument("dir", nargs="?", default=".", help="the checkout's root (default: the current directory)")
    parser.add_argument(
        "--report", metavar="ISSUE.md", help="a Markdown file holding a report as an issue body, to reproduce"
    )
    parser.set_defaults(fn=cmd_check)


ARGUMENTS: dict[str, AddArguments] = {"check": _check_arguments}
