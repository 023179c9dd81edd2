"""Chunked copying and hashing, so large artifacts never sit whole in memory."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from evidence.interface import ArtifactRef, IntegrityError

CHUNK = 1024 * 1024


def copy_hashing(src: BinaryIO, dst: BinaryIO) -> tuple[str, int]:
    """Copy ``src`` to ``dst`` in chunks; return the sha256 hex digest and size of what was copied."""
    digest = hashlib.sha256()
    size = 0
    while chunk := src.read(CHUNK):
        digest.update(chunk)
        dst.write(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def write_hashing(chunks: Iterable[bytes], dst: BinaryIO) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    for chunk in chunks:
        digest.update(chunk)
        dst.write(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def hash_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def check_digest(ref: ArtifactRef, sha256: str, size: int) -> None:
    """Raise :class:`IntegrityError` unless what was read matches the ref."""
    if sha256 != ref.sha256 or size != ref.size:
        raise IntegrityError(
            f"artifact {ref.key} is corrupted: read {size} bytes hashing to {sha256}, "
            f"the ref names {ref.size} bytes hashing to {ref.sha256}"
        )
