"""Helpers shared by the forge tests: the git CLI without host config, PyGithub clients, the test team."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from github import Github, InputGitTreeElement
from github.Repository import Repository

from infra.forge.gitrepo import GitRepo
from infra.forge.testing import ForgeHandle
from infra.forge.testing import client as forge_client
from tests.support.served import QuietHandler, served

GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_AUTHOR_NAME": "Dev",
    "GIT_AUTHOR_EMAIL": "dev@example.com",
    "GIT_COMMITTER_NAME": "Dev",
    "GIT_COMMITTER_EMAIL": "dev@example.com",
}


def git(
    *args: str, cwd: Path | None = None, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the git CLI with no host configuration and no prompts (plus ``env``)."""
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=check,
        env={**os.environ, **GIT_ENV, **(env or {})},
        timeout=120,
    )


def client(handle: ForgeHandle, token: str) -> Github:
    return forge_client(handle.api_url, token)


@dataclass
class Team:
    """Three users on one forge: ``alice`` owns ``alice/shop`` (auto-initialised), ``bob`` may push to it."""

    forge: ForgeHandle
    alice: str
    bob: str
    carol: str

    def gh(self, token: str) -> Github:
        return client(self.forge, token)

    @property
    def shop(self) -> Repository:
        return self.gh(self.alice).get_repo("alice/shop")


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """A webhook endpoint on a free port that records every POST and answers ``status``."""

    url: str
    received: list[Received] = field(default_factory=list)
    status: int = 200
    lock: threading.Lock = field(default_factory=threading.Lock)

    def events(self) -> list[Received]:
        with self.lock:
            return list(self.received)


@contextmanager
def running_receiver(path: str = "/hook") -> Iterator[Receiver]:
    """A :class:`Receiver` served on a free port of 127.0.0.1 at ``path`` until the block ends."""
    state: dict[str, Receiver] = {}

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            rec = state["r"]
            with rec.lock:
                rec.received.append(Received(self.path, dict(self.headers.items()), body))
            self.answer(rec.status, b'{"ok": true}', ("Content-Type", "application/json"))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state["r"] = Receiver(f"http://127.0.0.1:{server.server_address[1]}{path}")
    with served(server):
        yield state["r"]


def commit_files(repo: Repository, parent: str, files: dict[str, str], message: str) -> str:
    """Commit ``files`` (path -> content) on top of commit ``parent`` through the REST git data API."""
    elements = [InputGitTreeElement(path, "100644", "blob", content=text) for path, text in files.items()]
    tree = repo.create_git_tree(elements, base_tree=repo.get_git_tree(parent))
    return repo.create_git_commit(message, tree, [repo.get_git_commit(parent)]).sha


def branch_with(repo: Repository, name: str, files: dict[str, str], base: str = "main") -> str:
    """Create branch ``name`` one commit ahead of ``base`` with ``files``; returns the new head SHA."""
    sha = commit_files(repo, repo.get_branch(base).commit.sha, files, f"change on {name}")
    repo.create_git_ref(f"refs/heads/{name}", sha)
    return sha


def push_lands_during_merge(monkeypatch: pytest.MonkeyPatch, bare: Path, pushed: str, main: str) -> list[bool]:
    """The next merge on the forge meets a push: ``main`` of the bare repository at ``bare`` moves from ``main``
    to ``pushed`` after the forge wrote the merge commit and before it moves the base by compare-and-swap,
    the race GitHub answers with 405 "Base branch was modified". The list returned is empty once it landed."""
    repo = GitRepo(bare)
    real_commit_tree = GitRepo.commit_tree
    armed = [True]

    def commit_tree_then_push(self: GitRepo, *args: Any, **kwargs: Any) -> str:
        sha = real_commit_tree(self, *args, **kwargs)
        if armed and armed.pop():
            assert repo.update_ref("refs/heads/main", pushed, main)
        return sha

    monkeypatch.setattr(GitRepo, "commit_tree", commit_tree_then_push)
    return armed
