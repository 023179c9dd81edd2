"""Workspaces: fresh working trees rebuilt from recorded inputs (base revision + patch), owned by a run.

A workspace is never resumed. :meth:`WorkspaceManager.rebuild` always produces a new tree at the base
revision, applies the patch, checks the resulting tree hash, and only then renames the tree into its final
place; whatever an earlier (possibly crashed) attempt left for the same operation is removed first. So the
same recorded inputs give the same tree on any worker, and a half-built tree is never used.

How a tree is built, and why: ``git init`` plus an ``objects/info/alternates`` entry pointing at the
worker's mirror, then a detached checkout. This is ``git clone --shared`` without copying refs or a
remote: no object is copied, and the repository is self-contained under the workspace directory, so it can
be built in a temporary directory and renamed atomically. ``git worktree add`` would be as fast but keeps
its bookkeeping inside the mirror, which a rename breaks and a crash leaves registered; a full ``git
clone`` copies every object (see ``tests/bench/bench_workspace.py``).

Ownership: each workspace is recorded (run_id, op_id, path) *before* anything is built, under
``root/<run>/``; :meth:`WorkspaceManager.cleanup_run` tombstones the run first, so a late ``rebuild`` for it
raises :class:`~environments.interface.RunFencedError`, then removes only that run's records and trees.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from environments.files import locked, path_key, read_json, remove_tree, write_json_atomic
from environments.git import GitError, git_env, isolated_git, run_git
from environments.interface import (
    CleanupReport,
    EnvironmentError,
    OwnedResource,
    ResourceConflictError,
    ResourceKind,
)
from environments.mirror import MirrorCache
from environments.run_dirs import RunDirs
from environments.staged_patch import staged_patch, unsafe_changes
from environments.untrusted_files import UntrustedFileError, read_beneath

COMMITTER_NAME = "durafix"
COMMITTER_EMAIL = "durafix@localhost"
PROVIDER_NAME = "workspace"

_FULL_SHA = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


class PatchError(EnvironmentError):
    """The patch does not apply to the base revision, or writes what no workspace may hold (a symlink, a
    submodule, a path in ``.git``): permanent for these inputs."""


class TreeMismatchError(EnvironmentError):
    """The rebuilt tree differs from the recorded ``expected_tree`` (permanent for these inputs)."""


class Workspace(BaseModel):
    """A rebuilt working tree. ``head_commit`` is HEAD when rebuilt: the base revision."""

    model_config = ConfigDict(frozen=True)

    path: Path
    run_id: str
    op_id: str
    base_revision: str
    head_commit: str
    tree_sha: str


class WorkspaceManager:
    """Builds and owns workspaces under ``root``, borrowing objects from mirrors under ``cache_dir``."""

    def __init__(self, cache_dir: Path, root: Path) -> None:
        self.mirrors = MirrorCache(cache_dir.absolute())
        self.root = root.absolute()
        self.runs = RunDirs(self.root)

    def rebuild(
        self,
        *,
        run_id: str,
        op_id: str,
        clone_url: str,
        base_revision: str,
        patch: str | None = None,
        expected_tree: str | None = None,
        token: str | None = None,
        bundle: Path | None = None,
    ) -> Workspace:
        """Build a fresh tree for ``op_id`` at ``base_revision`` with ``patch`` staged; replace any older one.

        Idempotent per ``op_id``: the same inputs always give the same ``tree_sha`` at the same path.
        ``bundle`` (from :meth:`snapshot`) supplies a commit the mirror and remote lack. The patch is first
        applied to a scratch index and read back (:mod:`environments.staged_patch`); one that writes a
        symlink, a submodule, a mode other than the executable bit or a path in ``.git`` is refused before
        any file of it is written. Every git command runs in the clean git environment
        (:func:`environments.git.git_env`).
        Raises :class:`PatchError` (does not apply, or refused), :class:`TreeMismatchError` (nothing is left
        in place for either),
        :class:`~environments.mirror.RevisionNotFoundError`, or ``RunFencedError`` once the run is cleaned up.
        """
        if not _FULL_SHA.match(base_revision):
            raise ValueError(f"base revision must be a full commit ID, got {base_revision!r}")
        with self.runs.creating(run_id, op_id, doing="rebuild") as run_dir:
            key = path_key(op_id)
            with locked(run_dir / f"{key}.lock"):
                final = run_dir / key
                self._record(run_dir, key, run_id=run_id, op_id=op_id, path=final)
                _remove_leftovers(run_dir, key)
                remove_tree(final)
                tmp = run_dir / f".{key}.tmp-{uuid.uuid4().hex}"
                # Borrowed until the tree is in place: before its alternates file exists only the mirror's use
                # lock tells ``durafix cache prune`` that this tree is about to stand on the mirror.
                with self.mirrors.borrowed(clone_url, base_revision, token=token, bundle=bundle) as mirror:
                    try:
                        tree = _build_tree(tmp, mirror, base_revision, patch)
                        if expected_tree is not None and tree != expected_tree:
                            raise TreeMismatchError(
                                f"rebuilt tree {tree} differs from the recorded tree {expected_tree}"
                            )
                        os.rename(tmp, final)
                    finally:
                        shutil.rmtree(tmp, ignore_errors=True)
        return Workspace(
            path=final,
            run_id=run_id,
            op_id=op_id,
            base_revision=base_revision,
            head_commit=base_revision,
            tree_sha=tree,
        )

    def commit(self, ws: Workspace, message: str, timestamp: int, parent: str | None = None) -> str:
        """Commit the workspace's rebuilt tree on top of ``parent`` (default: its base revision); return the commit ID.

        Deterministic: fixed author and committer, both dated ``timestamp`` (UTC), parent = ``parent`` or the
        base revision, tree = ``ws.tree_sha``, the tree :meth:`rebuild` built from base + patch (stray files in
        the working tree never enter it, and the index is not read again: a tree half-replaced by a concurrent
        rebuild of the same ``op_id`` fails the commit instead of making another one). The
        same base, patch, parent, message and timestamp give the same commit ID on any worker, and calling this
        twice is a no-op. HEAD is moved (detached) to the commit. A ``parent`` other than the base (a revision
        stacked on the commit under review) must already be in the mirror the workspace borrows from
        (:meth:`MirrorCache.ensure`); the commit's tree is still base + the whole patch, so its diff against
        ``parent`` is what the revision changed.
        """
        if not message.strip():
            raise ValueError("commit message must not be empty")
        if timestamp < 0:
            raise ValueError("timestamp must be seconds since the epoch")
        if not ws.tree_sha:
            raise ValueError("only a rebuilt workspace, whose tree is recorded, can be committed")
        date = f"@{timestamp} +0000"
        env = git_env(
            extra={
                "GIT_AUTHOR_NAME": COMMITTER_NAME,
                "GIT_AUTHOR_EMAIL": COMMITTER_EMAIL,
                "GIT_AUTHOR_DATE": date,
                "GIT_COMMITTER_NAME": COMMITTER_NAME,
                "GIT_COMMITTER_EMAIL": COMMITTER_EMAIL,
                "GIT_COMMITTER_DATE": date,
            }
        )
        commit = run_git(
            ["commit-tree", ws.tree_sha, "-p", parent or ws.base_revision, "-F", "-"],
            cwd=ws.path,
            env=env,
            stdin=message.rstrip("\n") + "\n",
        )
        run_git(["update-ref", "--no-deref", "HEAD", commit], cwd=ws.path)
        return commit

    def snapshot(self, ws: Workspace, dest: Path, commit: str) -> Path:
        """Write a git bundle of ``commit`` (the worker's own, from :meth:`commit`) beyond the base revision.

        The commit is named by the caller, never read from the workspace's HEAD: tests that ran in the workspace
        must not choose what goes into the bundle. The bundle is made through a git directory of the worker's
        own (:func:`environments.git.isolated_git`) and is thin (the base revision is a prerequisite), so it
        stays small; restoring it needs the base revision from the clone URL or the mirror. Its one ref is
        ``HEAD``. Written atomically.
        """
        if not _FULL_SHA.match(commit):
            raise ValueError(f"the commit to snapshot must be a full commit ID, got {commit!r}")
        if commit == ws.base_revision:
            raise ValueError("nothing to snapshot: the workspace has no commit beyond its base revision")
        dest = dest.absolute()
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex}")
        try:
            with isolated_git(ws.path, head=commit, index_tree=commit) as git:
                git.run(["bundle", "create", "--quiet", str(tmp), "HEAD", f"^{ws.base_revision}"])
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return dest

    def list_owned(self, run_id: str | None = None) -> list[OwnedResource]:
        """Workspaces recorded for ``run_id`` (all runs when ``None``), with whether the tree is present."""
        return [_resource(record) for _, record in self.runs.records(run_id)]

    def borrowers(self, mirror: Path) -> list[Path]:
        """The trees under ``root`` whose git borrows objects from ``mirror`` through its alternates file.

        Every tree this manager makes lives in ``root/<run>/``: recorded trees, trees still being built (their
        temporary directory already names the mirror) and trees being removed (renamed to a dot-name first),
        so all of them are found. Paths are compared resolved, so a symlinked cache directory still matches.
        A tree between ``git init`` and writing its alternates is not found here; :meth:`MirrorCache.borrowed`
        covers that moment with the mirror's use lock.
        """
        objects = (mirror / "objects").resolve()
        found: list[Path] = []
        for run_dir in self.runs.run_dirs():
            try:
                trees = sorted(run_dir.iterdir())
            except FileNotFoundError:
                continue
            for tree in trees:
                info = tree / ".git" / "objects" / "info"
                try:
                    # A tree's metadata is read as untrusted bytes: no link followed, no FIFO, bounded.
                    said = read_beneath(tree, ".git/objects/info/alternates", max_bytes=64 * 1024)
                except UntrustedFileError:
                    continue
                lines = said.decode("utf-8", errors="replace").splitlines()
                # git reads a relative entry relative to the borrowing objects directory.
                if any((info.parent / line.strip()).resolve() == objects for line in lines if line.strip()):
                    found.append(tree)
        return found

    def remove(self, ws: Workspace) -> None:
        """Remove one workspace's tree and record; idempotent."""
        run_dir = self.runs.run_dir(ws.run_id)
        key = path_key(ws.op_id)
        with locked(run_dir / "run.lock", shared=True), locked(run_dir / f"{key}.lock"):
            _remove_leftovers(run_dir, key)
            remove_tree(run_dir / key)
            (run_dir / f"{key}.json").unlink(missing_ok=True)

    def cleanup_run(self, run_id: str) -> CleanupReport:
        """Tombstone ``run_id``, wait for its in-flight rebuilds, then remove its workspaces; idempotent.

        Touches nothing outside the run's own directory.
        """
        report = CleanupReport(run_id=run_id)
        with self.runs.cleaning(run_id) as run_dir:
            for resource in self.list_owned(run_id):
                key = path_key(resource.op_id)
                try:
                    _remove_leftovers(run_dir, key)
                    remove_tree(run_dir / key)
                    (run_dir / f"{key}.json").unlink(missing_ok=True)
                    (run_dir / f"{key}.lock").unlink(missing_ok=True)
                except OSError as exc:
                    report.remaining.append(resource)
                    report.errors.append(f"{resource.resource_id}: {exc}")
                else:
                    report.removed.append(resource)
        return report

    def _record(self, run_dir: Path, key: str, *, run_id: str, op_id: str, path: Path) -> None:
        record_path = run_dir / f"{key}.json"
        existing = read_json(record_path)
        if existing is not None and (existing["run_id"], existing["op_id"]) != (run_id, op_id):
            raise ResourceConflictError(
                f"workspace record {record_path} belongs to {existing['run_id']} / {existing['op_id']}"
            )
        write_json_atomic(record_path, {"run_id": run_id, "op_id": op_id, "path": str(path)})


def _build_tree(tmp: Path, mirror: Path, revision: str, patch: str | None) -> str:
    """Check out ``revision`` into ``tmp`` borrowing ``mirror``'s objects, stage ``patch``; return the tree."""
    run_git(["init", "--quiet", "--template=", str(tmp)])
    alternates = tmp / ".git" / "objects" / "info" / "alternates"
    alternates.parent.mkdir(parents=True, exist_ok=True)
    alternates.write_text(f"{mirror / 'objects'}\n", encoding="utf-8")
    run_git(["update-ref", "--no-deref", "HEAD", revision], cwd=tmp)
    run_git(["reset", "--quiet", "--hard", "HEAD"], cwd=tmp)
    if patch is None:
        return run_git(["write-tree"], cwd=tmp)
    # Judged on a scratch index before anything reaches the working tree: a stored patch that would write a
    # symlink, a submodule or into .git is refused here whatever validated it, and leaves no file behind.
    try:
        with staged_patch(mirror / "objects", revision, patch.encode("utf-8")) as staged:
            unsafe = unsafe_changes(staged.changes)
            expected = staged.tree
    except GitError as exc:
        raise PatchError(f"patch does not apply to {revision}: {exc}") from exc
    if unsafe:
        raise PatchError(f"patch refused for {revision}: " + "; ".join(unsafe))
    try:
        run_git(["apply", "--index", "--check", "-"], cwd=tmp, stdin=patch)
    except GitError as exc:
        raise PatchError(f"patch does not apply to {revision}: {exc}") from exc
    run_git(["apply", "--index", "-"], cwd=tmp, stdin=patch)
    tree = run_git(["write-tree"], cwd=tmp)
    if tree != expected:
        raise PatchError(f"patch applied to the workspace gave tree {tree}, the scratch index {expected}")
    return tree


def _remove_leftovers(run_dir: Path, key: str) -> None:
    """Remove temporary trees an interrupted rebuild or removal of ``key`` left behind."""
    for leftover in run_dir.glob(f".{key}.*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _resource(record: dict[str, str]) -> OwnedResource:
    path = Path(record["path"])
    return OwnedResource(
        kind=ResourceKind.WORKSPACE,
        provider=PROVIDER_NAME,
        resource_id=str(path),
        run_id=record["run_id"],
        op_id=record["op_id"],
        detail={"path": str(path), "present": "yes" if path.is_dir() else "no"},
    )
