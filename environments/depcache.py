"""The dependency cache: what a recipe's setup produced (``node_modules``, ``.venv``), kept per lock hash on a
worker and restored into fresh workspaces instead of running setup again.

**Key.** The sha256 of the canonical JSON of everything the result of setup depends on that durafix can name:
the repository, the provider (where setup ran: ``local`` for the worker's own processes), the worker's platform,
the setup commands, the recipe's ``env`` and secret *references* (never values), the cached paths, the sha256
of each lock file (:func:`environments.spec.lock_files`), and the path setup saw the workspace at (``mount``:
the sandbox's fixed ``/workspace``, or empty for a setup that ran at the workspace's own path). All of it is
read from the workspace being set up, after its patch: a candidate that changes a lock file gets an entry of its
own.

**Layout** under ``root`` (``STATE/cache/deps``)::

    <repo>/<key>/record.json      the build record; written before the entry is renamed into place
    <repo>/<key>/tree/<path>      each cached path as setup left it
    <repo>/<key>/last-used        stamp touched by every restore: its mtime is what pruning judges age by
    <repo>/<key>.lock             build lock, held exclusively while a miss runs setup and stores the entry
    <repo>/<key>.use.lock         held shared while restoring; exclusively (never waited for) by pruning and
                                  by a builder replacing a damaged entry
    <repo>/.<key>.tmp-<id>/       an entry being built, beside the lock its builder holds (``….tmp-<id>.lock``)

**Contracts.**

- *Atomic.* An entry is built aside (a temporary directory next to it), its record written and fsynced last,
  then renamed into place: a crash at any point leaves at most a temporary directory, which is never read and
  is removed by the next build of that key or by ``durafix cache prune``. An entry whose record is missing,
  unreadable, of another format or for another key is never used.
- *Never shared with a workspace.* Every file of an entry is its own: storing and restoring put a reflink (a
  copy-on-write clone) where the filesystem has them, else a plain copy, never a hard link. A workspace's
  setup, app or tests may write their files in place as they like: the write lands in the workspace's copy,
  never in the entry nor in another workspace. The entries live in the state directory, which no sandbox
  mounts.
- *Never trusted blindly.* The record holds a digest of the tree's shape (every path, its type, mode, size,
  mtime, link target), recomputed while restoring; an entry that changed since it was built (a truncation
  after a power cut, an operator's edit) is not used, and the next build replaces it. A workspace restored from
  an entry is then checked exactly like one whose setup ran: readiness when provisioning, the tests when
  verifying. Nothing here replaces those checks.
- *Concurrency.* Builders of one key take its build lock, waiting for it (polling, at most ``wait_s``): the
  first builds, the others then find the entry and restore it. One that gives up waiting builds without the
  lock; if an entry appeared meanwhile its rename fails and it drops its own copy, harmlessly.
- *Restoring* copies each cached path into a staging directory inside the workspace — reflinks where the
  filesystem has them, else plain copies (``restore="copy"``: plain copies always) — checks the digest, and
  renames each path into place. A failed restore removes what it put there and reports why; the caller runs
  setup instead.
- *No relocation in the sandbox.* Setup in bubblewrap sees every workspace at ``/workspace``
  (:data:`environments.sandbox.WORKSPACE`), and so do the app, its fixtures and the tests: what setup wrote
  (shebangs, ``pyvenv.cfg``, ``.pth`` files, editable installs' finders and their bytecode, ``node_modules/.bin``
  links) is valid in every workspace as it is, and is restored byte for byte. Such a tree naming the
  workspace's host path is not stored.
- *Exact relocation elsewhere* (an ``unsandboxed`` worker, where setup ran at the workspace's own path): the
  text files naming the building workspace (each spelling, :func:`_workspace_names`) are rewritten to name the
  new one, after their stored bytes are checked against the sha256 the record holds, and get a fresh mtime;
  symlinks into it are relinked; bytecode naming it, and the bytecode of every rewritten source, is dropped
  (Python compiles it again). The relocated tree's shape is then checked against the record before use. A
  binary file naming the building workspace (other than bytecode) cannot be relocated: such a tree is not
  stored, and the reason is reported.
- *Storing* only what reproduces setup: every cached path must exist afterwards, and setup must not have
  changed anything else in the checkout (``git status`` before and after; ``__pycache__`` aside), else nothing is
  stored and the reason is reported.

**Why copies, not hard links.** Hard links made a restore cheap on filesystems without reflinks (ext4), but a
hard link *is* the entry's file: one in-place write in a workspace (``open(..., "r+")``, ``dd conv=notrunc``, a
tool that does not write aside and rename) changed the entry and every workspace restored from it, and a
same-size write with its mtime put back slipped past the shape digest, so a candidate's tests could plant code in
what later runs, of other candidates, install. The alternatives measured (``tests/bench/bench_depcache.py``,
``docs/environments.md`` has the numbers) were verifying every restored file by content (a sha256 of each file
recorded when stored, checked when restored) and restoring copies. Verifying keeps the hard link, so it only
finds a write after it has reached the entry (a concurrent workspace has already read it), and it reads every
byte besides; read-only modes do not help (the sandbox runs as the worker's uid), and ``chattr +i`` would make
every restored workspace undeletable. Copies cannot be written through at all. On ext4 they cost more than
verifying did (medians of 0.25 to 2.1 s against 0.4 to 0.5 s for 10 007 files, hard links 0.15 s; the
write-back of the new files makes them vary), still little next to running setup; reflinks, where the
filesystem has them, make them about as cheap as hard links were.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import mmap
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from environments.cache_entries import CacheEntries
from environments.files import (
    discard_tree,
    locked,
    locked_within,
    path_key,
    read_json,
    remove_abandoned,
    remove_tree,
    try_locked,
    write_json_atomic,
)
from environments.git import GitError, isolated_git
from environments.interface import AppRecipe, EnvironmentError, Progress
from environments.spec import cached_paths, dependency_lock_hash, lock_file_digests

# 3: keyed by the path setup saw the workspace at (``mount``), relocations exact (format 2 entries were built at
# each workspace's own path and relocated with their bytecode stale: never read). 2: entries stored by copies
# (format 1 entries were stored by hard links, which may still share a workspace's inodes: never read).
FORMAT: Literal[3] = 3
RECORD_NAME, TREE_NAME, STAMP_NAME = "record.json", "tree", "last-used"
TMP_MARK, REMOVING_MARK = ".tmp-", ".removing-"
RestoreMode = Literal["auto", "copy"]
RESTORE_MODES: tuple[RestoreMode, ...] = ("auto", "copy")

# ioctl(FICLONE): share the source's extents copy-on-write (btrfs, XFS); refused elsewhere.
_FICLONE = 0x40049409
_NO_REFLINK = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.EBADF, errno.ENOSYS}
# Bytecode that names the building workspace is dropped when relocating, never rewritten: a compiled module's
# constants (an editable install's finder maps its package to a path) would still name the old workspace, and
# bytecode whose source was rewritten in place of the same size and second would pass Python's staleness check.
_BYTECODE = (".pyc", ".pyo")


class CacheKey(BaseModel):
    """What an entry is for; ``key`` is the sha256 of the canonical JSON of the other fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    repository: str
    provider: str
    platform: str
    setup: list[str]
    env: dict[str, str]
    secrets: dict[str, str]
    paths: list[str]
    lock_files: dict[str, str]
    lock_hash: str
    # The path setup saw the workspace at when it is the same for every workspace (the sandbox's /workspace,
    # :data:`environments.sandbox.WORKSPACE`): nothing is relocated. Empty: setup ran at the workspace's own path
    # (unsandboxed), and a restore relocates exactly (see the module).
    mount: str


