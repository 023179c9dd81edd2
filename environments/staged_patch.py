"""A patch as git sees it: applied to a scratch index, then read back from that index.

Whatever spelling a patch uses for a mode (``new file mode 120000 `` with a trailing space, ``120000\\r``,
``0120000``), git's own parser decides what it means; reading the result back from the index with ``git
diff --cached --raw --numstat`` gives the mode, blob and line counts git will really write. So every
decision about a patch (:func:`unsafe_changes` here, the operator's patch policy in ``repair``) is made
on that read-back, never on the patch text.

The scratch repository is a fresh bare git directory in a temporary directory, borrowing the objects of
the repository it checks through ``objects/info/alternates``: nothing is written into that repository
(``git apply --cached`` stores the patch's blobs in the scratch directory), its configuration, hooks and
attributes files are never read, and every command runs in the clean git environment of
:func:`environments.git.git_env`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from environments.git import git_env, run_git_bytes

SYMLINK_MODE = "120000"
GITLINK_MODE = "160000"
REGULAR_MODES = frozenset({"100644", "100755"})
ABSENT_MODE = "000000"
_READ_BACK = (
    "diff",
    "--cached",
    "--raw",
    "--numstat",
    "-z",
    "--no-renames",
    "--no-abbrev",
    "--no-ext-diff",
    "--no-textconv",
)


@dataclass(frozen=True)
class FileChange:
    """One path the patch changes, as the scratch index holds it after ``git apply --cached``.

    ``status`` is git's letter (``A`` added, ``M`` modified, ``D`` deleted, ``T`` type changed; renames are
    reported as a deletion plus an addition). Modes are git's six octal digits, ``000000`` for a side that
    does not exist; blobs are full object IDs (all zeros for a missing side). ``added`` / ``deleted`` are
    line counts, ``None`` for a binary change.
    """

    path: str
    status: str
    old_mode: str
    new_mode: str
    old_blob: str
    new_blob: str
    added: int | None
    deleted: int | None

    @property
    def binary(self) -> bool:
        return self.added is None


@dataclass(frozen=True)
class StagedPatch:
    """The read-back of an applied patch; :meth:`read_blob` works only inside :func:`staged_patch`."""

    changes: list[FileChange]
    tree: str
    _env: dict[str, str]

    def read_blob(self, blob: str) -> bytes:
        """The content of ``blob`` (from the base's objects or the patch's)."""
        return _git(["cat-file", "blob", blob], self._env)


def objects_of(repo: Path) -> Path:
    """The object directory of ``repo``: a working tree's ``.git/objects`` or a bare repository's ``objects``."""
    for candidate in (repo / ".git" / "objects", repo / "objects"):
        if candidate.is_dir():
            return candidate.absolute()
    raise FileNotFoundError(f"{repo} is not a git repository with its own object directory")


@contextmanager
def staged_patch(objects: Path, base: str, patch: bytes) -> Iterator[StagedPatch]:
    """Apply ``patch`` to a scratch index holding ``base``'s tree (objects from ``objects``); read it back.

    Raises :class:`environments.git.GitError` when ``base`` is unknown or the patch does not apply (git's
    own explanation in ``stderr``). Nothing outside a temporary directory is written.
    """
    with tempfile.TemporaryDirectory(prefix="durafix-stage-") as tmp:
        git_dir = Path(tmp) / "scratch.git"
        _git(["init", "--quiet", "--bare", "--template=", str(git_dir)], git_env())
        info = git_dir / "objects" / "info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "alternates").write_text(f"{objects.absolute()}\n", encoding="utf-8")
        env = git_env(extra={"GIT_DIR": str(git_dir), "GIT_INDEX_FILE": str(Path(tmp) / "index")})
        _git(["read-tree", base], env)
        _git(["apply", "--cached", "-"], env, stdin=patch)
        read_back = _git([*_READ_BACK, base, "--"], env)
        tree = _git(["write-tree"], env).decode().strip()
        yield StagedPatch(changes=parse_raw_numstat(read_back), tree=tree, _env=env)


def parse_raw_numstat(out: bytes) -> list[FileChange]:
    """Parse ``git diff --raw --numstat -z --no-renames`` output.

    With ``-z`` every raw record is a header (``:old new old_blob new_blob status``) and a path, each
    terminated by NUL; the numstat records that follow are ``added<TAB>deleted<TAB>path`` (``-`` counts for
    binary). A numstat record starts with a digit or ``-``, never with ``:``, so the two never mix up.
    """
    tokens = out.split(b"\0")
    raw: list[tuple[list[str], str]] = []
    counts: dict[str, tuple[int | None, int | None]] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i].decode("utf-8", errors="replace")
        if not token:
            i += 1
        elif token.startswith(":"):
            raw.append((token[1:].split(), tokens[i + 1].decode("utf-8", errors="replace")))
            i += 2
        else:
            plus, minus, path = token.split("\t", 2)
            counts[path] = (None if plus == "-" else int(plus), None if minus == "-" else int(minus))
            i += 1
    changes = []
    for (old_mode, new_mode, old_blob, new_blob, status), path in raw:
        added, deleted = counts.get(path, (0, 0))
        changes.append(FileChange(path, status[0], old_mode, new_mode, old_blob, new_blob, added, deleted))
    return changes


def path_problem(path: str) -> str | None:
    """Why ``path`` may never be written by a patch (absolute, empty, ``..``, inside ``.git``), or ``None``."""
    pure = PurePosixPath(path)
    if not path or pure.is_absolute():
        return f"{path!r}: absolute or empty path"
    if ".." in pure.parts:
        return f"{path!r}: escapes the repository"
    if any(part.lower() == ".git" for part in pure.parts):
        return f"{path!r}: touches .git"
    return None


def unsafe_changes(changes: Sequence[FileChange]) -> list[str]:
    """Reasons no configuration can waive, one per offending path: a symbolic link written, a submodule
    (gitlink) added, changed or removed, a mode change other than the executable bit (``100644`` <->
    ``100755``), a path outside the tree or inside ``.git``. Deleting an existing symlink is allowed."""
    reasons = []
    for change in changes:
        if problem := path_problem(change.path):
            reasons.append(problem)
        elif change.new_mode == SYMLINK_MODE:
            verb = "adds" if change.status == "A" else "writes"
            reasons.append(f"{change.path}: {verb} a symbolic link (mode {SYMLINK_MODE}); symlinks are never applied")
        elif GITLINK_MODE in (change.old_mode, change.new_mode):
            reasons.append(f"{change.path}: changes a submodule (mode {GITLINK_MODE}); submodules are never applied")
        elif ABSENT_MODE not in (change.old_mode, change.new_mode) and change.old_mode != change.new_mode:
            if {change.old_mode, change.new_mode} != REGULAR_MODES:
                reasons.append(
                    f"{change.path}: changes mode {change.old_mode} -> {change.new_mode}; "
                    "only the executable bit may change"
                )
        elif change.new_mode not in (ABSENT_MODE, *REGULAR_MODES):
            reasons.append(f"{change.path}: unexpected mode {change.new_mode}")
    return reasons


def _git(args: Sequence[str], env: dict[str, str], stdin: bytes | None = None) -> bytes:
    return run_git_bytes(args, env=env, stdin=stdin)
