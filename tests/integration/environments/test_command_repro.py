"""Command and test reproductions run for real: each run's script in bubblewrap (no network), real Python
programs and test runners, outputs read back as untrusted files and judged."""

from __future__ import annotations

from pathlib import Path

import pytest

from browser.results import ReproductionStatus
from environments.checks import run_tests
from environments.command_repro import SandboxReproduction, reproduce_in_sandbox, script
from environments.interface import AppRecipe, TestRunResult
from environments.reproduction import OUTPUT_DIR, SandboxProcedure, parse_reproduction
from environments.sandbox import Sandbox
from tests.support.sandbox import sandbox

__all__ = ["sandbox"]

BUGGY = "def mean(xs):\n    return sum(xs) / (len(xs) + 1)\n"
FIXED = "def mean(xs):\n    return sum(xs) / len(xs)\n"
RECIPE = AppRecipe(start="true", test="python3 -m unittest discover -s tests", test_subset="python3 -m unittest {ids}")


def project(tmp_path: Path, source: str = BUGGY) -> Path:
    ws = tmp_path / "ws"
    (ws / "tests").mkdir(parents=True)
    (ws / "stats.py").write_text(source)
    (ws / "tests" / "__init__.py").write_text("")
    (ws / "tests" / "test_stats.py").write_text(
        "import unittest\nfrom stats import mean\n\nclass T(unittest.TestCase):\n"
        "    def test_one(self):\n        self.assertEqual(mean([2]), 2)\n"
    )
    return ws


def run(ws: Path, procedure: str, sandbox: Sandbox, recipe: AppRecipe = RECIPE) -> SandboxReproduction:
    parsed = parse_reproduction(procedure)
    assert not isinstance(parsed, type(None))

    def sandboxed(command: str, log: Path, setup: bool, timeout_s: float) -> TestRunResult:
        return run_tests(ws, recipe, timeout_s, log_path=log, command=command, sandbox=sandbox)

    assert parsed.__class__.__name__ in ("CommandProcedure", "TestProcedure")
    proc: SandboxProcedure = parsed  # type: ignore[assignment]
    return reproduce_in_sandbox(ws, recipe, proc, sandboxed, ws.parent / "logs")


MEAN = """
version: 1
kind: command
name: mean of [2, 4] is not 3
runs: 2
files:
  repro/show.py: |
    import sys
    sys.path.insert(0, ".")
    from stats import mean
    print(mean([2, 4]))
steps:
  - run: python3 repro/show.py
    timeout_s: 30
bug_present:
  - {check: stdout, not_equals: "3.0"}
  - {check: exit_status, equals: "0"}
"""


