"""Running git with a controlled configuration and an in-memory credential.

Every git command runs in a clean git environment (:func:`git_env`): the system and global configuration
switched off and ``HOME`` / ``XDG_CONFIG_HOME`` an empty directory, so a worker's own settings
(``core.autocrlf``, ``commit.gpgsign``, hooks paths, a global attributes file, ...) can never change a tree
or commit hash; hooks switched off (``core.hooksPath=/dev/null``) and no file-system monitor, so git runs no
program of anyone's choosing. Filters and diff/merge drivers named by a ``.gitattributes`` (a patch may add
one) need a ``filter.<name>`` / ``diff.<name>`` / ``merge.<name>`` section in the configuration, and no
configuration git reads here defines one, so none runs. A token is
handed to git as an ``http.<url>.extraHeader`` through ``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_n``/
``GIT_CONFIG_VALUE_n`` environment variables: it lives only in the git child's environment, is scoped to the
clone URL, and is never written into any repository's configuration.
"""

from __future__ import annotations

import atexit
import base64
import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from environments.interface import EnvironmentError

_PASSED_THROUGH = ("PATH", "LANG", "LC_ALL", "TMPDIR")

# Set through GIT_CONFIG_COUNT, which outranks every configuration file, a repository's own included: a
# repository whose ``.git/config`` untrusted code could have written still runs no hook and no monitor.
CLEAN_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", os.devnull),
    ("core.fsmonitor", "false"),
    ("core.attributesFile", os.devnull),
    ("core.excludesFile", os.devnull),
    # Workspaces borrow the mirror's objects through alternates; never pruning keeps every commit a
    # workspace may still stand on, even after a force-push made it unreachable in the mirror.
    ("gc.pruneExpire", "never"),
)


