"""Patches: taking one from a workspace, and deciding whether one may be applied.

Both work through a throwaway index file (``GIT_INDEX_FILE``) loaded from the base revision, so neither
touches the repository's own index or working tree: taking a patch leaves the workspace as the model left
it, and checking one works on a dirty tree as well as on a clean one.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, Field

DEFAULT_MAX_PATCH_BYTES = 256 * 1024

# Force a/ b/ prefixes and plain output whatever the user's git configuration says.
_DIFF_OPTIONS = [
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--no-renames",
    "--no-relative",
    "--src-prefix=a/",
    "--dst-prefix=b/",
]
_LINK_OR_SUBMODULE = re.compile(r"^(?:new file mode|new mode) (120000|160000)$", re.MULTILINE)


class PatchCheck(BaseModel):
    """Whether a patch may be applied; ``reasons`` says why not."""

    ok: bool
    reasons: list[str] = Field(default_factory=list)
    files: list[str] = Field(default_factory=list)
    size_bytes: int


def _git(repo: Path, *args: str, env: dict[str, str] | None = None, stdin: bytes | None = None) -> bytes:
    done = subprocess.run(["git", *args], cwd=repo, env=env, input=stdin, capture_output=True, check=False, timeout=120)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, ["git", *args], done.stdout, done.stderr)
    return done.stdout


@contextmanager
def _scratch_index(repo: Path, base: str) -> Iterator[dict[str, str]]:
    """An environment whose git commands use a fresh index holding ``base``'s tree."""
    with tempfile.TemporaryDirectory(prefix="durafix-index-") as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git(repo, "read-tree", base, env=env)
        yield env


def workspace_patch(workspace: Path, base: str = "HEAD") -> tuple[str, list[str]]:
    """The workspace's changes against ``base`` as a unified diff (new files included), and the paths changed.

    Files ignored by ``.gitignore`` are left out. Binary changes appear as git's ``Binary files ... differ``
    line, which :func:`validate_patch` refuses.
    """
    with _scratch_index(workspace, base) as env:
        _git(workspace, "add", "--all", "--", ".", env=env)
        patch = _git(workspace, "diff", "--cached", *_DIFF_OPTIONS, base, "--", env=env)
        names = _git(workspace, "diff", "--cached", "--name-only", "-z", "--no-renames", base, "--", env=env)
    return patch.decode("utf-8"), [n for n in names.decode("utf-8").split("\0") if n]


def _path_problem(path: str) -> str | None:
    pure = PurePosixPath(path)
    if not path or pure.is_absolute():
        return f"{path!r}: absolute or empty path"
    if ".." in pure.parts:
        return f"{path!r}: escapes the repository"
    if any(part.lower() == ".git" for part in pure.parts):
        return f"{path!r}: touches .git"
    return None


def _touched_paths(numstat: bytes) -> tuple[list[str], bool]:
    """The paths a patch writes, as ``git apply --numstat -z`` reads them, and whether any change is binary.

    For a rename or copy git names only the destination; the source must exist in the base tree, which no
    git tree lets hold an absolute, ``..`` or ``.git`` path, so ``git apply --check`` refuses a bad source.
    """
    paths: list[str] = []
    binary = False
    for entry in numstat.decode("utf-8", errors="replace").split("\0"):
        if entry:
            added, _deleted, path = entry.split("\t", 2)
            binary = binary or added == "-"
            paths.append(path)
    return paths, binary


def validate_patch(repo: Path, patch: str, max_bytes: int = DEFAULT_MAX_PATCH_BYTES, base: str = "HEAD") -> PatchCheck:
    """Check ``patch`` before anyone applies it to ``repo`` at ``base``.

    Refused, each with a reason: an empty patch, one larger than ``max_bytes``, binary content, a symlink or
    submodule entry, a path that is absolute, contains ``..`` or lies in ``.git``, text that is not a patch,
    and a patch that does not apply cleanly (``git apply --check``) to ``base``'s tree.
    """
    data = patch.encode("utf-8")
    if not patch.strip():
        return PatchCheck(ok=False, reasons=["patch is empty"], size_bytes=len(data))
    reasons: list[str] = []
    if len(data) > max_bytes:
        reasons.append(f"patch is {len(data)} bytes; the limit is {max_bytes}")
    if "\0" in patch or re.search(r"^(GIT binary patch|Binary files .* differ)$", patch, re.MULTILINE):
        reasons.append("patch carries binary content")
    if _LINK_OR_SUBMODULE.search(patch):
        reasons.append("patch creates a symlink or submodule")
    try:
        numstat = _git(repo, "apply", "--numstat", "-z", stdin=data)
    except subprocess.CalledProcessError as e:
        reasons.append(f"not a valid patch: {e.stderr.decode('utf-8', errors='replace').strip()}")
        return PatchCheck(ok=False, reasons=reasons, size_bytes=len(data))
    files, binary = _touched_paths(numstat)
    if binary and "patch carries binary content" not in reasons:
        reasons.append("patch carries binary content")
    reasons += [problem for p in files if (problem := _path_problem(p))]
    if not reasons:
        with _scratch_index(repo, base) as env:
            try:
                _git(repo, "apply", "--cached", "--check", env=env, stdin=data)
            except subprocess.CalledProcessError as e:
                detail = e.stderr.decode("utf-8", errors="replace").strip()
                reasons.append(f"does not apply to {base}: {detail}")
    return PatchCheck(ok=not reasons, reasons=reasons, files=files, size_bytes=len(data))