class BuildRecord(CacheKey):
    """What an entry was built from (its key's fields) and what it holds; written into the entry before it
    is renamed into place."""

    model_config = ConfigDict(frozen=False, extra="forbid")

    format: Literal[3]
    built_in: str
    built_in_real: str
    # Relocation (``mount`` empty only): the text files naming the building workspace, with the sha256 of their
    # stored bytes (checked before they are rewritten); the bytecode dropped on restore; and the digest of the
    # tree as a restore must leave it (:func:`_restored_digest`), checked before the tree is used.
    relocate: dict[str, str]
    drop: list[str]
    restored_digest: str
    tree_digest: str
    files: int
    size_bytes: int
    method: str
    created: float
    created_at: str

    def for_key(self) -> CacheKey:
        return CacheKey(**{name: getattr(self, name) for name in CacheKey.model_fields})

    def summary(self) -> str:
        """``acme/cart: node_modules from package-lock.json (sha256 41c4…), built 2024-05-01T10:00:00+00:00``."""
        locks = ", ".join(f"{name} (sha256 {digest[:12]})" for name, digest in self.lock_files.items())
        return f"{self.repository}: {', '.join(self.paths)} from {locks}, built {self.created_at}"


class Restored(BaseModel):
    """A successful restore: the entry's record, how the files were put in place, and how long it took."""

    record: BuildRecord
    method: str
    seconds: float


