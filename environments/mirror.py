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
- A fetch into an existing mirror that fails with a git error is answered by one fresh clone, which takes the
  mirror's place only once it succeeded and after every object and ``refs/durafix/`` ref of the old mirror was
  carried over (see :meth:`MirrorCache._clone`); if the fresh clone fails too, its error is raised.
- Every time :meth:`MirrorCache.ensure` serves a mirror it touches the mirror's stamp
  (``<mirror>/durafix-last-used``): its mtime is when the mirror was last used, which is what
  ``durafix cache prune`` judges age by.
- A second lock per mirror, the *use lock*, is held shared by every ``ensure`` and by every
  :meth:`MirrorCache.borrowed` block (a workspace being built on the mirror); pruning takes it exclusively,
  without waiting, so it never removes a mirror while someone is being served from it or building on it.
  Updates keep their own exclusive lock, so a fetch never waits for a checkout to finish.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from environments.cache_entries import CacheEntries
from environments.files import locked, path_key, remove_tree
from environments.git import (
    GitError,
    GitTransportError,
    check_clone_url,
    git_env,
    has_commit,
    run_git,
)
from environments.interface import EnvironmentError

_BUNDLE_REFS = "refs/durafix/bundles"
# Inside the bare repository, so the stamp goes wherever the mirror goes (git ignores unknown files there).
STAMP_NAME = "durafix-last-used"


class RevisionNotFoundError(EnvironmentError):
    """The wanted commit is neither in the mirror, on the remote, nor in the given bundle."""


class BundleError(EnvironmentError):
    """A bundle could not be imported (corrupt, or its prerequisite commits are unavailable)."""


