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

A workspace is different: untrusted code ran in it, and a repository's own ``.git/config`` (``[filter]``,
``[include]``, ``core.fsmonitor``, ``core.sshCommand``, ``diff.external``...), ``.git/info/attributes`` and
``.git/hooks`` are read by git *before* anything ``GIT_CONFIG_COUNT`` can switch off. So every host-side git
command on a workspace after untrusted code may have run goes through :func:`isolated_git`: a git directory of
the worker's own making, in a temporary directory outside the workspace, that borrows the workspace's objects
and names its commit explicitly. git then reads no configuration, attributes file, hook, ref or index of the
workspace's (the sandbox also sees the workspace's ``.git`` read-only, so those stay as the worker wrote them;
this is the second wall, for the unsandboxed mode and for what the first might miss).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from environments.interface import EnvironmentError
from environments.untrusted_files import UntrustedFileError, copy_beneath, read_beneath

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

# On top of CLEAN_CONFIG for commands on a workspace: no pager, no transport of any kind (a workspace command
# never talks to a remote), no ssh program, no untracked cache or split index read from anywhere.
WORKSPACE_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.pager", "cat"),
    ("core.sshCommand", "false"),
    ("protocol.allow", "never"),
    ("core.untrackedCache", "false"),
    ("core.splitIndex", "false"),
    ("core.symlinks", "true"),
    ("diff.noprefix", "false"),
)
_FULL_SHA = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


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
    config: Sequence[tuple[str, str]] = (),
) -> dict[str, str]:
    """The clean environment for one git child, with an optional scoped auth header.

    Only ``PATH``, ``LANG``, ``LC_ALL`` and ``TMPDIR`` are taken from the worker (no ``GIT_*`` variable of
    its own reaches git); no system or global configuration; ``HOME`` and ``XDG_CONFIG_HOME`` an empty
    directory; no system attributes file; :data:`CLEAN_CONFIG` on top of any repository configuration.
    ``config`` adds more such settings (:data:`WORKSPACE_CONFIG`). ``extra`` is added last (commit identities,
    ``GIT_INDEX_FILE``, ``GIT_DIR``, ...).
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
    config = [*CLEAN_CONFIG, *config]
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


class IsolatedGit:
    """git on a workspace's working tree through a git directory of the worker's own making (:func:`isolated_git`).

    ``env`` is the environment to pass to :func:`run_git` / :func:`run_git_bytes` (``GIT_DIR``,
    ``GIT_WORK_TREE`` and ``GIT_INDEX_FILE`` all point into the worker's directory, except the work tree);
    :meth:`run` does that with the working tree as ``cwd`` (git never discovers a repository when ``GIT_DIR`` is
    set, so the workspace's own ``.git`` is never opened as a repository)."""

    def __init__(self, work_tree: Path, git_dir: Path, index: Path, head: str) -> None:
        self.work_tree = work_tree
        self.git_dir = git_dir
        self.head = head
        self.env = git_env(
            extra={"GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(work_tree), "GIT_INDEX_FILE": str(index)},
            config=WORKSPACE_CONFIG,
        )

    def run(self, args: Sequence[str], *, stdin: str | None = None, timeout_s: float | None = 600.0) -> str:
        return run_git(args, cwd=self.work_tree, env=self.env, stdin=stdin, timeout_s=timeout_s)


@contextlib.contextmanager
def isolated_git(
    work_tree: Path, *, head: str | None = None, index_tree: str | None = None, objects: Sequence[Path] = ()
) -> Iterator[IsolatedGit]:
    """A git directory of the worker's own, for commands on ``work_tree`` (a workspace), for the block.

    The directory is a fresh bare repository under the worker's temporary directory: its configuration is
    git's defaults plus :data:`CLEAN_CONFIG` and :data:`WORKSPACE_CONFIG` (no filter, driver, include, hook,
    monitor, pager or transport is defined or reachable), no attributes or exclude file of its own, and
    ``objects/info/alternates`` naming the workspace's object directory (and ``objects``, e.g. a mirror's).
    ``head`` is the commit HEAD names (detached): the caller's own record, e.g. the commit the worker made;
    without it, the workspace's ``.git/HEAD`` is read as data (a full commit ID, nothing else is accepted).
    The index is ``index_tree`` read fresh when given; else a copy of the workspace's index file (a regular
    file, read with no link followed), else ``head``'s tree. Only the working tree itself (including any
    ``.gitattributes`` files in it, which name filters and drivers that no configuration here defines) is the
    workspace's. Nothing is left behind; the workspace's ``.git`` is never written.
    """
    work_tree = work_tree.absolute()
    if work_tree.is_symlink() or not work_tree.is_dir():
        raise GitError(["isolated"], 1, f"{work_tree} is not a directory")
    dot_git = work_tree / ".git"
    own_objects = dot_git / "objects"
    if dot_git.is_symlink() or own_objects.is_symlink() or not own_objects.is_dir():
        raise GitError(["isolated"], 1, f"{work_tree}: its .git is not a directory of objects (a link, or missing)")
    if head is None:
        try:
            said = read_beneath(work_tree, ".git/HEAD", max_bytes=200).decode("ascii", errors="replace").strip()
        except UntrustedFileError as exc:
            raise GitError(["isolated"], 1, f"{work_tree}: HEAD not read: {exc}") from None
        head = said
    if not _FULL_SHA.match(head):
        raise GitError(["isolated"], 1, f"{work_tree}: HEAD is not a full commit ID ({head[:60]!r})")
    tmp = Path(tempfile.mkdtemp(prefix="durafix-isolated-git-"))
    try:
        git_dir = tmp / "git"
        index = tmp / "index"
        run_git(["init", "--quiet", "--bare", "--template=", str(git_dir)], cwd=tmp)
        info = git_dir / "objects" / "info"
        info.mkdir(parents=True, exist_ok=True)
        borrowed = [own_objects.resolve(), *(Path(o).resolve() for o in objects)]
        (info / "alternates").write_text("".join(f"{o}\n" for o in borrowed), encoding="utf-8")
        bare = git_env(extra={"GIT_DIR": str(git_dir)}, config=WORKSPACE_CONFIG)
        run_git(["update-ref", "--no-deref", "HEAD", head], cwd=tmp, env=bare)
        iso = IsolatedGit(work_tree, git_dir, index, head)
        copied = False
        if index_tree is None:
            try:
                copy_beneath(work_tree, ".git/index", index, max_bytes=256 * 1024 * 1024)
                copied = True
            except UntrustedFileError:
                copied = False
        if not copied:
            run_git(["read-tree", index_tree or head], cwd=tmp, env=iso.env)
        yield iso
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