class GitError(EnvironmentError):
    """A git command failed; ``stderr`` holds git's own explanation.

    Raised as is for failures that are not about a remote (a corrupt repository, a bad argument, a held lock).
    Failures talking to a remote raise a subclass, so a caller can tell them apart without reading stderr:
    :class:`GitProtocolError` when the remote answered and will answer the same again, and
    :class:`GitTransportError` when the exchange broke off. ``http_status`` is the HTTP status git reported
    for the remote's answer, when it reported one.
    """

    def __init__(self, args: Sequence[str], returncode: int, stderr: str, http_status: int | None = None) -> None:
        self.args_run = list(args)
        self.returncode = returncode
        self.stderr = stderr.strip()
        self.http_status = http_status
        super().__init__(f"git {' '.join(self.args_run)} failed ({returncode}): {self.stderr}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args_run, self.returncode, self.stderr, self.http_status))


class GitProtocolError(GitError):
    """The remote answered, and the answer is final for this request: running it again fails the same way.

    Examples: authentication or authorisation refused (HTTP 401/403), no such repository (404), a wanted
    object the server will not serve ("not our ref"), a ref it does not have, a "fatal: protocol error".
    Retrying needs something to change first (credentials, the URL, the remote's refs).
    """


class GitTransportError(GitError):
    """The exchange with the remote broke off or the remote was unavailable; the same command may succeed later.

    Examples: connection refused or reset, a name that does not resolve, timeouts, an empty reply or a
    connection closed mid-pack (curl errors, "early EOF", "the remote end hung up unexpectedly"), HTTP 5xx,
    408 and 429.
    """


class GitInterrupted(EnvironmentError):
    """git was killed by a signal (a negative ``returncode``): the OOM killer, an operator, a process-tree kill.

    It says nothing about the repository, the patch or the remote, and the same command may succeed when run
    again. It is deliberately not a :class:`GitError`: every handler that turns a git failure into a verdict (a
    patch that does not apply, no common history) or a fallback catches ``GitError``, and a killed git is neither;
    it reaches the step, whose failure class retries it.
    """

    def __init__(self, args: Sequence[str], returncode: int) -> None:
        self.args_run = list(args)
        self.returncode = returncode
        super().__init__(f"git {' '.join(self.args_run)} was killed by signal {-returncode}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args_run, self.returncode))


# "The requested URL returned error: 403" (curl 22) and "RPC failed; HTTP 403" both carry the status.
_HTTP_STATUS = re.compile(r"returned error: (\d{3})|RPC failed; HTTP (\d{3})")
_TRANSIENT_STATUSES = frozenset({408, 429})
# Statements the remote made about the request itself: checked before the transport symptoms, which a
# remote refusing a request often prints as well ("the remote end hung up unexpectedly" after an error).
_REFUSED = re.compile(
    r"not our ref|Repository not found|repository '[^']*' not found|does not appear to be a git repository"
    r"|Authentication failed|could not read (Username|Password)|Permission to \S+ denied"
    r"|couldn't find remote ref|remote error:",
    re.IGNORECASE,
)
_BROKEN_OFF = re.compile(
    r"RPC failed|\bcurl \d+\b|Empty reply from server|early EOF|remote end hung up unexpectedly"
    r"|unexpected disconnect|transfer closed|Could not resolve (host|proxy)|Failed to connect"
    r"|Couldn't connect to server|Connection (refused|reset|timed out)|Operation timed out|timed out"
    r"|Recv failure|Send failure|\bSSL\b|\bTLS\b|gnutls",
    re.IGNORECASE,
)
# Checked last: a transfer that broke off mid-stream also makes git report the garbled stream this way.
_PROTOCOL = re.compile(r"protocol error", re.IGNORECASE)


def classify_failure(stderr: str) -> tuple[type[GitError], int | None]:
    """Which :class:`GitError` class git's ``stderr`` describes, and the HTTP status it reports (if any).

    Order matters: a reported HTTP status decides (4xx other than 408/429: the answer is final; 5xx, 408,
    429: transient); then what the remote said about the request (refused, not found, not our ref); then
    symptoms of a broken transfer; then a protocol error. Anything else is a local failure: ``GitError``.
    """
    status_match = _HTTP_STATUS.search(stderr)
    status = int(next(g for g in status_match.groups() if g)) if status_match else None
    if status is not None and 400 <= status < 600:
        if status >= 500 or status in _TRANSIENT_STATUSES:
            return GitTransportError, status
        return GitProtocolError, status
    if _REFUSED.search(stderr):
        return GitProtocolError, status
    if _BROKEN_OFF.search(stderr):
        return GitTransportError, status
    if _PROTOCOL.search(stderr):
        return GitProtocolError, status
    return GitError, status


def git_error(args: Sequence[str], returncode: int, stderr: str) -> GitError | GitInterrupted:
    """The :class:`GitError` (or subclass, see :func:`classify_failure`) for a failed ``git *args``;
    :class:`GitInterrupted` when a signal ended it."""
    if returncode < 0:
        return GitInterrupted(args, returncode)
    cls, status = classify_failure(stderr)
    return cls(args, returncode, stderr, status)


def check_clone_url(clone_url: str) -> None:
    """Refuse clone URLs carrying credentials: git would store them in the mirror's configuration."""
    parts = urlsplit(clone_url)
    if parts.username is not None or parts.password is not None:
        raise ValueError("clone URL must not embed credentials; pass the token separately")


@functools.cache
def empty_home() -> str:
    """An empty directory private to this process (mode 0700), git's ``HOME`` and ``XDG_CONFIG_HOME``.

    Nothing git would read from a home directory (``~/.gitconfig``, ``~/.config/git/attributes``,
    ``~/.config/git/ignore``, credentials) exists there.
    """
    home = tempfile.mkdtemp(prefix="durafix-git-home-")
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    return home


def git_env(
    *,
    clone_url: str | None = None,
    token: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The clean environment for one git child, with an optional scoped auth header.

    Only ``PATH``, ``LANG``, ``LC_ALL`` and ``TMPDIR`` are taken from the worker (no ``GIT_*`` variable of
    its own reaches git); no system or global configuration; ``HOME`` and ``XDG_CONFIG_HOME`` an empty
    directory; no system attributes file; :data:`CLEAN_CONFIG` on top of any repository configuration.
    ``extra`` is added last (commit identities, ``GIT_INDEX_FILE``, ``GIT_DIR``, ...).
    """
    env = {name: os.environ[name] for name in _PASSED_THROUGH if name in os.environ}
    home = empty_home()
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_ATTR_NOSYSTEM="1",
        GIT_TERMINAL_PROMPT="0",
        HOME=home,
        XDG_CONFIG_HOME=home,
    )
    config = list(CLEAN_CONFIG)
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
    """Run ``git *args`` and return its stdout (stripped of the final newline).

    Raises :class:`GitError`, or its :class:`GitProtocolError` / :class:`GitTransportError` subclass when the
    failure was talking to a remote (see :func:`classify_failure`).
    """
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
        raise git_error(args, proc.returncode, proc.stderr)
    return proc.stdout.rstrip("\n")


def run_git_bytes(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path | None = None,
    stdin: bytes | None = None,
    timeout_s: float | None = 120.0,
) -> bytes:
    """:func:`run_git` for binary input and output (``-z`` listings, blobs, patches): stdout as git wrote it."""
    proc = subprocess.run(
        ["git", *args], cwd=cwd, env=dict(env), input=stdin, capture_output=True, timeout=timeout_s, check=False
    )
    if proc.returncode != 0:
        raise git_error(args, proc.returncode, proc.stderr.decode("utf-8", errors="replace"))
    return proc.stdout


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
