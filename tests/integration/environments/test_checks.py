from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from environments.checks import run_tests
from environments.processes import is_live
from environments.spec import load_recipe
from tests.support.gitrepo import CART_APP


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(CART_APP, ws, ignore=shutil.ignore_patterns("__pycache__"))
    return ws


def test_the_sample_apps_tests_pass_in_its_workspace(workspace: Path, tmp_path: Path) -> None:
    result = run_tests(workspace, load_recipe(workspace), timeout_s=120, log_path=tmp_path / "tests.log")
    assert result.passed and result.exit_code == 0 and not result.timed_out
    assert "OK" in result.output_tail
    assert result.log_path.read_text().endswith(result.output_tail)


def test_a_regression_test_that_catches_the_bug_fails(workspace: Path, tmp_path: Path) -> None:
    (workspace / "tests" / "test_quantity.py").write_text(
        "import unittest\n"
        "from cart import Item, compute_total\n"
        "class QuantityTest(unittest.TestCase):\n"
        "    def test_quantity_counts(self) -> None:\n"
        "        self.assertEqual(compute_total([Item('a', 'A', 250, 2)]), 500)\n"
    )
    result = run_tests(workspace, load_recipe(workspace), timeout_s=120, log_path=tmp_path / "tests.log")
    assert not result.passed and result.exit_code == 1
    assert "test_quantity_counts" in result.output_tail and "FAILED" in result.output_tail


def test_only_the_tail_of_long_output_is_kept(workspace: Path, tmp_path: Path) -> None:
    recipe = load_recipe(workspace).model_copy(update={"test": "python3 -c \"print('x' * 20000); print('the end')\""})
    result = run_tests(workspace, recipe, timeout_s=60, log_path=tmp_path / "tests.log")
    assert result.passed
    assert len(result.output_tail.encode()) <= 4096
    assert result.output_tail.rstrip().endswith("the end")
    assert len(result.log_path.read_bytes()) > 20000


def test_a_test_command_that_hangs_is_killed_with_its_children(workspace: Path) -> None:
    recipe = load_recipe(workspace).model_copy(update={"test": "sleep 300 & echo $! > child.pid; sleep 300"})
    result = run_tests(workspace, recipe, timeout_s=1.0)
    try:
        assert result.timed_out and not result.passed and result.exit_code is None
        child = int((workspace / "child.pid").read_text())
        assert not is_live(child)
    finally:
        result.log_path.unlink()
