"""A commit someone pushed, read from a mirror as the change a run can verify: its diff from the run's base.

A moved PR head is verified the way the run verifies its own candidates: a fresh workspace at the base with a
patch applied. The patch is the whole ``git diff --binary base head``, so base + patch is exactly the head's
tree whatever the head's history (commits on top of the run's, a rebase, a merge of the base branch); the
caller checks that equality (``tree``) on the workspace it verified.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from environments.git import GitError, run_git


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