class DependencyCache(CacheEntries):
    """Entries under ``root``; see the module's contracts. Safe to share between threads and processes. An
    entry's locks and stamp are those of :mod:`environments.cache_entries`; ``last_used`` is its last restore or
    build."""

    stamp_name = STAMP_NAME

    def __init__(self, root: Path, *, restore: RestoreMode = "auto", wait_s: float = 600.0, poll_s: float = 0.2):
        if restore not in RESTORE_MODES:
            raise ValueError(f"restore must be one of {', '.join(RESTORE_MODES)}, got {restore!r}")
        self.root = root.absolute()
        self.restore_mode: RestoreMode = restore
        self.wait_s = wait_s
        self.poll_s = poll_s

    def _copier(self) -> _Copier:
        return _Copier(self.restore_mode)

    # ---- keys and paths -------------------------------------------------------------------------------

    def key_for(
        self, ws: Path, recipe: AppRecipe, *, repository: str, provider: str, mount: str = ""
    ) -> CacheKey | str:
        """The key of ``ws``'s setup, or why it is not cached (no lock file, nothing to cache). Reads the lock
        files of ``ws`` as they are now. ``mount``: the fixed path setup sees every workspace at (``""``: its
        own path; see :class:`CacheKey`)."""
        try:
            lock_files = lock_file_digests(ws, recipe)
            lock_hash = dependency_lock_hash(ws, recipe)
        except EnvironmentError as exc:
            return f"not cached: {exc}"
        if lock_hash is None:
            return "not cached: no lock file pins what setup installs"
        paths = cached_paths(recipe, list(lock_files))
        if not paths:
            if recipe.cache is not None:
                return "not cached: the recipe declares cache: []"
            return f"not cached: no install directory is known for {', '.join(lock_files)}; declare `cache`"
        unkeyed = CacheKey(
            key="",
            repository=repository,
            provider=provider,
            platform=f"{os.uname().sysname.lower()}-{os.uname().machine}",
            setup=list(recipe.setup),
            env=dict(recipe.env),
            secrets=dict(recipe.secrets),
            paths=paths,
            lock_files=lock_files,
            lock_hash=lock_hash,
            mount=mount,
        )
        fields = {"format": FORMAT, **unkeyed.model_dump(exclude={"key"})}
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
        return unkeyed.model_copy(update={"key": hashlib.sha256(canonical).hexdigest()})

    def occupied(self, key: CacheKey, ws: Path) -> str:
        """Why ``ws`` cannot take a restore of ``key`` (a cached path already exists there: part of the checkout,
        or left by an earlier setup), or ``""``."""
        present = [path for path in key.paths if os.path.lexists(ws / path)]
        return f"not cached: {', '.join(present)} already exists in the workspace" if present else ""

    def entry_path(self, key: CacheKey) -> Path:
        return self.root / path_key(key.repository) / key.key[:32]

    # ---- reading --------------------------------------------------------------------------------------

    def read_record(self, entry: Path, key: CacheKey | None = None) -> BuildRecord | None:
        """The entry's build record if it is complete (and for ``key``, when given); else ``None``."""
        try:
            data = read_json(entry / RECORD_NAME)
        except (OSError, ValueError):
            return None
        if data is None:
            return None
        try:
            record = BuildRecord.model_validate(data)
        except ValidationError:
            return None
        if key is not None and record.for_key() != key:
            return None
        return record

    def entries(self) -> list[Path]:
        """Complete-looking entries and leftovers (unfinished builds, interrupted removals), sorted."""
        found: list[Path] = []
        if not self.root.is_dir():
            return found
        for repo in sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            with contextlib.suppress(FileNotFoundError):
                found.extend(sorted(p for p in repo.iterdir() if p.is_dir() and not p.is_symlink()))
        return found

    # ---- restoring --------------------------------------------------------------------------------------

    def restore(self, key: CacheKey, ws: Path) -> Restored | str:
        """Put the entry for ``key`` into ``ws`` (see the contracts); or say why not, leaving ``ws`` as it was."""
        started = time.monotonic()
        entry = self.entry_path(key)
        if not entry.is_dir():
            return "no entry yet"
        ws = ws.absolute()
        with locked(self.use_lock(entry), shared=True):
            record = self.read_record(entry, key)
            if record is None:
                return f"entry {entry.name} has no complete build record"
            staging = ws / f".durafix-restore-{uuid.uuid4().hex}"
            moved: list[Path] = []
            try:
                copier = self._copier()
                relink = None if record.mount else _relinker(record, ws)
                digest = _copy_paths(entry / TREE_NAME, staging, record.paths, copier, relink)
                if digest != record.tree_digest:
                    return f"entry {entry.name} changed since it was built; not used"
                if not record.mount:
                    problem = _relocate(staging, record, ws)
                    if problem:
                        return f"entry {entry.name} {problem}; not used"
                for path in record.paths:
                    (ws / path).parent.mkdir(parents=True, exist_ok=True)
                    os.rename(staging / path, ws / path)
                    moved.append(ws / path)
            except OSError as exc:
                for placed in moved:
                    remove_tree(placed)
                return f"restore from entry {entry.name} failed: {exc}"
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            with contextlib.suppress(OSError):
                self.stamp_path(entry).touch()
        return Restored(record=record, method=copier.summary(), seconds=time.monotonic() - started)

    # ---- building ---------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def building(self, key: CacheKey, progress: Progress) -> Iterator[bool]:
        """Hold the key's build lock for the block, waiting up to ``wait_s`` for another builder; yields whether
        it is held. Holding it, leftovers of dead builders of this key are removed first."""
        entry = self.entry_path(key)

        def waiting() -> None:
            progress(f"setup: waiting for another build of dependency cache entry {entry.name[:12]}")

        with locked_within(self.build_lock(entry), self.wait_s, poll_s=self.poll_s, on_wait=waiting) as held:
            if held:
                self._remove_leftovers(entry)
            yield held

    def checkout_state(self, ws: Path) -> frozenset[tuple[str, str]] | None:
        """What ``git status`` says of ``ws`` now, as (status, path) pairs (``None``: not a git checkout), to
        compare with after setup. Ignored and untracked directories count as one path each.

        Setup (untrusted) runs between the two calls, so git runs through a git directory of the worker's own
        (:func:`environments.git.isolated_git`): the workspace's configuration, attributes file and hooks are
        never read, its HEAD and index only as data."""
        try:
            with isolated_git(ws) as git:
                out = git.run(
                    ["--no-optional-locks", "status", "--porcelain=v1", "-z", "--ignored=traditional", "-unormal"]
                )
        except GitError:
            return None
        return frozenset(_status_items(out))

    def store(
        self, key: CacheKey, ws: Path, before: frozenset[tuple[str, str]] | None, *, exclusive: bool
    ) -> BuildRecord | str:
        """Store ``ws``'s cached paths, as setup just left them, as the entry for ``key``; or say why not.

        ``before``: :meth:`checkout_state` before setup. ``exclusive``: the caller holds the build lock (only then
        is a damaged entry under the same name replaced). Losing the rename to a complete entry returns that
        entry's record; the copy built here is dropped.
        """
        ws = ws.absolute()
        missing = [path for path in key.paths if not os.path.lexists(ws / path)]
        if missing:
            # A default path next to a lock file outside the root (requirements/.venv) is one setup never makes.
            return f"not cached: setup did not create {', '.join(missing)}; declare what it creates in `cache`"
        after = self.checkout_state(ws)
        if before is None or after is None:
            return "not cached: cannot tell what setup changed (the workspace is not a git checkout)"
        outside = sorted(
            {
                path
                for _, path in after - before
                if not any(_within(path, cached) for cached in key.paths) and "__pycache__" not in path.split("/")
            }
        )
        if outside:
            return f"not cached: setup also changed {', '.join(outside[:3])}, which the cache would not restore"
        entry = self.entry_path(key)
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_name(f".{entry.name}{TMP_MARK}{uuid.uuid4().hex}")
        tmp_lock = tmp.with_name(tmp.name + ".lock")
        try:
            with locked(tmp_lock):
                try:
                    return self._build(key, ws, entry, tmp, exclusive=exclusive)
                except OSError as exc:
                    return f"not cached: {exc}"
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
        finally:
            tmp_lock.unlink(missing_ok=True)

    def _build(self, key: CacheKey, ws: Path, entry: Path, tmp: Path, *, exclusive: bool) -> BuildRecord | str:
        copier = self._copier()
        tree = tmp / TREE_NAME
        os.mkdir(tmp)
        plan = _plan_relocation(ws, key)
        if isinstance(plan, str):
            return plan
        relocate, drop, restored_digest = plan
        _copy_paths(ws, tree, key.paths, copier, relink=None)
        files, size = _count(tree, key.paths)
        now = time.time()
        record = BuildRecord(
            format=FORMAT,
            **key.model_dump(),
            built_in=str(ws),
            built_in_real=os.path.realpath(ws),
            relocate=relocate,
            drop=drop,
            restored_digest=restored_digest,
            tree_digest=_digest(tree, key.paths),
            files=files,
            size_bytes=size,
            method=copier.summary(),
            created=now,
            created_at=datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
        )
        write_json_atomic(tmp / RECORD_NAME, record.model_dump(mode="json"))
        (tmp / STAMP_NAME).touch()
        try:
            os.rename(tmp, entry)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            existing = self.read_record(entry, key)
            if existing is not None and existing.tree_digest == _digest(entry / TREE_NAME, existing.paths):
                return existing
            if not exclusive:
                return "not cached: a damaged entry is in the way and another builder holds the lock"
            return self._replace(entry, tmp, record)
        return record

    def discard(self, key: CacheKey) -> bool:
        """Remove ``key``'s entry (one that failed its recipe's ``setup_check``), unless it is being restored from
        right now; whether it is gone. The caller holds the key's build lock (:meth:`building`)."""
        entry = self.entry_path(key)
        with try_locked(self.use_lock(entry)) as free:
            if not free:
                return False
            doomed = entry.with_name(f".{entry.name}{REMOVING_MARK}{uuid.uuid4().hex}")
            try:
                os.rename(entry, doomed)
            except FileNotFoundError:
                return True
        remove_tree(doomed)
        return True

    def _replace(self, entry: Path, tmp: Path, record: BuildRecord) -> BuildRecord | str:
        """Swap a damaged entry for the one just built, unless it is being restored from right now."""
        with try_locked(self.use_lock(entry)) as free:
            if not free:
                return "not cached: a damaged entry is in the way and is being read"
            doomed = entry.with_name(f".{entry.name}{REMOVING_MARK}{uuid.uuid4().hex}")
            os.rename(entry, doomed)
            os.rename(tmp, entry)
        remove_tree(doomed)
        return record

    def _remove_leftovers(self, entry: Path) -> None:
        """What dead builders of ``entry`` left: unfinished builds whose builder's lock is free, and interrupted
        removals (only ever started under the build lock, which the caller now holds)."""
        for leftover in entry.parent.glob(f".{entry.name}{REMOVING_MARK}*"):
            discard_tree(leftover)
        remove_abandoned(entry.parent.glob(f".{entry.name}{TMP_MARK}*"), discard_tree)


