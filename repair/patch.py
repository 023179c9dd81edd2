"""Patches: taking one from a workspace, and deciding whether one may be applied.

Both run git in the clean git environment (:func:`environments.git.git_env`) against a throwaway git
directory that borrows the repository's objects, with a throwaway index: neither reads the workspace's own
``.git/config``, hooks or info files (code the model ran may have written them), and neither touches the
repository's own index or working tree. Taking a patch leaves the workspace as the model left it; checking
one works on a dirty tree as well as on a clean one, and on a bare mirror.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from environments.git import GitError, empty_home, git_env, run_git_bytes
from environments.staged_patch import objects_of, path_problem, staged_patch
from repair.patch_policy import DEFAULT_MAX_PATCH_BYTES, PatchPolicy, policy_violations

__all__ = ["DEFAULT_MAX_PATCH_BYTES", "PatchCheck", "validate_patch", "workspace_patch"]

# Force a/ b/ prefixes and plain output whatever a configuration says.
_DIFF_OPTIONS = [
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--no-renames",
    "--no-relative",
    "--src-prefix=a/",
    "--dst-prefix=b/",
]
_BINARY = "patch carries binary content"
_FULL_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


class PatchCheck(BaseModel):
    """Whether a patch may be applied; ``reasons`` says why not, each naming the path it is about."""

    ok: bool
    reasons: list[str] = Field(default_factory=list)
    files: list[str] = Field(default_factory=list)
    size_bytes: int


def _git(args: Sequence[str], env: dict[str, str], cwd: Path | None = None, stdin: bytes | None = None) -> bytes:
    return run_git_bytes(args, env=env, cwd=cwd, stdin=stdin)


def _outside_any_repository() -> tuple[dict[str, str], Path]:
    """An environment and a directory in which git finds no repository at all (for ``git apply --numstat``)."""
    home = Path(empty_home())
    return git_env(extra={"GIT_CEILING_DIRECTORIES": str(home.parent)}), home


def workspace_patch(workspace: Path, base: str = "HEAD") -> tuple[str, list[str]]:
    """The workspace's changes against ``base`` as a unified diff (new files included), and the paths changed.

    Files ignored by ``.gitignore`` are left out. Binary changes appear as git's ``Binary files ... differ``
    line, which :func:`validate_patch` refuses. ``base`` is resolved in the workspace's repository.
    """
    revision = _resolve(workspace, base)
    with tempfile.TemporaryDirectory(prefix="durafix-take-") as tmp:
        git_dir = Path(tmp) / "scratch.git"
        _git(["init", "--quiet", "--bare", "--template=", str(git_dir)], git_env())
        (git_dir / "objects" / "info").mkdir(parents=True, exist_ok=True)
        (git_dir / "objects" / "info" / "alternates").write_text(f"{objects_of(workspace)}\n", encoding="utf-8")
        env = git_env(
            extra={
                "GIT_DIR": str(git_dir),
                "GIT_WORK_TREE": str(workspace.absolute()),
                "GIT_INDEX_FILE": str(Path(tmp) / "index"),
            }
        )
        _git(["read-tree", revision], env, cwd=workspace)
        _git(["add", "--all", "--", "."], env, cwd=workspace)
        patch = _git(["diff", "--cached", *_DIFF_OPTIONS, revision, "--"], env, cwd=workspace)
        names = _git(["diff", "--cached", "--name-only", "-z", "--no-renames", revision, "--"], env, cwd=workspace)
    return patch.decode("utf-8"), [n for n in names.decode("utf-8").split("\0") if n]


def _resolve(repo: Path, revision: str) -> str:
    """The commit ID ``revision`` names in ``repo``: a full commit ID as it is; anything else (``HEAD``) is
    read by ``git rev-parse`` in ``repo``, the clean environment's overrides on top of its configuration."""
    if _FULL_SHA.fullmatch(revision):
        return revision
    env = git_env(extra={"GIT_DIR": str(objects_of(repo).parent)})
    return _git(["rev-parse", "--verify", "--end-of-options", f"{revision}^{{commit}}"], env).decode().strip()


def _patch_paths(data: bytes) -> tuple[list[str], bool]:
    """The paths a patch writes, as ``git apply --numstat -z`` parses them, and whether any change is binary.

    Raises :class:`GitError` for text git does not read as a patch.
    """
    env, cwd = _outside_any_repository()
    numstat = _git(["apply", "--numstat", "-z", "-"], env, cwd=cwd, stdin=data)
    paths: list[str] = []
    binary = False
    for entry in numstat.decode("utf-8", errors="replace").split("\0"):
        if entry:
            added, _deleted, path = entry.split("\t", 2)
            binary = binary or added == "-"
            paths.append(path)
    return paths, binary


def validate_patch(
    repo: Path,
    patch: str,
    max_bytes: int | None = None,
    base: str = "HEAD",
    policy: PatchPolicy | None = None,
) -> PatchCheck:
    """Check ``patch`` before anyone applies it to ``repo`` (a working tree or a bare mirror) at ``base``.

    Refused, each with a reason: an empty patch, one larger than ``max_bytes`` (default: the policy's),
    text that is not a patch, a path that is absolute, contains ``..`` or lies in ``.git``, a patch that
    does not apply cleanly to ``base``'s tree, binary content, and whatever the operator's ``policy``
    (default :class:`PatchPolicy()`, the safe defaults) refuses on the patch as git applied it to a scratch
    index: symlinks, submodules, mode changes, protected paths, deleted or weakened tests
    (:func:`repair.patch_policy.policy_violations`).
    """
    policy = policy or PatchPolicy()
    limit = max_bytes if max_bytes is not None else policy.max_bytes
    data = patch.encode("utf-8")
    if not patch.strip():
        return PatchCheck(ok=False, reasons=["patch is empty"], size_bytes=len(data))
    reasons: list[str] = []
    if len(data) > limit:
        reasons.append(f"patch is {len(data)} bytes; the limit is {limit}")
    if "\0" in patch:
        reasons.append(_BINARY)
    try:
        files, binary = _patch_paths(data)
    except GitError as e:
        reasons.append(f"not a valid patch: {e.stderr}")
        return PatchCheck(ok=False, reasons=reasons, size_bytes=len(data))
    if binary and _BINARY not in reasons:
        reasons.append(_BINARY)
    reasons += [problem for p in files if (problem := path_problem(p))]
    if reasons:
        return PatchCheck(ok=False, reasons=reasons, files=files, size_bytes=len(data))
    try:
        revision = _resolve(repo, base)
        with staged_patch(objects_of(repo), revision, data) as staged:
            files = [change.path for change in staged.changes]
            if any(change.binary for change in staged.changes):
                reasons.append(_BINARY)
            reasons += policy_violations(staged.changes, policy, staged.read_blob)
    except GitError as e:
        reasons.append(f"does not apply to {base}: {e.stderr}")
    return PatchCheck(ok=not reasons, reasons=reasons, files=files, size_bytes=len(data))
