"""A commit someone pushed, read from a mirror as the change a run can verify: its diff from the run's base.

A moved PR head is verified the way the run verifies its own candidates: a fresh workspace at the base with a
patch applied. The patch is the whole ``git diff --binary base head``, so base + patch is exactly the head's
tree whatever the head's history (commits on top of the run's, a rebase, a merge of the base branch); the
caller checks that equality (``tree``) on the workspace it verified.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from pydantic import BaseModel

from environments.git import GitError, git_env, git_error, run_git


class CapturedHead(BaseModel):
    """``head``'s change from ``base``: the diff (text; binary hunks in git's binary format), the head's tree,
    its parents, its message and its committer date (seconds since the epoch)."""

    head: str
    base: str
    patch: str
    tree: str
    parents: list[str]
    message: str
    committed_at: int
    descends_from_base: bool


def capture_head(mirror: Path, base: str, head: str) -> CapturedHead:
    """Read ``head`` (which the mirror must contain) as its change from ``base``. Read-only on the mirror."""
    patch = run_git(["diff", "--binary", "--full-index", "--no-renames", base, head], cwd=mirror)
    tree = run_git(["rev-parse", f"{head}^{{tree}}"], cwd=mirror)
    parents = run_git(["rev-list", "--parents", "-n", "1", head], cwd=mirror).split()[1:]
    message = run_git(["log", "-1", "--format=%B", head], cwd=mirror)
    committed_at = int(run_git(["log", "-1", "--format=%ct", head], cwd=mirror))
    try:
        descends = run_git(["merge-base", base, head], cwd=mirror) == base
    except GitError:  # no common history at all
        descends = False
    return CapturedHead(
        head=head,
        base=base,
        patch=patch + "\n" if patch and not patch.endswith("\n") else patch,
        tree=tree,
        parents=parents,
        message=message,
        committed_at=committed_at,
        descends_from_base=descends,
    )


class RebuiltChange(BaseModel):
    """``head``'s change from ``old_base`` rebuilt on ``new_base`` (a three-way merge, as the forge's merge
    commit would make it). ``conflict``: it does not apply (``detail`` names the paths); otherwise ``patch`` is
    the diff ``new_base``..``tree`` and ``same_change`` says whether it is the same change as before (equal
    ``git patch-id --stable``: the same lines added and removed, whatever their offsets)."""

    head: str
    old_base: str
    new_base: str
    conflict: bool
    detail: str = ""
    tree: str | None = None
    patch: str = ""
    same_change: bool = False


def _patch_id(mirror: Path, diff: str) -> str:
    out = run_git(["patch-id", "--stable"], cwd=mirror, stdin=diff + "\n") if diff.strip() else ""
    return out.split()[0] if out else ""


def rebuild_on_base(mirror: Path, old_base: str, head: str, new_base: str) -> RebuiltChange:
    """Rebuild ``head`` (made on ``old_base``) on ``new_base`` in the mirror, which must contain all three.
    Writes only objects into the mirror (the merged tree), never a ref. Raises ``GitError`` when the two share
    no history."""
    # The merge base is git's own (the head's fork point: ``old_base`` unless the head was already merged with,
    # or rebased onto, a later base), as for the forge's merge commit; the before-diff for the patch ID uses it.
    merge_base = run_git(["merge-base", new_base, head], cwd=mirror)
    args = ["merge-tree", "--write-tree", "--name-only", "--no-messages", new_base, head]
    proc = subprocess.run(["git", *args], cwd=mirror, env=git_env(), capture_output=True, text=True, check=False)
    if proc.returncode == 1:  # merge-tree's answer for a conflict: the tree, then the conflicted paths
        paths = [line.strip() for line in proc.stdout.splitlines()[1:] if line.strip()]
        return RebuiltChange(
            head=head,
            old_base=old_base,
            new_base=new_base,
            conflict=True,
            detail=f"conflicts in {', '.join(paths)}" if paths else "the change conflicts with the new base",
        )
    if proc.returncode != 0:
        raise git_error(args, proc.returncode, proc.stderr)
    out = proc.stdout
    tree = out.splitlines()[0].strip()
    patch = run_git(["diff", "--binary", "--full-index", "--no-renames", new_base, tree], cwd=mirror)
    before = run_git(["diff", "--binary", "--full-index", "--no-renames", merge_base, head], cwd=mirror)
    return RebuiltChange(
        head=head,
        old_base=old_base,
        new_base=new_base,
        conflict=False,
        tree=tree,
        patch=patch + "\n" if patch and not patch.endswith("\n") else patch,
        same_change=_patch_id(mirror, patch) == _patch_id(mirror, before),
    )