class MirrorCache(CacheEntries):
    """Mirrors of remote repositories under ``cache_dir``, keyed by clone URL. Each mirror's build lock
    serialises its clone, fetch and bundle import; its use lock is held shared while it is served or built on
    (see :mod:`environments.cache_entries`)."""

    stamp_name = STAMP_NAME

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir

    @property
    def mirrors_dir(self) -> Path:
        return self.cache_dir / "mirrors"

    def path_for(self, clone_url: str) -> Path:
        return self.mirrors_dir / f"{path_key(clone_url)}.git"

    def cached(self) -> list[Path]:
        """The mirrors present, sorted; temporary clones and mirrors being removed (dot-names) are not."""
        if not self.mirrors_dir.is_dir():
            return []
        return sorted(p for p in self.mirrors_dir.glob("*.git") if p.is_dir() and not p.name.startswith("."))

    def clone_url_of(self, mirror: Path) -> str:
        """The clone URL ``mirror`` was made from (its origin), or its directory name when git cannot say."""
        try:
            return run_git(["config", "--get", "remote.origin.url"], cwd=mirror) or mirror.name
        except GitError:
            return mirror.name

    def ensure(
        self,
        clone_url: str,
        revision: str,
        *,
        token: str | None = None,
        bundle: Path | None = None,
    ) -> Path:
        """Return the mirror for ``clone_url``, made to contain the commit ``revision``, and stamp it as used.

        Order of sources: the mirror as it is; then ``bundle`` (if given); then a fetch of all refs from
        the remote; then a fetch of ``revision`` by its ID (servers that allow reachable-SHA wants).
        The returned mirror was stamped just now, so pruning (which only takes mirrors unused for longer than
        its threshold) leaves it alone while the caller starts using it; callers that build a workspace on it
        use :meth:`borrowed` instead, which also covers the time until the workspace's alternates exist.
        """
        with self.borrowed(clone_url, revision, token=token, bundle=bundle) as mirror:
            return mirror

    @contextlib.contextmanager
    def borrowed(
        self, clone_url: str, revision: str, *, token: str | None = None, bundle: Path | None = None
    ) -> Iterator[Path]:
        """:meth:`ensure`, and keep the mirror from being pruned until the block ends.

        For building a workspace: until its ``alternates`` file is in place, nothing on disk says the tree
        borrows from the mirror, so the use lock (held shared; pruning needs it exclusively) says it instead.
        One lock and one stamp per call: this is on every workspace rebuild.
        """
        check_clone_url(clone_url)
        mirror = self.path_for(clone_url)
        with locked(self.use_lock(mirror), shared=True):
            self._hold(clone_url, mirror, revision, token, bundle)
            self.stamp_path(mirror).touch()
            yield mirror

    def _hold(self, clone_url: str, mirror: Path, revision: str, token: str | None, bundle: Path | None) -> None:
        """Make ``mirror`` contain ``revision``: as it is, from ``bundle``, or fetched."""
        if mirror.exists() and has_commit(mirror, revision):
            return
        with locked(self.build_lock(mirror)):
            # A mirror cloned in this call is as current as the remote: fetching it again would be wasted.
            current = not mirror.exists()
            if current:
                self._clone(clone_url, mirror, token)
            if has_commit(mirror, revision):
                return
            if bundle is not None:
                current = self._import_bundle(mirror, bundle, clone_url, token, current=current)
                if has_commit(mirror, revision):
                    return
            if not current:
                self._refresh(clone_url, mirror, token)
            if not has_commit(mirror, revision):
                try:
                    run_git(
                        ["fetch", "--quiet", "origin", f"{revision}:refs/durafix/fetched/{revision}"],
                        cwd=mirror,
                        env=git_env(clone_url=clone_url, token=token),
                    )
                except GitTransportError:
                    # Says nothing about the commit: the remote may well have it once it can be reached.
                    raise
                except GitError as exc:
                    raise RevisionNotFoundError(
                        f"commit {revision} is not on {clone_url} (nor in a bundle): {exc.stderr}"
                    ) from exc
            if not has_commit(mirror, revision):
                raise RevisionNotFoundError(f"commit {revision} is not on {clone_url}")

    def _refresh(self, clone_url: str, mirror: Path, token: str | None) -> None:
        """Fetch every ref of the remote into ``mirror``; when git fails, replace the mirror by a fresh clone.

        Called with the update lock held. The fresh clone is tried once: if it fails too, its error is raised
        (``GitProtocolError`` or ``GitTransportError`` when the remote was the problem), chained to the fetch's
        error, and the mirror stays as it was.
        """
        try:
            run_git(["fetch", "--quiet", "origin"], cwd=mirror, env=git_env(clone_url=clone_url, token=token))
        except GitError as failed:
            try:
                self._clone(clone_url, mirror, token, replacing=True)
            except GitError as again:
                raise again from failed

    def _clone(self, clone_url: str, mirror: Path, token: str | None, *, replacing: bool = False) -> None:
        """Clone ``clone_url`` into a temporary sibling and rename it to ``mirror``; with the update lock held.

        ``replacing``: ``mirror`` exists and the fresh clone takes its place. Workspaces may be borrowing the
        old mirror's objects through alternates, which name the mirror's path, and the cache promises that a
        commit they stand on survives a force-push on the remote; so every object file of the old mirror the
        new clone lacks is carried over (hard-linked where possible) and so are its ``refs/durafix/`` refs
        (bundle imports, commits fetched by ID), before the old mirror is removed. If anything fails before the
        swap, the old mirror is left as it was.
        """
        mirror.parent.mkdir(parents=True, exist_ok=True)
        for pattern in (f".{mirror.name}.tmp-*", f".{mirror.name}.removing-*"):
            for leftover in mirror.parent.glob(pattern):
                shutil.rmtree(leftover, ignore_errors=True)
        tmp = mirror.with_name(f".{mirror.name}.tmp-{uuid.uuid4().hex}")
        try:
            run_git(
                ["clone", "--quiet", "--mirror", clone_url, str(tmp)],
                env=git_env(clone_url=clone_url, token=token),
            )
            run_git(["config", "gc.pruneExpire", "never"], cwd=tmp)
            if replacing:
                _carry_over(mirror, tmp)
                # Renamed away first (a crash mid-delete leaves a dot-name nobody serves); the gap before the
                # rename below is what a reader without the update lock may see, and it then waits for that lock.
                remove_tree(mirror)
            os.rename(tmp, mirror)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _import_bundle(self, mirror: Path, bundle: Path, clone_url: str, token: str | None, *, current: bool) -> bool:
        """Fetch ``bundle``'s heads into ``mirror`` under ``refs/durafix/bundles/``; return whether the mirror is
        now as current as the remote (``current``, or refreshed here because the bundle needed newer commits)."""
        try:
            run_git(["bundle", "verify", "--quiet", str(bundle.resolve())], cwd=mirror)
        except GitError as exc:
            if current:
                raise BundleError(f"bundle {bundle} cannot be applied: {exc.stderr}") from exc
            # Usually the prerequisite (the base revision) is newer than the mirror: fetch, then retry.
            self._refresh(clone_url, mirror, token)
            current = True
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
        return current


def _carry_over(old: Path, new: Path) -> None:
    """Give the mirror ``new`` every object file of ``old`` it lacks, and ``old``'s ``refs/durafix/`` refs.

    Object files are content-addressed, so an extra one never changes what a ref means; packs go before
    their indexes, because git only looks at a pack once its index exists. Bitmaps and multi-pack indexes
    describe one repository's own packs and are not carried. A ref whose object git cannot read in ``old``
    (the old mirror may be the broken thing) is skipped.
    """
    src, dst = old / "objects", new / "objects"
    files = [p for p in src.rglob("*") if p.is_file() and p.relative_to(src).parts[0] != "info"]
    files = [p for p in files if p.suffix != ".bitmap" and p.name != "multi-pack-index"]
    for path in sorted(files, key=lambda p: p.suffix == ".idx"):
        target = dst / path.relative_to(src)
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)
    try:
        listing = run_git(["for-each-ref", "--format=%(objectname) %(refname)", "refs/durafix/"], cwd=old)
    except GitError:
        return
    for line in listing.splitlines():
        sha, ref = line.split(" ", 1)
        with contextlib.suppress(GitError):
            run_git(["update-ref", ref, sha], cwd=new)