class _Copier:
    """Puts one file at a new path, a file of its own: a reflink, else a copy (``copy`` mode: always a copy).
    Never a hard link (see the module: a workspace's in-place write would reach the entry). Remembers what the
    filesystem refused, so each refusal is paid once per tree, and counts each method."""

    def __init__(self, mode: RestoreMode) -> None:
        self.reflink = mode == "auto"
        self.counts = {"reflink": 0, "copy": 0}

    def put(self, src: Path, dst: Path) -> None:
        if self.reflink:
            try:
                _reflink(src, dst)
            except OSError as exc:
                if exc.errno not in _NO_REFLINK:
                    raise
                self.reflink = False
            else:
                self.counts["reflink"] += 1
                return
        _copy(src, dst)
        self.counts["copy"] += 1

    def summary(self) -> str:
        """``copy`` or ``reflink 1200, copy 3``: the methods used, by how many files."""
        used = {name: count for name, count in self.counts.items() if count}
        if len(used) == 1:
            return next(iter(used))
        return ", ".join(f"{name} {count}" for name, count in used.items()) or "none"


def _copy(src: Path, dst: Path) -> None:
    """A new file ``dst`` with ``src``'s bytes, mode and times (what the shape digest compares), in fewer
    system calls than :func:`shutil.copy2` (no extended attributes or flags: an install does not use them)."""
    st = os.lstat(src)
    fd_in = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        fd_out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            _copy_bytes(fd_in, fd_out, st.st_size)
            os.fchmod(fd_out, stat.S_IMODE(st.st_mode))
            os.utime(fd_out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)


