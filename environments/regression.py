"""The regression proof: the tests a patch adds or changes, run on the base revision without the fix.

Reviewers want to see that the patch's tests catch the bug: they fail on the base and pass with the fix. Given a
verified candidate's workspace (HEAD the candidate commit, its tests already run), :func:`prove_regression`
finds the test files the patch adds or modifies (:mod:`environments.test_files`), puts every other file the
patch touched back as it is on the base (restored from the base revision, or removed if the patch added it),
and runs the tests again: the recipe's ``test_subset`` on those files when it declares one (run on the
candidate first, for the pass side), else its ``test``. With a ``test_report`` the proof names the test cases
that fail on the base and pass on the candidate; without one it compares exit codes, which is sound because a
run whose base already fails tests without a per-test report never gets this far.

Setup is run again first only when a reverted file is a lock file (the dependencies differ); otherwise the
installed dependencies are the base's already. The proof changes only the workspace's working tree, never its
git metadata or commits: call it after the candidate is committed and snapshotted.

The verification's tests have run in the workspace by then, so its ``.git`` is not consulted: every git command
here goes through a git directory of the worker's own (:func:`environments.git.isolated_git`) whose HEAD and
index are the candidate commit the caller names, and the test report is read and removed with no link followed
(:mod:`environments.untrusted_files`).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, Field

from environments.checks import SetupError
from environments.git import IsolatedGit, isolated_git
from environments.interface import AppRecipe, TestRunResult
from environments.spec import lock_files
from environments.test_files import pick_test_files
from environments.test_results import ReportError, TestCases, fixed, read_workspace_report
from environments.untrusted_files import unlink_beneath

# How many fixed test cases a proof names; the report links the full logs for the rest.
MAX_NAMED_CASES = 50

TestRunner = Callable[[str, Path, bool], TestRunResult]
"""Runs a test command in the workspace (in the sandbox), logging to the path given, after running the recipe's
setup first when the flag says so, and answers its result; raises :class:`SetupError` when that setup fails."""


class ProofStatus(StrEnum):
    PROVEN = "proven"  # the patch's tests fail on the base and pass on the candidate
    NOT_PROVEN = "not-proven"  # the patch's tests pass on the base too: they do not catch the bug
    NO_TESTS = "no-tests"  # the patch adds or changes no test file
    NOT_RUNNABLE = "not-runnable"  # the tests could not run on the base (or the subset not on the candidate)


class RegressionProof(BaseModel):
    """What :func:`prove_regression` found. ``base_log`` / ``candidate_log`` are the runs' logs (``None`` when
    not run; ``candidate_log`` is ``None`` too when the proof reuses the verification's full run)."""

    status: ProofStatus
    test_files: list[str] = Field(default_factory=list)
    command: str = ""
    base_summary: str = ""
    candidate_summary: str = ""
    fixed_cases: list[str] = Field(default_factory=list)
    base_log: Path | None = None
    candidate_log: Path | None = None

    def summary(self) -> str:
        """One line for the run's state and the report."""
        files = ", ".join(self.test_files)
        if self.status == ProofStatus.NO_TESTS:
            return "the patch adds or changes no test file"
        if self.status == ProofStatus.PROVEN:
            cases = f" ({len(self.fixed_cases)} test case(s) fail -> pass)" if self.fixed_cases else ""
            return f"the patch's tests ({files}) fail on the base and pass with the fix{cases}"
        if self.status == ProofStatus.NOT_PROVEN:
            return f"the patch's tests ({files}) pass on the base too: they do not show the bug"
        return (
            f"the patch's tests ({files}) could not run: base {self.base_summary}; candidate {self.candidate_summary}"
        )


def prove_regression(
    ws: Path,
    base_revision: str,
    recipe: AppRecipe,
    *,
    run: TestRunner,
    log_dir: Path,
    candidate_cases: TestCases | None,
    candidate: str,
) -> RegressionProof:
    """Run the patch's test files against the base revision's code in ``ws`` (see the module docstring).

    ``candidate`` is the commit the worker made in ``ws`` (whose tree the workspace was built to), so nothing the
    tests left in the workspace's git metadata decides which files are the patch's.

    ``candidate_cases``: the verification run's test cases (with a ``test_report``), used when the proof runs
    the full ``test``. ``run`` is asked to set up again only for the base run after a lock file was reverted.
    """
    with isolated_git(ws, head=candidate, index_tree=candidate) as git:
        return _prove(ws, git, base_revision, recipe, run=run, log_dir=log_dir, candidate_cases=candidate_cases)


