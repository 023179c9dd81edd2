"""Branch publication: a conditional git push, reconciled against the remote ref over REST.

Contract of `publish_branch(branch, commit_sha, expected_old, local_repo)`:

- The push is conditional: `--force-with-lease=refs/heads/B:<expected_old>` (empty value: the branch must
  not exist). The remote refuses if the branch is anywhere else, so a push never overwrites someone's work.
- Already at `commit_sha` before pushing: done, nothing is pushed.
- At neither `commit_sha` nor `expected_old`: `ForgeConflictError`, nothing is pushed.
- A push that fails without a clear refusal (connection reset, HTTP 5xx, timeout) is reconciled by reading
  the remote ref: at `commit_sha` -> done; still at `expected_old` (or absent when creating) -> the same
  conditional push is sent again (up to `push_attempts`); anywhere else -> `ForgeConflictError`.

The token reaches git only through the child's environment (`GIT_CONFIG_*` for an `http.<url>.extraHeader`
scoped to the forge URL); it is never written to `.git/config`, a command line, or a log line.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
from pathlib import Path

from reviews.config import ForgeConfig
from reviews.errors import ForgeAmbiguousError, ForgeConflictError, ForgePermanentError
from reviews.leased_push import leased_push
from reviews.models import PublishResult
from reviews.transport import Transport

_AUTH_FAILURE = re.compile(r"returned error: (401|403|404)|Authentication failed|could not read Username", re.I)
_NOT_CONNECTED = re.compile(r"Failed to connect|Could not resolve host|Connection refused", re.I)


def _git_env(config: ForgeConfig, token: str) -> dict[str, str]:
    """The environment of a git command talking to the forge with ``token`` (asked for right before it runs)."""
    credentials = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_CONFIG_")}
    env.update(
        {
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_CONFIG_COUNT": "2",
            "GIT_CONFIG_KEY_0": f"http.{config.git_url}.extraHeader",
            "GIT_CONFIG_VALUE_0": f"Authorization: Basic {credentials}",
            # An empty helper list stops git from asking any stored credential helper.
            "GIT_CONFIG_KEY_1": "credential.helper",
            "GIT_CONFIG_VALUE_1": "",
        }
    )
    return env


class Branches:
    def __init__(self, transport: Transport) -> None:
        self._t = transport
        self._config = transport.config

    def sha(self, branch: str) -> str | None:
        """The remote branch's commit, or None if the branch does not exist."""
        return self._t.read_if_found(
            f"read branch {branch}", lambda: self._t.repo.get_git_ref(f"heads/{branch}").object.sha
        )

    def list(self, prefix: str) -> list[str]:
        """Branch names starting with `prefix`."""
        refs = self._t.read_if_found(
            f"list branches {prefix}*", lambda: list(self._t.repo.get_git_matching_refs(f"heads/{prefix}"))
        )
        return [r.ref.removeprefix("refs/heads/") for r in refs or []]

    def publish(self, branch: str, commit_sha: str, expected_old: str | None, local_repo: Path) -> PublishResult:
        self._require_commit(local_repo, commit_sha)
        current = self.sha(branch)
        if current == commit_sha:
            return PublishResult(branch=branch, sha=commit_sha, status="already_current")
        if current != expected_old:
            raise ForgeConflictError(
                f"branch {branch} is at {current or 'nothing'}, expected {expected_old or 'nothing'}"
            )
        reconciled = False
        for _ in range(self._config.push_attempts):
            failure = self._push(branch, commit_sha, expected_old, local_repo)
            if failure is None:
                return PublishResult(branch=branch, sha=commit_sha, status="pushed", reconciled=reconciled)
            reconciled = True
            current = self.sha(branch)
            if current == commit_sha:
                return PublishResult(branch=branch, sha=commit_sha, status="pushed", reconciled=True)
            if current != expected_old:
                raise ForgeConflictError(
                    f"push of {branch} failed ({failure}); branch is now at {current or 'nothing'}, "
                    f"neither {commit_sha} nor {expected_old or 'absent'}"
                )
        raise ForgeAmbiguousError(
            f"push of {branch} failed {self._config.push_attempts} times; last: {failure}; remote unchanged"
        )

    def _push(self, branch: str, commit_sha: str, expected_old: str | None, local_repo: Path) -> str | None:
        """One conditional push. None on success; a description when the outcome needs a read of the remote.

        Raises for failures that a read cannot change: the lease refused (conflict), authentication
        (permanent), no connection at all (transient).
        """
        ref = f"refs/heads/{branch}"
        env = _git_env(self._config, self._t.git_token())
        timeout_s = self._config.push_timeout_s
        done = leased_push(
            self._config.git_url, commit_sha, ref, expected_old, cwd=local_repo, env=env, timeout_s=timeout_s
        )
        if done is None:
            return f"git push timed out after {timeout_s:.0f}s"
        if done.pushed:
            return None
        reason = done.rejection
        if reason is not None:
            if "stale info" in reason or "fetch first" in reason or "non-fast-forward" in reason:
                raise ForgeConflictError(f"push of {branch} refused: {reason}")
            if "declined" in reason:
                raise ForgePermanentError(f"push of {branch} refused by the forge: {reason}")
            # Other remote rejections (e.g. a failed ref lock under a concurrent update) are settled
            # by reading where the branch is now.
            return f"push rejected: {reason}"
        return done.failure(f"push of {branch}")

    @staticmethod
    def _require_commit(local_repo: Path, commit_sha: str) -> None:
        found = subprocess.run(
            ["git", "cat-file", "-e", f"{commit_sha}^{{commit}}"],
            cwd=local_repo,
            capture_output=True,
            check=False,
        )
        if found.returncode != 0:
            raise ForgePermanentError(f"commit {commit_sha} is not in {local_repo}")
