"""Running git with a controlled configuration and an in-memory credential.

Every git command runs with the system and global configuration switched off, so a worker's own settings
(``core.autocrlf``, ``commit.gpgsign``, hooks paths, ...) can never change a tree or commit hash. A token is
handed to git as an ``http.<url>.extraHeader`` through ``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_n``/
``GIT_CONFIG_VALUE_n`` environment variables: it lives only in the git child's environment, is scoped to the
clone URL, and is never written into any repository's configuration.
"""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from environments.interface import EnvironmentError

_PASSED_THROUGH = ("PATH", "LANG", "LC_ALL", "TMPDIR")


class GitError(EnvironmentError):
    """A git command failed; ``stderr`` holds git's own explanation."""

    def __init__(self, args: Sequence[str], returncode: int, stderr: str) -> None:
        self.args_run = list(args)
        self.returncode = returncode
        self.stderr = stderr.strip()
        super().__init__(f"git {' '.join(self.args_run)} failed ({returncode}): {self.stderr}")


def check_clone_url(clone_url: str) -> None:
    """Refuse clone URLs carrying credentials: git would store them in the mirror's configuration."""
    parts = urlsplit(clone_url)
    if parts.username is not None or parts.password is not None:
        raise ValueError("clone URL must not embed credentials; pass the token separately")


def git_env(
    *,
    clone_url: str | None = None,
    token: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment for one git child: isolated configuration, optional scoped auth header."""
    env = {name: os.environ[name] for name in _PASSED_THROUGH if name in os.environ}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_TERMINAL_PROMPT="0",
        HOME=os.environ.get("HOME", "/"),
    )
    # Workspaces borrow the mirror's objects through alternates; never pruning keeps every commit a
    # workspace may still stand on, even after a force-push made it unreachable in the mirror.
    config: list[tuple[str, str]] = [("gc.pruneExpire", "never")]
    if token is not None:
        if clone_url is None:
            raise ValueError("a token needs the clone URL it is scoped to")
        basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
        config.append((f"http.{clone_url}.extraHeader", f"Authorization: Basic {basic}"))
    env["GIT_CONFIG_COUNT"] = str(len(config))
    for i, (key, value) in enumerate(config):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    if extra:
        env.update(extra)
    return env


def run_git(
    args: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    timeout_s: float | None = 600.0,
) -> str:
    """Run ``git *args`` and return its stdout (stripped of the final newline); raise :class:`GitError`."""
    proc = subprocess.run(
        ["git", *args],
        cwd=cwd,
        env=dict(env) if env is not None else git_env(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if proc.returncode != 0:
        raise GitError(args, proc.returncode, proc.stderr)
    return proc.stdout.rstrip("\n")


def has_commit(repo: Path, revision: str) -> bool:
    """Whether ``repo`` (or its alternates) holds the commit ``revision``."""
    proc = subprocess.run(
        ["git", "cat-file", "-e", f"{revision}^{{commit}}"],
        cwd=repo,
        env=git_env(),
        capture_output=True,
        check=False,
    )
    return proc.returncode == 0
