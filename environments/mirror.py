"""The per-worker mirror cache: one ``git clone --mirror`` per clone URL, fetched only when a revision is missing.

Contracts:

- A mirror appears atomically: it is cloned into a temporary directory and renamed into place, so an
  interrupted clone never leaves a mirror that is later trusted. Leftover temporary clones are removed by
  the next caller.
- Updates (clone, fetch, bundle import) for one URL are serialised by an exclusive lock; presence checks
  need no lock because git writes objects before it moves refs.
- The mirror never prunes objects (``gc.pruneExpire=never``): workspaces borrow its objects through
  alternates, and a commit they stand on must survive a force-push on the remote.
- Commits restored from a bundle are kept under ``refs/durafix/bundles/<sha>`` so they stay reachable; a
  plain fetch (no ``--prune``) never deletes them.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from environments.files import locked, path_key
from environments.git import GitError, check_clone_url, git_env, has_commit, run_git
from environments.interface import EnvironmentError

_BUNDLE_REFS = "refs/durafix/bundles"


class RevisionNotFoundError(EnvironmentError):
    """The wanted commit is neither in the mirror, on the remote, nor in the given bundle."""


class BundleError(EnvironmentError):
    """A bundle could not be imported (corrupt, or its prerequisite commits are unavailable)."""


class MirrorCache:
    """Mirrors of remote repositories under ``cache_dir``, keyed by clone URL."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir

    def path_for(self, clone_url: str) -> Path:
        return self.cache_dir / "mirrors" / f"{path_key(clone_url)}.git"

    def ensure(
        self,
        clone_url: str,
        revision: str,
        *,
        token: str | None = None,
        bundle: Path | None = None,
    ) -> Path:
        """Return the mirror for ``clone_url``, made to contain the commit ``revision``.

        Order of sources: the mirror as it is; then ``bundle`` (if given); then a fetch of all refs from
        the remote; then a fetch of ``revision`` by its ID (servers that allow reachable-SHA wants).
        """
        check_clone_url(clone_url)
        mirror = self.path_for(clone_url)
        if mirror.exists() and has_commit(mirror, revision):
            return mirror
        with locked(mirror.with_name(mirror.name + ".lock")):
            if not mirror.exists():
                self._clone(clone_url, mirror, token)
            if has_commit(mirror, revision):
                return mirror
            if bundle is not None:
                self._import_bundle(mirror, bundle, clone_url, token)
                if has_commit(mirror, revision):
                    return mirror
            env = git_env(clone_url=clone_url, token=token)
            run_git(["fetch", "--quiet", "origin"], cwd=mirror, env=env)
            if not has_commit(mirror, revision):
                try:
                    run_git(
                        ["fetch", "--quiet", "origin", f"{revision}:refs/durafix/fetched/{revision}"],
                        cwd=mirror,
                        env=env,
                    )
                except GitError as exc:
                    raise RevisionNotFoundError(
                        f"commit {revision} is not on {clone_url} (nor in a bundle): {exc.stderr}"
                    ) from exc
            if not has_commit(mirror, revision):
                raise RevisionNotFoundError(f"commit {revision} is not on {clone_url}")
            return mirror

    def _clone(self, clone_url: str, mirror: Path, token: str | None) -> None:
        mirror.parent.mkdir(parents=True, exist_ok=True)
        for leftover in mirror.parent.glob(f".{mirror.name}.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        tmp = mirror.with_name(f".{mirror.name}.tmp-{uuid.uuid4().hex}")
        try:
            run_git(
                ["clone", "--quiet", "--mirror", clone_url, str(tmp)],
                env=git_env(clone_url=clone_url, token=token),
            )
            run_git(["config", "gc.pruneExpire", "never"], cwd=tmp)
            os.rename(tmp, mirror)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _import_bundle(self, mirror: Path, bundle: Path, clone_url: str, token: str | None) -> None:
        try:
            run_git(["bundle", "verify", "--quiet", str(bundle.resolve())], cwd=mirror)
        except GitError:
            # Usually the prerequisite (the base revision) is newer than the mirror: fetch, then retry.
            run_git(["fetch", "--quiet", "origin"], cwd=mirror, env=git_env(clone_url=clone_url, token=token))
            try:
                run_git(["bundle", "verify", "--quiet", str(bundle.resolve())], cwd=mirror)
            except GitError as exc:
                raise BundleError(f"bundle {bundle} cannot be applied: {exc.stderr}") from exc
        heads = run_git(["bundle", "list-heads", str(bundle.resolve())], cwd=mirror).splitlines()
        refspecs = []
        for line in heads:
            sha, ref = line.split(" ", 1)
            refspecs.append(f"{ref}:{_BUNDLE_REFS}/{sha}")
        run_git(["fetch", "--quiet", str(bundle.resolve()), *refspecs], cwd=mirror)
