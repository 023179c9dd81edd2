"""A real forge (the project's GitHub emulator over HTTP and git smart HTTP) with a repository to work on.

Each test gets a fresh forge on a free port (stopped at teardown), a bot user owning `bot/shop`, a local
clone to commit in, an open bug issue, and a `GitHubForge` on unmodified PyGithub pointed at all of it.
"""

from __future__ import annotations

import base64
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from github import Github
from github.Repository import Repository

from infra.forge.pytest_plugin import forge
from infra.forge.testing import ForgeHandle
from infra.forge.testing import client as forge_client
from reviews.adapter import GitHubForge
from reviews.config import ForgeConfig

__all__ = ["Site", "forge", "git", "site"]

T = TypeVar("T")

GIT_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_AUTHOR_NAME": "Test Author",
    "GIT_AUTHOR_EMAIL": "author@example.com",
    "GIT_COMMITTER_NAME": "Test Author",
    "GIT_COMMITTER_EMAIL": "author@example.com",
}


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {done.stderr}")
    return done.stdout.strip()


def auth_header(token: str) -> str:
    return "Authorization: Basic " + base64.b64encode(f"x-access-token:{token}".encode()).decode()


def clone(git_url: str, token: str, target: Path) -> Path:
    """Clone with the token passed for this command only, so the clone's config holds no secret."""
    git(target.parent, "-c", f"http.extraHeader={auth_header(token)}", "clone", "-q", git_url, str(target))
    return target


def make_config(handle: ForgeHandle, token: str, full_name: str, git_url: str, **overrides: Any) -> ForgeConfig:
    """Test settings: no spacing between writes and short pauses, so tests spend their time on behaviour."""
    settings: dict[str, Any] = {
        "api_url": handle.api_url,
        "token": token,
        "repository": full_name,
        "git_url": git_url,
        "seconds_between_writes": 0.0,
        "retry_backoff_s": 0.05,
        "claim_poll_s": 0.1,
        "merge_retry_wait_s": 0.05,
        "mergeable_poll_s": 0.05,
    }
    settings.update(overrides)
    return ForgeConfig(**settings)


@dataclass
class Site:
    handle: ForgeHandle
    token: str
    full_name: str
    git_url: str
    workdir: Path
    issue: int
    adapter: GitHubForge
    tmp: Path

    def config(self, **overrides: Any) -> ForgeConfig:
        token = overrides.pop("token", self.token)
        return make_config(self.handle, token, self.full_name, self.git_url, **overrides)

    def new_adapter(self, **overrides: Any) -> GitHubForge:
        return GitHubForge(self.config(**overrides))

    def race(self, count: int, call: Callable[[GitHubForge], T]) -> list[T]:
        """``call`` on ``count`` fresh adapters, released at once by a barrier; their results in order."""
        adapters = [self.new_adapter() for _ in range(count)]
        start = threading.Barrier(count)

        def run(adapter: GitHubForge) -> T:
            start.wait()
            return call(adapter)

        with ThreadPoolExecutor(count) as pool:
            return list(pool.map(run, adapters))

    def github(self, token: str | None = None) -> Github:
        """A plain PyGithub client, for the test's own view of GitHub's state."""
        return forge_client(self.handle.api_url, token or self.token)

    def repo(self, token: str | None = None) -> Repository:
        return self.github(token).get_repo(self.full_name)

    def commit(self, path: str, content: str, *, parent: str = "main", into: Path | None = None) -> str:
        """A new local commit on top of `parent` (not on any local branch); returns its sha."""
        cwd = into or self.workdir
        git(cwd, "checkout", "-q", "--detach", parent)
        (cwd / path).write_text(content)
        git(cwd, "add", path)
        git(cwd, "commit", "-q", "-m", f"change {path}")
        return git(cwd, "rev-parse", "HEAD")

    def clone(self, name: str, token: str | None = None) -> Path:
        return clone(self.git_url, token or self.token, self.tmp / name)

    def push_as_someone_else(self, clone: Path, sha: str, branch: str) -> None:
        git(
            clone,
            "-c",
            f"http.extraHeader={auth_header(self.token)}",
            "push",
            "-q",
            "--force",
            self.git_url,
            f"{sha}:refs/heads/{branch}",
        )

    def marked_comments(self, number: int, needle: str) -> list[int]:
        return [c.id for c in self.repo().get_issue(number).get_comments() if needle in (c.body or "")]

    def fault(self, method: str, path_regex: str, action: str, **fields: Any) -> None:
        self.handle.set_faults({"method": method, "path_regex": path_regex, "action": action, **fields})


@pytest.fixture
def site(forge: ForgeHandle, tmp_path: Path) -> Iterator[Site]:
    token = forge.create_user("bot")
    repo = forge.create_repo(token, "shop")
    full_name = str(repo["full_name"])
    git_url = forge.clone_url(full_name)
    work = tmp_path / "work"
    work.mkdir()
    workdir = clone(git_url, token, work / "shop")
    adapter = GitHubForge(make_config(forge, token, full_name, git_url))
    issue = adapter.create_issue("Cart total is wrong", "Adding two items shows the price of one.")
    site = Site(forge, token, full_name, git_url, workdir, issue, adapter, work)
    try:
        yield site
    finally:
        site.adapter.close()