def _copy_bytes(fd_in: int, fd_out: int, size: int) -> None:
    remaining = size
    try:
        while remaining > 0:
            sent = os.copy_file_range(fd_in, fd_out, remaining)
            if sent == 0:
                return
            remaining -= sent
    except OSError as exc:
        # copy_file_range is refused between some filesystems and by some (older kernels, FUSE): read and write.
        if exc.errno not in _NO_REFLINK or remaining != size:
            raise
        while chunk := os.read(fd_in, 1 << 20):
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd_out, view) :]


def _reflink(src: Path, dst: Path) -> None:
    with src.open("rb") as source:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.ioctl(fd, _FICLONE, source.fileno())
        except OSError:
            os.close(fd)
            dst.unlink()
            raise
        os.close(fd)
    shutil.copystat(src, dst, follow_symlinks=False)


def _walk(root: Path, paths: Sequence[str]) -> Iterator[tuple[str, os.stat_result]]:
    """Each of ``paths`` under ``root`` and everything beneath it (not following links), depth first in name
    order, as (path relative to ``root``, lstat). The order is what makes :func:`_digest` reproducible."""

    def below(rel: str) -> Iterator[tuple[str, os.stat_result]]:
        with os.scandir(root / rel) as it:
            children = sorted(it, key=lambda e: e.name)
        for child in children:
            child_rel = f"{rel}/{child.name}"
            st = child.stat(follow_symlinks=False)
            yield child_rel, st
            if stat.S_ISDIR(st.st_mode):
                yield from below(child_rel)

    for path in sorted(paths):
        st = os.lstat(root / path)
        yield path, st
        if stat.S_ISDIR(st.st_mode):
            yield from below(path)


