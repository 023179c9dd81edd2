"""Filesystem primitives the ownership records rely on: path-safe keys, atomic writes, advisory locks.

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
import uuid
from collections.abc import Iterator
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