def _prove(
    ws: Path,
    git: IsolatedGit,
    base_revision: str,
    recipe: AppRecipe,
    *,
    run: TestRunner,
    log_dir: Path,
    candidate_cases: TestCases | None,
) -> RegressionProof:
    changed = _changed(git, base_revision)
    tests = pick_test_files([path for path, status in changed.items() if status != "D"], recipe.test_files)
    if not tests:
        return RegressionProof(status=ProofStatus.NO_TESTS)
    log_dir.mkdir(parents=True, exist_ok=True)
    if recipe.test_subset:
        command = recipe.test_subset.replace("{files}", " ".join(shlex.quote(t) for t in tests))
        candidate_log = log_dir / "regression-candidate.log"
        forget_report(ws, recipe)
        on_candidate = run(command, candidate_log, False)
        candidate_passed, candidate_summary = on_candidate.passed, _said(on_candidate)
        candidate_cases = _cases(ws, recipe)
        if not on_candidate.runnable:
            return RegressionProof(
                status=ProofStatus.NOT_RUNNABLE,
                test_files=tests,
                command=command,
                candidate_summary=candidate_summary,
                candidate_log=candidate_log,
            )
    else:
        command, candidate_log = recipe.test, None
        candidate_passed, candidate_summary = True, "passed (the verification's run)"
    reverted = _revert_all_but(git, base_revision, changed, keep=set(tests))
    base_log = log_dir / "regression-base.log"
    forget_report(ws, recipe)
    try:
        on_base = run(command, base_log, bool(set(reverted) & set(lock_files(ws, recipe))))
    except SetupError as err:
        return RegressionProof(
            status=ProofStatus.NOT_RUNNABLE,
            test_files=tests,
            command=command,
            base_summary=f"setup failed: {str(err).splitlines()[0].rstrip(':')}",
            candidate_summary=candidate_summary,
            base_log=base_log,
            candidate_log=candidate_log,
        )
    base_cases = _cases(ws, recipe)
    proof = RegressionProof(
        status=ProofStatus.NOT_PROVEN,
        test_files=tests,
        command=command,
        base_summary=_said(on_base),
        candidate_summary=candidate_summary,
        base_log=base_log,
        candidate_log=candidate_log,
    )
    if not on_base.runnable:
        proof.status = ProofStatus.NOT_RUNNABLE
    elif base_cases is not None and candidate_cases is not None:
        proof.fixed_cases = fixed(base_cases, candidate_cases)[:MAX_NAMED_CASES]
        proof.status = ProofStatus.PROVEN if proof.fixed_cases else ProofStatus.NOT_PROVEN
    elif candidate_passed and not on_base.passed:
        proof.status = ProofStatus.PROVEN
    return proof


def _changed(git: IsolatedGit, base_revision: str) -> dict[str, str]:
    """Path -> git's status letter (A, M, D, T) of every file the candidate changes relative to ``base_revision``."""
    out = git.run(["diff", "--no-renames", "--no-ext-diff", "--name-status", "-z", base_revision, git.head])
    fields = [f for f in out.split("\0") if f]
    return {fields[i + 1]: fields[i][0] for i in range(0, len(fields) - 1, 2)}


def _revert_all_but(git: IsolatedGit, base_revision: str, changed: dict[str, str], keep: set[str]) -> list[str]:
    """Put every changed path not in ``keep`` back as on the base (working tree, and the isolated index); return
    them. git replaces a link on the way to a path instead of writing through it."""
    added = sorted(p for p, status in changed.items() if p not in keep and status == "A")
    existing = sorted(p for p, status in changed.items() if p not in keep and status != "A")
    if added:
        git.run(["rm", "-q", "-f", "--ignore-unmatch", "--", *added])
    if existing:
        git.run(["checkout", base_revision, "--", *existing])
    return added + existing


def forget_report(ws: Path, recipe: AppRecipe) -> None:
    """Remove the recipe's test report from ``ws`` before a run, so a run that writes none is not judged by an
    earlier run's (or a committed) report."""
    if recipe.test_report:
        unlink_beneath(ws, recipe.test_report)


def _cases(ws: Path, recipe: AppRecipe) -> TestCases | None:
    if not recipe.test_report:
        return None
    try:
        return read_workspace_report(ws, recipe.test_report)
    except ReportError:
        return None


def _said(result: TestRunResult) -> str:
    if result.passed:
        return "passed"
    if result.timed_out:
        return f"timed out after {result.duration_s:.0f} s"
    return f"could not run, exit {result.exit_code}" if not result.runnable else f"failed, exit {result.exit_code}"