def _line(root: Path, rel: str, st: os.stat_result) -> bytes:
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISDIR(st.st_mode):
        return f"d {rel} {mode:o}\n".encode()
    if stat.S_ISLNK(st.st_mode):
        return f"l {rel} {os.readlink(root / rel)}\n".encode()
    if stat.S_ISREG(st.st_mode):
        return f"f {rel} {mode:o} {st.st_size} {st.st_mtime_ns}\n".encode()
    return f"o {rel}\n".encode()


def _digest(root: Path, paths: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for rel, st in _walk(root, paths):
        digest.update(_line(root, rel, st))
    return digest.hexdigest()


def _copy_paths(
    src_root: Path, dst_root: Path, paths: Sequence[str], copier: _Copier, relink: dict[str, str] | None
) -> str:
    """Copy ``paths`` from ``src_root`` to ``dst_root`` (files through ``copier``, symlinks recreated with their
    targets rewritten by ``relink``, sockets and fifos left out); returns the source tree's :func:`_digest`.

    Directory modes are applied last, so a read-only directory is still filled."""
    digest = hashlib.sha256()
    dir_modes: list[tuple[Path, int]] = []
    for rel, st in _walk(src_root, paths):
        digest.update(_line(src_root, rel, st))
        src, dst = src_root / rel, dst_root / rel
        if rel in paths:
            dst.parent.mkdir(parents=True, exist_ok=True)
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(dst, 0o700)
            dir_modes.append((dst, stat.S_IMODE(st.st_mode)))
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(_relinked(os.readlink(src), relink), dst)
        elif stat.S_ISREG(st.st_mode):
            copier.put(src, dst)
    for path, mode in reversed(dir_modes):
        os.chmod(path, mode)
    return digest.hexdigest()


def _count(root: Path, paths: Sequence[str]) -> tuple[int, int]:
    files = size = 0
    for _rel, st in _walk(root, paths):
        if stat.S_ISREG(st.st_mode):
            files += 1
            size += st.st_size
    return files, size


def _workspace_names(ws: Path) -> list[bytes]:
    """The spellings of ``ws``'s path a tool may have written: as given, and resolved (a shell's ``pwd -P``,
    Python's ``getcwd``)."""
    return sorted({str(ws).encode(), os.path.realpath(ws).encode()})


def _relinker(record: BuildRecord, ws: Path) -> dict[str, str]:
    """Old workspace path -> new one, for each spelling (see :func:`_workspace_names`); longest first."""
    pairs = {record.built_in: str(ws), record.built_in_real: os.path.realpath(ws)}
    return {old: pairs[old] for old in sorted(pairs, key=len, reverse=True)}


def _relinked(target: str, relink: dict[str, str] | None) -> str:
    for old, new in (relink or {}).items():
        if target == old or target.startswith(old + "/"):
            return new + target[len(old) :]
    return target


def _mention(path: Path, names: list[bytes]) -> Literal["none", "text", "binary"]:
    """Whether the (non-empty) file names one of ``names``, and whether it is text (no NUL byte) or binary."""
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if all(data.find(name) == -1 for name in names):
            return "none"
        return "binary" if data.find(b"\0") != -1 else "text"


def _plan_relocation(ws: Path, key: CacheKey) -> tuple[dict[str, str], list[str], str] | str:
    """What a restore of ``ws``'s cached paths must rewrite (text files naming ``ws``, with their sha256) and drop
    (bytecode naming it, and the bytecode of every rewritten source), and the digest the restored tree must then
    have; or why the tree cannot be stored.

    With a fixed ``mount`` nothing is relocated: a file naming the workspace's host path (which setup never saw)
    is refused rather than stored with a path only this workspace has."""
    names = _workspace_names(ws)
    relocate: dict[str, str] = {}
    drop: set[str] = set()
    for rel, st in _walk(ws, key.paths):
        if not stat.S_ISREG(st.st_mode) or not st.st_size:
            continue
        mention = _mention(ws / rel, names)
        if mention == "none":
            continue
        if key.mount:
            return f"not cached: {rel} names the workspace's host path, not {key.mount} where setup ran"
        if rel.endswith(_BYTECODE):
            drop.add(rel)
        elif mention == "text":
            relocate[rel] = hashlib.sha256((ws / rel).read_bytes()).hexdigest()
        else:
            return f"not cached: {rel} is a binary file naming the workspace path, which cannot be relocated"
    if key.mount:
        return {}, [], ""
    for rel in relocate:
        source = PurePosixPath(rel)
        if source.suffix == ".py":
            cache_dir = ws / source.parent / "__pycache__"
            if cache_dir.is_dir() and not cache_dir.is_symlink():
                drop.update(str(source.parent / "__pycache__" / p.name) for p in cache_dir.glob(f"{source.stem}.*.pyc"))
    links = _links_into(ws, key.paths, names)
    return relocate, sorted(drop), _restored_digest(ws, key.paths, set(relocate) | links, set(drop))


def _links_into(root: Path, paths: Sequence[str], names: list[bytes]) -> set[str]:
    """The symlinks under ``root``'s ``paths`` whose target is at or under one of ``names`` (they are relinked)."""
    found = set()
    for rel, st in _walk(root, paths):
        if stat.S_ISLNK(st.st_mode):
            target = os.fsencode(os.readlink(root / rel))
            if any(target == name or target.startswith(name + b"/") for name in names):
                found.add(rel)
    return found


def _restored_digest(root: Path, paths: Sequence[str], loose: set[str], dropped: set[str]) -> str:
    """The shape digest of a tree as a relocating restore leaves it: ``dropped`` files absent, and for the
    ``loose`` ones (rewritten files, relinked symlinks) only their type, path and mode, since their size, time and
    target depend on the new workspace's path."""
    digest = hashlib.sha256()
    for rel, st in _walk(root, paths):
        if rel in dropped:
            continue
        if rel in loose:
            kind = "l" if stat.S_ISLNK(st.st_mode) else "f"
            digest.update(f"{kind} {rel} {stat.S_IMODE(st.st_mode):o} relocated\n".encode())
        else:
            digest.update(_line(root, rel, st))
    return digest.hexdigest()


def _relocate(staging: Path, record: BuildRecord, ws: Path) -> str:
    """Relocate a restored tree in ``staging`` to ``ws`` exactly; or say why it cannot be used.

    Each rewritten file's stored bytes are checked against the record first; it is then replaced by a new file
    (written aside, renamed over, never written in place, so a reflinked file's clone is never half-written) with
    its mode and a fresh mtime, so nothing judging staleness by time takes it for what was built. The bytecode the
    record lists is removed (Python compiles it again from the relocated sources). Last the tree's shape is
    checked against the record's :attr:`BuildRecord.restored_digest`."""
    pairs = _relinker(record, ws)
    for rel, sha in record.relocate.items():
        path = staging / rel
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != sha:
            return f"changed since it was built ({rel})"
        for old, new in pairs.items():
            data = data.replace(old.encode(), new.encode())
        tmp = path.with_name(f".{path.name}.relocate-{uuid.uuid4().hex}")
        tmp.write_bytes(data)
        os.chmod(tmp, stat.S_IMODE(os.lstat(path).st_mode))
        os.replace(tmp, path)
    for rel in record.drop:
        (staging / rel).unlink(missing_ok=True)
    names = _workspace_names(ws)
    links = _links_into(staging, record.paths, names)
    if (
        _restored_digest(staging, record.paths, set(record.relocate) | links, set(record.drop))
        != record.restored_digest
    ):
        return "does not match its build record once relocated"
    return ""


_STATUS_ARGS = ("--porcelain=v1", "-z", "--ignored=traditional", "-unormal")


def _status_items(out: str) -> Iterator[tuple[str, str]]:
    """(``XY``, path without a directory's slash) of each item of ``git status --porcelain=v1 -z``; a rename or
    copy is followed by its source path, which belongs to it."""
    items = iter(out.split("\0"))
    for item in items:
        if len(item) < 4:
            continue
        code, path = item[:2], item[3:].rstrip("/")
        if code[0] in "RC":
            path = f"{path} (from {next(items, '')})"
        yield code, path


def _within(path: str, cached: str) -> bool:
    return PurePosixPath(path) == PurePosixPath(cached) or PurePosixPath(path).is_relative_to(cached)
