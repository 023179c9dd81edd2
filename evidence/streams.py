"""Chunked copying and hashing, so large artifacts never sit whole in memory."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from evidence.interface import ArtifactRef, IntegrityError

CHUNK = 1024 * 1024


def read_chunks(src: BinaryIO) -> Iterator[bytes]:
    """``src`` from where it stands to its end, in chunks of at most :data:`CHUNK` bytes."""
    while chunk := src.read(CHUNK):
        yield chunk


def write_hashing(chunks: Iterable[bytes], dst: BinaryIO | None) -> tuple[str, int]:
    """Write ``chunks`` to ``dst`` (or only hash them when it is None); the sha256 hex digest and the size."""
    digest = hashlib.sha256()
    size = 0
    for chunk in chunks:
        digest.update(chunk)
        if dst is not None:
            dst.write(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def copy_hashing(src: BinaryIO, dst: BinaryIO) -> tuple[str, int]:
    """Copy ``src`` to ``dst`` in chunks; return the sha256 hex digest and size of what was copied."""
    return write_hashing(read_chunks(src), dst)


def hash_file(path: Path) -> tuple[str, int]:
    with path.open("rb") as f:
        return write_hashing(read_chunks(f), None)


def check_digest(ref: ArtifactRef, sha256: str, size: int) -> None:
    """Raise :class:`IntegrityError` unless what was read matches the ref."""
    if sha256 != ref.sha256 or size != ref.size:
        raise IntegrityError(
            f"artifact {ref.key} is corrupted: read {size} bytes hashing to {sha256}, "
            f"the ref names {ref.size} bytes hashing to {ref.sha256}"
        )


def write_verified(ref: ArtifactRef, chunks: Iterable[bytes], dest: Path) -> Path:
    """Write the artifact's ``chunks`` to ``dest``, replacing it atomically only once they match ``ref``.

    The bytes go to a temporary file beside ``dest`` first; on any failure (an :class:`IntegrityError`
    among them) that file is removed and ``dest`` is left as it was. ``chunks`` may be a generator that opens
    its source: nothing is read from it before the temporary file exists, and that file is closed either way.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            sha256, size = write_hashing(chunks, out)
        check_digest(ref, sha256, size)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest
