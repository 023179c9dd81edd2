"""The regression proof and per-test results, on real git workspaces with real test runners.

The cart sample (Python unittest) and a small node project (node's test runner writing JUnit XML) are
committed into real repositories; a candidate commit is made the way verification makes it; the proof then
runs the real test commands on the base revision's code with only the patch's test files kept.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from environments.checks import run_tests
from environments.interface import AppRecipe, TestRunResult
from environments.regression import ProofStatus, RegressionProof, TestRunner, prove_regression
from environments.test_files import is_test_file, pick_test_files
from environments.test_results import (
    CaseOutcome,
    ReportError,
    TestCases,
    fixed,
    read_junit,
    read_workspace_report,
    regressions,
)
from tests.support.gitrepo import CART_APP, git

CART_RECIPE = AppRecipe(start="true", test="python3 -m unittest discover -s tests -t .")
BROKEN = "    return sum(item.unit_price_cents for item in items)\n"
FIXED = "    return sum(line_total(item) for item in items)\n"
NEW_TEST = (
    "    def test_total_counts_quantities(self) -> None:\n"
    '        self.assertEqual(compute_total([Item("t", "T", 450, 3)]), 1350)\n\n'
    "    def test_format_cents(self) -> None:\n"
)
HARMLESS_TEST = (
    "    def test_two_empty_carts(self) -> None:\n"
    "        self.assertEqual(compute_total([]) + compute_total([]), 0)\n\n"
    "    def test_format_cents(self) -> None:\n"
)


def workspace_with(tmp_path: Path, source: Path, edits: dict[str, tuple[str, str]]) -> tuple[Path, str]:
    """A git workspace of ``source`` at a base commit, HEAD a candidate commit applying ``edits``
    (path -> (old, new) text; old empty: a new file), as verification leaves it."""
    ws = tmp_path / "ws"
    shutil.copytree(source, ws, ignore=shutil.ignore_patterns("__pycache__", "model", "*.md", "repro.yaml"))
    git("init", "-q", "-b", "main", cwd=ws)
    git("add", "-A", cwd=ws)
    git("commit", "-q", "-m", "base", cwd=ws)
    base = git("rev-parse", "HEAD", cwd=ws)
    for path, (old, new) in edits.items():
        target = ws / path
        target.parent.mkdir(parents=True, exist_ok=True)
        text = target.read_text() if old else ""
        assert old in text
        target.write_text(text.replace(old, new, 1) if old else new)
    git("add", "-A", cwd=ws)
    git("commit", "-q", "-m", "candidate", cwd=ws)
    return ws, base


def runner(ws: Path, recipe: AppRecipe, setups: list[str] | None = None) -> tuple[list[str], TestRunner]:
    """Runs the real test command; a run asked to set up first records the lock file it would set up from
    (``setups``; without that list, setting up again fails the test: no lock file was reverted)."""
    commands: list[str] = []

    def run(command: str, log: Path, setup_first: bool) -> TestRunResult:
        if setup_first:
            assert setups is not None, "setup must not run again: no lock file was reverted"
            setups.append((ws / "package.json").read_text())
        commands.append(command)
        return run_tests(ws, recipe, 60, log_path=log, command=command)

    return commands, run


def head_proof(
    ws: Path, base: str, run: TestRunner, tmp_path: Path, recipe: AppRecipe = CART_RECIPE
) -> RegressionProof:
    """The proof of ``recipe`` (by default the cart sample's, with no report and no subset) for the workspace's
    head."""
    return prove_regression(
        ws,
        base,
        recipe,
        run=run,
        log_dir=tmp_path / "logs",
        candidate_cases=None,
        candidate=git("rev-parse", "HEAD", cwd=ws),
    )


def test_a_test_that_fails_without_the_fix_and_passes_with_it_is_proven(tmp_path: Path) -> None:
    ws, base = workspace_with(
        tmp_path,
        CART_APP,
        {"cart.py": (BROKEN, FIXED), "tests/test_cart.py": ("    def test_format_cents(self) -> None:\n", NEW_TEST)},
    )
    commands, run = runner(ws, CART_RECIPE)
    proof = head_proof(ws, base, run, tmp_path)
    assert proof.status == ProofStatus.PROVEN, proof
    assert proof.test_files == ["tests/test_cart.py"]
    assert commands == [CART_RECIPE.test]  # no subset declared: the full suite, on the base's code
    assert proof.base_log is not None and "test_total_counts_quantities" in proof.base_log.read_text()
    assert "FAILED" in proof.base_log.read_text()
    # The proof put cart.py back as on the base and kept the new test.
    assert BROKEN in (ws / "cart.py").read_text()
    assert "test_total_counts_quantities" in (ws / "tests/test_cart.py").read_text()
    # The commits are untouched: HEAD is still the candidate.
    assert FIXED in git("show", "HEAD:cart.py", cwd=ws)
    assert "fail on the base and pass with the fix" in proof.summary()


def test_a_test_that_passes_on_the_base_too_proves_nothing(tmp_path: Path) -> None:
    ws, base = workspace_with(
        tmp_path,
        CART_APP,
        {
            "cart.py": (BROKEN, FIXED),
            "tests/test_cart.py": ("    def test_format_cents(self) -> None:\n", HARMLESS_TEST),
        },
    )
    _, run = runner(ws, CART_RECIPE)
    proof = head_proof(ws, base, run, tmp_path)
    assert proof.status == ProofStatus.NOT_PROVEN
    assert "pass on the base too" in proof.summary()


def test_a_patch_without_tests_has_nothing_to_prove(tmp_path: Path) -> None:
    ws, base = workspace_with(tmp_path, CART_APP, {"cart.py": (BROKEN, FIXED)})
    commands, run = runner(ws, CART_RECIPE)
    proof = head_proof(ws, base, run, tmp_path)
    assert proof.status == ProofStatus.NO_TESTS and commands == []


NODE_LIB = "exports.double = (n) => n + n + 1;\n"
NODE_OLD_TEST = (
    'const test = require("node:test");\nconst assert = require("assert");\nconst { double } = require("../lib");\n'
    'test("double is a number", () => assert.strictEqual(typeof double(2), "number"));\n'
    'test("zero stays a number", () => assert.ok(!Number.isNaN(double(0))));\n'
)
NODE_NEW_TEST = 'test("double of two is four", () => assert.strictEqual(double(2), 4));\n'
NODE_RECIPE = AppRecipe(
    start="true",
    test="node --test --test-reporter=junit --test-reporter-destination=report.xml test/",
    test_report="report.xml",
    test_subset="node --test --test-reporter=junit --test-reporter-destination=report.xml {files}",
    lock_files=["package.json"],
)


@pytest.fixture
def node_project(tmp_path: Path) -> Path:
    # Node is part of the machine the tests run on (the real-project e2e needs it too): no skip that could hide
    # a broken per-test path.
    assert shutil.which("node") is not None, "node is not installed"
    src = tmp_path / "src"
    (src / "test").mkdir(parents=True)
    (src / "lib.js").write_text(NODE_LIB)
    (src / "package.json").write_text('{"name": "doubler", "version": "1.0.0"}\n')
    (src / "test" / "double.test.js").write_text(NODE_OLD_TEST)
    return src


def test_with_a_junit_report_the_proof_names_the_cases_and_a_reverted_lock_file_sets_up_again(
    tmp_path: Path, node_project: Path
) -> None:
    ws, base = workspace_with(
        tmp_path,
        node_project,
        {
            "lib.js": (NODE_LIB, "exports.double = (n) => n + n;\n"),
            "package.json": ('"1.0.0"', '"1.0.1"'),
            "test/double.test.js": (NODE_OLD_TEST, NODE_OLD_TEST + NODE_NEW_TEST),
        },
    )
    setups: list[str] = []
    commands, run = runner(ws, NODE_RECIPE, setups)
    proof = head_proof(ws, base, run, tmp_path, recipe=NODE_RECIPE)
    assert proof.status == ProofStatus.PROVEN, proof
    assert proof.fixed_cases == ["test::double of two is four"]
    assert NODE_RECIPE.test_subset is not None
    assert commands == [NODE_RECIPE.test_subset.replace("{files}", "test/double.test.js")] * 2
    assert proof.candidate_log is not None and proof.base_log is not None
    assert len(setups) == 1 and '"1.0.0"' in setups[0]  # set up again, with the base's lock file


def test_junit_reports_read_from_real_runners_and_compared_per_test(tmp_path: Path, node_project: Path) -> None:
    (node_project / "test" / "double.test.js").write_text(NODE_OLD_TEST + NODE_NEW_TEST)
    result = run_tests(node_project, NODE_RECIPE, 60, log_path=tmp_path / "log")
    assert not result.passed and result.runnable
    cases = read_junit(node_project / "report.xml")
    assert cases.cases == {
        "test::double is a number": CaseOutcome.PASSED,
        "test::zero stays a number": CaseOutcome.PASSED,
        "test::double of two is four": CaseOutcome.FAILED,
    }
    assert cases.counts() == "2 passed, 1 failed"
    assert TestCases.from_json(cases.to_json()) == cases
    # A candidate may fail what failed on the base; losing a passing test (failed, or deleted) is a regression.
    same = TestCases(cases=dict(cases.cases))
    assert regressions(cases, same) == []
    worse = TestCases(cases={"test::double is a number": CaseOutcome.FAILED})
    assert regressions(cases, worse) == ["test::double is a number", "test::zero stays a number"]
    better = TestCases(cases={name: CaseOutcome.PASSED for name in cases.cases})
    assert fixed(cases, better) == ["test::double of two is four"]


def test_hostile_or_missing_reports_are_refused_not_read_as_passing(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="was not written"):
        read_junit(tmp_path / "absent.xml")
    bomb = tmp_path / "bomb.xml"
    bomb.write_text(
        '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><testsuite><testcase name="&a;"/></testsuite>'
    )
    with pytest.raises(ReportError, match="DTD"):
        read_junit(bomb)
    empty = tmp_path / "empty.xml"
    empty.write_text("<testsuites/>")
    with pytest.raises(ReportError, match="no test cases"):
        read_junit(empty)
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "report.xml").symlink_to(bomb)
    with pytest.raises(ReportError, match="is a link"):
        read_workspace_report(tmp_path / "ws", "report.xml")
    with pytest.raises(ReportError, match="leads outside"):
        read_workspace_report(tmp_path / "ws", "../bomb.xml")
    broken = tmp_path / "broken.xml"
    broken.write_text("<testsuite><testcase name='x'>")
    with pytest.raises(ReportError, match="not well-formed"):
        read_junit(broken)


def test_test_file_conventions_and_declared_globs() -> None:
    assert is_test_file("tests/test_cart.py") and is_test_file("src/app/__tests__/x.js")
    assert is_test_file("pkg/thing_test.go") and is_test_file("web/button.spec.ts") and is_test_file("test_x.py")
    assert not is_test_file("cart.py") and not is_test_file("src/testing.py") and not is_test_file("latest/x.py")
    # Declared globs add to the conventions.
    assert pick_test_files(["checks/a.py", "cart.py", "checks/b.py"], ["checks/*"]) == ["checks/a.py", "checks/b.py"]
    assert is_test_file("tests/test_cart.py", ["checks/*"])
