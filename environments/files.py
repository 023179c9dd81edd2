"""Filesystem primitives the ownership records and caches rely on: path-safe keys, atomic writes, advisory locks.

Records are written to a temporary sibling and renamed over the target, so a reader sees either the old
record or the new one, never a torn file. Locks are ``flock`` locks on dedicated lock files: they are held
per open file description, so they exclude other threads of this process as well as other processes, and
the kernel drops them when a holder dies (a crashed worker never leaves a lock behind).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def path_key(identity: str, *, max_readable: int = 48) -> str:
    """A directory-safe, collision-resistant name for an ID such as ``repair:OWNER/REPO#12``.

    The readable prefix is for humans browsing the state directory; the hash suffix is what makes two
    different IDs never share a name.
    """
    readable = _UNSAFE.sub("-", identity).strip("-.")[:max_readable] or "id"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return f"{readable}-{digest}"


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the previous content or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        json.dump(data, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The record at ``path``, or ``None`` when it does not exist."""
    try:
        with path.open(encoding="utf-8") as fh:
            data: dict[str, Any] = json.load(fh)
    except FileNotFoundError:
        return None
    return data


@contextlib.contextmanager
def locked(lock_path: Path, *, shared: bool = False) -> Iterator[None]:
    """Hold an advisory lock on ``lock_path`` (created if missing) for the duration of the block."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def remove_tree(path: Path) -> None:
    """Remove a directory tree (or file) if present; idempotent.

    The tree is first renamed to a unique sibling so that a crash half-way through deletion never leaves
    a partly deleted tree under the original name.
    """
    if not path.exists() and not path.is_symlink():
        return
    if path.is_dir() and not path.is_symlink():
        doomed = path.with_name(f".{path.name}.removing-{uuid.uuid4().hex}")
        os.rename(path, doomed)
        shutil.rmtree(doomed)
    else:
        path.unlink()


def discard_tree(path: Path) -> None:
    """Remove ``path`` and everything under it without following a symbolic link (a link is removed, never
    its target), as far as it can: errors are ignored, what could not be removed stays.

    A directory that is not writable (something made it read-only) is made writable (0700) and the removal
    retried; it is opened with ``O_NOFOLLOW`` and changed through that descriptor, so no link is followed. For
    trees whose files untrusted code may have written, where leaving a remnant beats failing; unlike
    :func:`remove_tree`, which raises on what it cannot remove."""

    def retry(function: Callable[..., object], failed: str, exc: BaseException) -> None:
        if not isinstance(exc, PermissionError):
            return
        parent = os.path.dirname(failed)
        with contextlib.suppress(OSError):
            fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
            function(failed)

    if os.path.islink(path):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry)
    else:
        shutil.rmtree(path, onerror=lambda function, failed, info: retry(function, failed, info[1]))
    if os.path.lexists(path):
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def try_locked(lock_path: Path, *, create: bool = True) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``lock_path`` if nobody holds it; yields whether it is held. Never waits.

    The same advisory locks as :func:`locked`, so it excludes what they exclude. With
    ``create=False`` a missing lock file is reported free without being created (nobody can hold it).
    """
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    if create:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(lock_path, flags, 0o600)
    except FileNotFoundError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        os.close(fd)


def remove_abandoned(leftovers: Iterable[Path], remove: Callable[[Path], None]) -> None:
    """Remove with ``remove`` each directory among ``leftovers`` whose user died, then its lock file.

    For work directories used only under an exclusive lock on their sibling ``<name>.lock`` (see :func:`locked`),
    held from before the directory is made until after it is removed: a directory whose lock nobody holds (or
    whose lock file is gone) was left by a process that died, and nobody will read it. Lock files and anything
    that is not a directory among ``leftovers`` (such as a glob of both) are passed over; a directory in use is
    left alone. ``remove`` decides whether a failure to remove raises.
    """
    for leftover in leftovers:
        if leftover.name.endswith(".lock") or not leftover.is_dir():
            continue
        lock = leftover.with_name(leftover.name + ".lock")
        with try_locked(lock, create=False) as free:
            if free:
                remove(leftover)
                lock.unlink(missing_ok=True)


@contextlib.contextmanager
def locked_within(
    lock_path: Path, wait_s: float, *, poll_s: float = 0.2, on_wait: Callable[[], None] | None = None
) -> Iterator[bool]:
    """Hold an exclusive lock on ``lock_path`` for the block if it can be had within ``wait_s``; yields whether
    it is held (``False``: the block runs without it, and must be safe that way).

    Polls instead of blocking in ``flock``, so a thread waiting here can still be interrupted (an activity's
    cancellation) and a holder that hangs delays the caller by ``wait_s`` at most. ``on_wait`` is called once,
    when the lock is first found taken.
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not waited and on_wait is not None:
                    on_wait()
                waited = True
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(poll_s)
            else:
                yield True
                return
    finally:
        os.close(fd)
