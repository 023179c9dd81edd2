"""The default artifact store: a content-addressed directory tree on local disk.

Layout under ``root``::

    objects/<key>         the bytes, read-only (0444)
    meta/<key>.json       sha256, size, media type and first-stored time
    tmp/                  uploads in progress (same filesystem, so a hard link publishes them)

A put streams into ``tmp/`` while hashing, then publishes with ``os.link(tmp, objects/<key>)``: the link is
the conditional create (it fails when the name exists, so a concurrent writer never clobbers a published
object, and a reader never sees a half-written one). Losing the race means the other writer stored the
same bytes, so the put succeeds with the stored object. The metadata file is created the same way; if a
crash left an object without one, the next put of that content writes it.

Retention counts from an object's modification time, which every put of that content refreshes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import BinaryIO

from evidence.interface import ArtifactKind, ArtifactMissingError, ArtifactRef, ArtifactStore, PutRequest
from evidence.keys import media_type_for, object_key, parse_key, utc_iso
from evidence.links import LinkSigner
from evidence.streams import check_digest, copy_hashing, read_chunks, write_hashing, write_verified

# Leftovers of crashed puts are swept by delete_expired once they are this old (no live put takes a day).
_STALE_TMP = timedelta(days=1)


class LocalArtifactStore(ArtifactStore):
    """:class:`~evidence.interface.ArtifactStore` on a local directory (see the module docstring).

    ``public_url`` is the base URL of ``durafix evidence serve`` over this root; without it ``url_for``
    answers ``file://`` URLs.
    """

    def __init__(self, root: Path, *, public_url: str | None = None, signer: LinkSigner | None = None) -> None:
        """``signer``: links from :meth:`url_for` carry its signature, so the evidence server opens them to a
        reviewer on another host who has no token (``evidence/serve.py``)."""
        self.root = root.resolve()
        self.public_url = public_url.rstrip("/") if public_url else None
        self.signer = signer
        for sub in ("objects", "meta", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    # ---- writes ----------------------------------------------------------------------------------------

    def _store_file(self, path: Path, request: PutRequest) -> ArtifactRef:
        def write(tmp: BinaryIO) -> tuple[str, int]:
            with path.open("rb") as src:
                return copy_hashing(src, tmp)

        return self._put(write, request)

    def _store_bytes(self, data: bytes, request: PutRequest) -> ArtifactRef:
        def write(tmp: BinaryIO) -> tuple[str, int]:
            return write_hashing([data], tmp)

        return self._put(write, request)

    def _put(self, write: Callable[[BinaryIO], tuple[str, int]], request: PutRequest) -> ArtifactRef:
        media = media_type_for(request.kind, request.name, request.media_type)
        fd, tmp_name = tempfile.mkstemp(dir=self.root / "tmp", prefix="put-")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out:
                sha256, size = write(out)
                out.flush()
                os.fsync(out.fileno())
            tmp.chmod(0o444)
            key = object_key(request.kind, sha256, media)
            final = self.root / "objects" / key
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(tmp, final)
                _fsync_dir(final.parent)
            except FileExistsError:
                # Same key means same bytes: the earlier writer's object stands. Touching it restarts its
                # retention clock, since a new run now refers to it.
                os.utime(final)
        finally:
            tmp.unlink(missing_ok=True)
        created_at = self._ensure_meta(key, sha256, size, media)
        return request.ref(key, sha256, size, media, created_at)

    def _ensure_meta(self, key: str, sha256: str, size: int, media_type: str) -> str:
        """The first-stored time of ``key``, writing its metadata file if it has none yet."""
        meta_path = self._meta_path(key)
        record = {"sha256": sha256, "size": size, "media_type": media_type, "created_at": utc_iso(datetime.now(UTC))}
        meta_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=self.root / "tmp", prefix="meta-")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(record, out, sort_keys=True)
            with contextlib.suppress(FileExistsError):
                os.link(tmp, meta_path)
        finally:
            tmp.unlink(missing_ok=True)
        created: str = json.loads(meta_path.read_text())["created_at"]
        return created

    # ---- reads -----------------------------------------------------------------------------------------

    def get_to_file(self, ref: ArtifactRef, dest: Path) -> Path:
        return write_verified(ref, self._chunks(ref.key), dest)

    def read_bytes(self, ref: ArtifactRef) -> bytes:
        with self.open_object(ref.key) as src:
            data = src.read()
        check_digest(ref, hashlib.sha256(data).hexdigest(), len(data))
        return data

    def exists(self, ref: ArtifactRef) -> bool:
        return self.object_path(ref.key).is_file()

    def url_for(self, ref: ArtifactRef, expires_s: int = 7 * 24 * 3600) -> str:
        """The evidence server's URL when one is configured (it never expires; signed with the store's
        ``signer`` when it has one), else a ``file://`` URL."""
        if self.public_url:
            path = f"/a/{ref.key}"
            return f"{self.public_url}{self.signer.sign(path) if self.signer else path}"
        return self.object_path(ref.key).as_uri()

    # ---- what the evidence server needs ----------------------------------------------------------------

    def object_path(self, key: str) -> Path:
        """Where ``key``'s bytes live; ValueError for a malformed key (so no key escapes the root)."""
        parse_key(key)
        return self.root / "objects" / key

    def open_object(self, key: str) -> BinaryIO:
        try:
            return self.object_path(key).open("rb")
        except FileNotFoundError as err:
            raise ArtifactMissingError(f"no artifact {key} in {self.root}") from err

    def _chunks(self, key: str) -> Iterator[bytes]:
        with self.open_object(key) as src:
            yield from read_chunks(src)

    def stored_meta(self, key: str) -> dict[str, object] | None:
        try:
            meta: dict[str, object] = json.loads(self._meta_path(key).read_text())
        except FileNotFoundError:
            return None
        return meta

    def keys(self, kind: ArtifactKind) -> Iterator[str]:
        base = self.root / "objects" / kind.value
        if not base.is_dir():
            return
        for path in sorted(base.glob("*/*")):
            yield path.relative_to(self.root / "objects").as_posix()

    # ---- retention -------------------------------------------------------------------------------------

    def delete_expired(self, now: datetime, retention: dict[ArtifactKind, float]) -> list[str]:
        deleted: list[str] = []
        for kind, days in retention.items():
            cutoff = (now - timedelta(days=days)).timestamp()
            for key in list(self.keys(kind)):
                path = self.object_path(key)
                try:
                    if path.stat().st_mtime >= cutoff:
                        continue
                    path.unlink()
                except FileNotFoundError:
                    continue
                self._meta_path(key).unlink(missing_ok=True)
                deleted.append(key)
        stale = (now - _STALE_TMP).timestamp()
        for leftover in (self.root / "tmp").iterdir():
            with contextlib.suppress(FileNotFoundError):
                if leftover.stat().st_mtime < stale:
                    leftover.unlink()
        return deleted

    def _meta_path(self, key: str) -> Path:
        parse_key(key)
        return self.root / "meta" / f"{key}.json"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