def test_a_command_reproduction_shows_the_bug_on_buggy_code_and_not_on_fixed_code(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    found = run(project(tmp_path / "a"), MEAN, sandbox)
    assert found.status == ReproductionStatus.REPRODUCED, found.detail
    assert [r.steps[0].stdout for r in found.runs] == ["2.0\n", "2.0\n"]
    assert all(c.holds for c in found.runs[0].checks)
    # What the command printed stays in the record: the detail (for tickets, history, prompts) never quotes it.
    assert "2.0" not in found.detail and "stdout not_equals '3.0' held" in found.detail

    fixed = run(project(tmp_path / "b", FIXED), MEAN, sandbox)
    assert fixed.status == ReproductionStatus.NOT_REPRODUCED, fixed.detail
    assert fixed.runs[0].steps[0].stdout == "3.0\n"
    assert "did not hold" in fixed.detail


FLAKY = """
version: 1
kind: command
name: flaky
runs: 2
steps:
  - run: if [ -f seen ]; then echo fine; else touch seen; echo broken; fi
bug_present:
  - {check: stdout, contains: broken}
"""
EARLIER_STEP_FAILS = """
version: 1
kind: command
name: earlier step fails
steps:
  - run: echo preparing; exit 3
  - run: echo never
bug_present:
  - {check: stdout, contains: never}
"""
HANGS = """
version: 1
kind: command
name: hangs
steps:
  - run: sleep 30
    timeout_s: 1
bug_present:
  - {check: exit_status, equals: "0"}
"""


@pytest.mark.parametrize(
    ("procedure", "says", "not_run"),
    [
        (FLAKY, "runs disagree", 0),
        (EARLIER_STEP_FAILS, "command 1 (echo preparing; exit 3) exited 3", 1),
        (HANGS, "stopped at its timeout", 0),
    ],
    ids=["runs-disagree", "earlier-command-fails", "timeout"],
)
def test_runs_that_disagree_or_stop_early_are_inconclusive(
    tmp_path: Path, sandbox: Sandbox, procedure: str, says: str, not_run: int
) -> None:
    """Runs that disagree, a command before the last that fails, or one stopped at its timeout leave no verdict;
    the detail says which, and the commands after a failed one do not run."""
    found = run(project(tmp_path), procedure, sandbox)
    assert found.status == ReproductionStatus.INCONCLUSIVE, found.detail
    assert says in found.detail
    assert [step.ran for step in found.runs[0].steps].count(False) == not_run


def test_a_file_check_reads_what_the_command_wrote(tmp_path: Path, sandbox: Sandbox) -> None:
    wrote = """
version: 1
kind: command
name: writes a report
steps:
  - run: python3 -c "from stats import mean; open('out/result.txt', 'w').write(str(mean([1, 2, 3])))"
bug_present:
  - {check: file, path: out/result.txt, matches: "^1\\\\.5$"}
"""
    ws = project(tmp_path)
    (ws / "out").mkdir()
    found = run(ws, wrote, sandbox)
    assert found.status == ReproductionStatus.REPRODUCED, found.detail
    assert found.runs[0].checks[0].actual == "1.5"


def test_outputs_and_checked_files_that_are_links_are_never_followed(tmp_path: Path, sandbox: Sandbox) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("host secret\n")
    # The command replaces its own stdout file and the checked file with links to a file of the host's.
    hostile = f"""
version: 1
kind: command
name: hostile links
steps:
  - run: "echo ok; ln -sf {secret} {OUTPUT_DIR}/run-1/1.err; ln -sf {secret} leak.txt"
bug_present:
  - {{check: file, path: leak.txt, contains: secret}}
"""
    found = run(project(tmp_path), hostile, sandbox)
    assert found.status == ReproductionStatus.INCONCLUSIVE
    step = found.runs[0].steps[0]
    assert step.stdout == "ok\n"
    assert "secret" not in step.stderr
    assert found.runs[0].checks[0].holds is None
    assert "secret" not in found.model_dump_json().replace("contains 'secret'", "").replace("host-secret", "")


def test_a_test_reproduction_with_a_written_test_fails_on_the_bug_and_passes_on_the_fix(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    drafted = """
version: 1
kind: test
name: mean of two numbers
files:
  tests/test_issue_7.py: |
    import unittest
    from stats import mean

    class MeanOfTwo(unittest.TestCase):
        def test_mean_of_two(self):
            self.assertEqual(mean([2, 4]), 3)
tests: [tests.test_issue_7]
"""
    found = run(project(tmp_path / "a"), drafted, sandbox)
    assert found.status == ReproductionStatus.REPRODUCED, found.detail
    assert found.command == "python3 -m unittest tests.test_issue_7"
    assert "AssertionError" in found.runs[0].steps[0].stderr
    fixed = run(project(tmp_path / "b", FIXED), drafted, sandbox)
    assert fixed.status == ReproductionStatus.NOT_REPRODUCED, fixed.detail


def test_a_test_reproduction_without_a_test_subset_names_the_fix(tmp_path: Path, sandbox: Sandbox) -> None:
    recipe = RECIPE.model_copy(update={"test_subset": None})
    found = run(project(tmp_path), "version: 1\nkind: test\nname: t\ntests: [tests.test_stats]\n", sandbox, recipe)
    assert found.status == ReproductionStatus.INCONCLUSIVE
    assert "`test_subset`" in found.detail


def test_the_script_quotes_every_command_and_file() -> None:
    procedure = parse_reproduction(
        'version: 1\nkind: command\nname: q\nfiles: {"a b/it\'s.txt": "$(touch pwned)"}\n'
        "steps: [{run: \"echo '$HOME'\"}]\nbug_present: [{check: stdout, contains: x}]\n"
    )
    assert not isinstance(procedure, type(None))
    text = script(procedure, 1, [("echo '$HOME'", 5.0)])  # type: ignore[arg-type]
    assert "$(touch pwned)" not in text
    assert "'a b/it'\"'\"'s.txt'" in text
    assert "/bin/sh -c 'echo '\"'\"'$HOME'\"'\"''" in text


def test_files_with_quotes_in_their_paths_are_written_and_an_unwritable_one_is_said_without_reading_the_workspace(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    quoted = (
        'version: 1\nkind: command\nname: q\nfiles: {"it\'s here/show.py": "print(\'written\')"}\n'
        'steps: [{run: "python3 \\"it\'s here/show.py\\""}]\nbug_present: [{check: stdout, contains: written}]\n'
    )
    found = run(project(tmp_path / "a"), quoted, sandbox)
    assert found.status == ReproductionStatus.REPRODUCED, found.detail

    # A directory stands where the file is to go: the write fails, and the run says which files it writes.
    ws = project(tmp_path / "b")
    (ws / "blocked.txt").mkdir()
    blocked = 'version: 1\nkind: command\nname: b\nfiles: {blocked.txt: x}\nsteps: [{run: "true"}]\n'
    found = run(ws, blocked + "bug_present: [{check: exit_status, equals: '0'}]\n", sandbox)
    assert found.status == ReproductionStatus.INCONCLUSIVE
    assert found.runs[0].error == "a file of the reproduction could not be written (blocked.txt)"
