"""Object keys and media types, derived deterministically so every worker computes the same key.

The key is ``<kind>/<sha256[:2]>/<sha256><suffix>``: the kind prefix lets retention list one kind at a time,
the two-character fan-out keeps local directories small, and the suffix (from a fixed media-type table, never
the host's ``mimetypes`` database, which differs between machines) lets a browser opening a ``file://`` URL
or a download pick the right viewer.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from pathlib import PurePath

from evidence.interface import ArtifactKind, ArtifactRef, PutRequest

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_KEY_RE = re.compile(r"^(?P<kind>[a-z-]+)/(?P<fan>[0-9a-f]{2})/(?P<sha>[0-9a-f]{64})(?:\.[a-z0-9]{1,8})?$")

_SUFFIX_BY_MEDIA_TYPE = {
    "application/gzip": ".gz",
    "application/json": ".json",
    "application/x-ndjson": ".jsonl",
    "application/x-tar": ".tar",
    "application/yaml": ".yaml",
    "application/zip": ".zip",
    "image/jpeg": ".jpg",
    "image/png": ".png",
    "image/webp": ".webp",
    "text/html": ".html",
    "text/plain": ".txt",
    "text/x-diff": ".diff",
    "video/webm": ".webm",
}

_MEDIA_TYPE_BY_SUFFIX = {
    ".diff": "text/x-diff",
    ".gz": "application/gzip",
    ".htm": "text/html",
    ".html": "text/html",
    ".jpeg": "image/jpeg",
    ".jpg": "image/jpeg",
    ".json": "application/json",
    ".jsonl": "application/x-ndjson",
    ".log": "text/plain",
    ".patch": "text/x-diff",
    ".png": "image/png",
    ".tar": "application/x-tar",
    ".txt": "text/plain",
    ".webm": "video/webm",
    ".webp": "image/webp",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
    ".zip": "application/zip",
}

_MEDIA_TYPE_BY_KIND = {
    ArtifactKind.TRACE: "application/zip",
    ArtifactKind.SCREENSHOT: "image/png",
    ArtifactKind.VIDEO: "video/webm",
    ArtifactKind.LOG: "text/plain",
    ArtifactKind.PATCH: "text/x-diff",
    ArtifactKind.PROCEDURE: "application/yaml",
    ArtifactKind.SPEC: "application/json",
    ArtifactKind.BUNDLE: "application/gzip",
    ArtifactKind.REPORT: "text/html",
    ArtifactKind.MANIFEST: "application/json",
    ArtifactKind.TEST_OUTPUT: "text/plain",
}

OCTET_STREAM = "application/octet-stream"


def media_type_for(kind: ArtifactKind, name: str | None, explicit: str | None) -> str:
    """The explicit media type, else one implied by the name's suffix, else the kind's usual type."""
    if explicit:
        return explicit
    if name:
        by_suffix = _MEDIA_TYPE_BY_SUFFIX.get(PurePath(name).suffix.lower())
        if by_suffix is not None:
            return by_suffix
    return _MEDIA_TYPE_BY_KIND.get(kind, OCTET_STREAM)


def object_key(kind: ArtifactKind, sha256: str, media_type: str) -> str:
    if not SHA256_RE.match(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    suffix = _SUFFIX_BY_MEDIA_TYPE.get(media_type.split(";")[0].strip().lower(), "")
    return f"{kind.value}/{sha256[:2]}/{sha256}{suffix}"


def parse_key(key: str) -> tuple[ArtifactKind, str]:
    """The kind and sha256 a well-formed key names; ValueError for anything else (keys arrive from URLs)."""
    match = _KEY_RE.match(key)
    if match is None or match["sha"][:2] != match["fan"]:
        raise ValueError(f"not an artifact key: {key!r}")
    return ArtifactKind(match["kind"]), match["sha"]


def utc_iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_utc_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def marker_ref(data: bytes, *, kind: ArtifactKind, media_type: str, name: str, run_id: str) -> ArtifactRef:
    """The reference that ``data`` stored as a marker (tombstone, started mark) has in any store: its key
    depends on its bytes alone, so a worker that never wrote it can look for it. ``created_at`` is fixed:
    a marker says that, not when."""
    sha = hashlib.sha256(data).hexdigest()
    put = PutRequest(kind, run_id, name, revision=None, media_type=media_type)
    return put.ref(object_key(kind, sha, media_type), sha, len(data), media_type, created_at="1970-01-01T00:00:00Z")
