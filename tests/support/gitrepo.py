"""Real git repositories for the tests: the sample cart app committed into a bare repository; files written into
a work tree and committed there."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

CART_APP = Path(__file__).resolve().parents[2] / "examples" / "cart"


def git(*args: str, cwd: Path | None = None, stdin: str | None = None) -> str:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(cwd or Path.cwd()),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": "Test Author",
        "GIT_AUTHOR_EMAIL": "author@example.com",
        "GIT_COMMITTER_NAME": "Test Author",
        "GIT_COMMITTER_EMAIL": "author@example.com",
        "GIT_AUTHOR_DATE": "@1700000000 +0000",
        "GIT_COMMITTER_DATE": "@1700000000 +0000",
    }
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, input=stdin, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout.strip()


def write_files(root: Path, files: Mapping[str, str]) -> Path:
    """``files`` (path relative to ``root`` -> text) written under ``root``, their directories made as needed,
    a file already there overwritten; ``root``."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def commit_files(root: Path, files: Mapping[str, str], message: str) -> None:
    """``files`` written into the work tree ``root`` (:func:`write_files`) and everything there committed as
    ``message`` by :func:`git`'s fixed author."""
    write_files(root, files)
    git("add", "-A", cwd=root)
    git("commit", "-q", "-m", message, cwd=root)


@dataclass
class Repo:
    """A bare repository (the "remote") and a working clone used to author commits and patches."""

    bare: Path
    work: Path
    base: str

    @property
    def url(self) -> str:
        return self.bare.as_uri()

    def make_patch(self, edits: dict[str, str]) -> str:
        """A ``git diff`` turning the base revision into one with ``edits`` (path -> new content)."""
        for name, content in edits.items():
            (self.work / name).write_text(content)
        patch = git("diff", "--binary", cwd=self.work) + "\n"
        git("checkout", "--", ".", cwd=self.work)
        return patch

    def push_commit(self, name: str, content: str, message: str) -> str:
        """Commit on top of the current branch and push it to the bare repository; return the commit."""
        (self.work / name).write_text(content)
        git("add", name, cwd=self.work)
        git("commit", "-q", "-m", message, cwd=self.work)
        git("push", "-q", "origin", "HEAD:main", cwd=self.work)
        return git("rev-parse", "HEAD", cwd=self.work)


def make_repo(tmp: Path, source: Path = CART_APP) -> Repo:
    """Commit a copy of ``source`` and publish it as a bare repository under ``tmp``."""
    src = tmp / "author"
    shutil.copytree(source, src, ignore=shutil.ignore_patterns("__pycache__"))
    git("init", "-q", "-b", "main", cwd=src)
    git("add", "-A", cwd=src)
    git("commit", "-q", "-m", "sample app", cwd=src)
    bare = tmp / "remote.git"
    git("clone", "-q", "--bare", str(src), str(bare))
    git("remote", "add", "origin", str(bare), cwd=src)
    return Repo(bare=bare, work=src, base=git("rev-parse", "HEAD", cwd=src))


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    """The sample cart app published as a fresh bare repository (:func:`make_repo`)."""
    return make_repo(tmp_path / "repo")


def fixed_cart_source(repo: Repo) -> str:
    """``cart.py`` with the sample bug fixed (the total multiplies by quantity)."""
    source = (repo.work / "cart.py").read_text()
    fixed = source.replace("sum(item.unit_price_cents for item in items)", "sum(line_total(item) for item in items)")
    assert fixed != source, "the sample bug moved; update the test fixture"
    return fixed
