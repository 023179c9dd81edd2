"""Real git checkouts for repair tests: the sample cart app committed in a fresh repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from repair.interface import RepairRequest
from repair.openai_engine import OpenAIToolEngine

REPO = Path(__file__).resolve().parents[2]
CART = REPO / "examples" / "cart"
CART_SCRIPTS = CART / "model"
GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "durafix tests",
    "GIT_AUTHOR_EMAIL": "tests@durafix.invalid",
    "GIT_COMMITTER_NAME": "durafix tests",
    "GIT_COMMITTER_EMAIL": "tests@durafix.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo: Path, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["git", *args], cwd=repo, env=GIT_ENV, input=stdin, capture_output=True, text=True, check=True
    )
    return done.stdout


def commit_tree(src: Path, dest: Path) -> Path:
    """Copy ``src`` to ``dest`` and commit it as the first revision of a new repository."""
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "base")
    return dest


@pytest.fixture
def cart_repo(tmp_path: Path) -> Path:
    """A git working tree of the sample cart app at its (buggy) base revision."""
    return commit_tree(CART, tmp_path / "cart")


def run_app_tests(repo: Path) -> subprocess.CompletedProcess[str]:
    """The app's own test command (``durafix.yaml``), run with this interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "unittest", "discover", "-s", "tests", "-t", "."],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


def engine_for(base_url: str, **options: Any) -> OpenAIToolEngine:
    """An engine talking to ``base_url`` with the scripted server's model name and a short timeout."""
    settings: dict[str, Any] = {"api_key": "test-key", "model": "durafix-scripted", "timeout_s": 10.0, **options}
    return OpenAIToolEngine(base_url, **settings)


def request_for(workspace: Path, **fields: Any) -> RepairRequest:
    values: dict[str, Any] = {
        "run_id": "repair:shop/cart#7",
        "op_id": f"repair:shop/cart#7:repair:{fields.get('attempt', 1)}",
        "attempt": 1,
        "issue_title": "Cart total ignores quantities",
        "issue_body": "The cart page shows Total: $23.75 but the lines add up to $40.00.",
        "workspace": str(workspace),
        "max_turns": 20,
        "token_budget": 100_000,
        **fields,
    }
    return RepairRequest.model_validate(values)
