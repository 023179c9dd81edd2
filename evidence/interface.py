"""The evidence store's typed interface: artifact references and the store protocol.

Workflow state never holds artifact bytes, only :class:`ArtifactRef` values: where the bytes are (``key``),
what they hash to (``sha256``) and which revision they belong to. Every :class:`ArtifactStore` honours:

- Content addressing. The key is derived from the content's sha256 (plus its kind and media type), so the
  same bytes put twice land on the same key.
- Idempotent puts. A second put of the same content returns a ref with the same key, sha256, size and
  ``created_at`` (the time the content was first stored), so refs built on a retried activity equal the
  first attempt's, and so does any digest computed over them. A repeated put also refreshes the object's
  last-put time, which retention counts from.
- Conditional create. The final object is created only if absent (S3 ``If-None-Match: *``; local: a hard
  link, which fails on an existing name), so concurrent writers never clobber each other; losing the race
  is a success because the winner stored the same bytes.
- Verified reads. ``get_to_file`` and ``read_bytes`` hash what they read and raise :class:`IntegrityError`
  when it does not match ``ref.sha256``; a partial destination file is removed first.
- Streaming. Files are hashed while copied in bounded chunks; no store holds a whole large artifact in
  memory.
- Retention. ``delete_expired`` deletes objects whose kind has a retention period and whose last put is
  older than it; kinds without a retention period are kept forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Protocol, Required, TypedDict, Unpack

from pydantic import BaseModel, Field


class ArtifactKind(StrEnum):
    TRACE = "trace"
    SCREENSHOT = "screenshot"
    VIDEO = "video"
    LOG = "log"
    PATCH = "patch"
    PROCEDURE = "procedure"
    SPEC = "spec"
    BUNDLE = "bundle"
    REPORT = "report"
    MANIFEST = "manifest"
    TEST_OUTPUT = "test-output"
    OTHER = "other"


class ArtifactRef(BaseModel):
    """A stored artifact, as workflow state and evidence manifests name it."""

    key: str = Field(description="object key inside the store: <kind>/<sha256[:2]>/<sha256><suffix>")
    sha256: str
    size: int = Field(ge=0)
    kind: ArtifactKind
    media_type: str
    name: str = Field(description="a human-readable file name, e.g. the name of the file that was put")
    run_id: str
    revision: str | None = Field(default=None, description="the commit this artifact was produced on")
    created_at: str = Field(description="ISO 8601 UTC time the content was first stored")


class ArtifactError(Exception):
    """Base class of the evidence store's errors."""


class IntegrityError(ArtifactError):
    """Stored bytes do not hash to the sha256 their ref names (tampered or corrupted)."""


class ArtifactMissingError(ArtifactError, LookupError):
    """No object under the ref's key (never stored, or deleted by retention)."""


class PutOptions(TypedDict, total=False):
    """The keyword arguments of both puts: ``kind`` and ``run_id`` always; ``name``, ``revision`` and ``media_type``
    when the caller has them (left out, they are None)."""

    kind: Required[ArtifactKind]
    run_id: Required[str]
    name: str | None
    revision: str | None
    media_type: str | None


@dataclass(frozen=True)
class PutRequest:
    """What one put stores its bytes as, as the caller named it; settled once by :meth:`ArtifactStore.put_file`
    and :meth:`ArtifactStore.put_bytes` (a file's ``name`` defaults to the file's name), so a store implements
    only how the bytes are written. ``media_type`` is the caller's, unresolved: a store resolves it with
    ``evidence.keys.media_type_for`` before deriving the key."""

    kind: ArtifactKind
    run_id: str
    name: str | None
    revision: str | None
    media_type: str | None

    @classmethod
    def of(cls, options: PutOptions, name: str | None) -> PutRequest:
        """The request a put with ``options`` makes, named ``name`` (the put's default applied)."""
        return cls(options["kind"], options["run_id"], name, options.get("revision"), options.get("media_type"))

    def ref(self, key: str, sha256: str, size: int, media_type: str, created_at: str) -> ArtifactRef:
        """The ref of the object stored under ``key``; an unnamed put is named by the key's last segment."""
        return ArtifactRef(
            key=key,
            sha256=sha256,
            size=size,
            kind=self.kind,
            media_type=media_type,
            name=self.name or key.rsplit("/", 1)[-1],
            run_id=self.run_id,
            revision=self.revision,
            created_at=created_at,
        )


class ArtifactStore(Protocol):
    """Where evidence lives; see the module docstring for the contracts every implementation honours.

    The two puts are written here once: a store subclasses this protocol explicitly and implements
    ``_store_file`` and ``_store_bytes``, which receive the put's settled :class:`PutRequest`.
    """

    def put_file(self, path: Path, **options: Unpack[PutOptions]) -> ArtifactRef:
        """Store a file's content (streamed); ``name`` defaults to the file's name."""
        return self._store_file(path, PutRequest.of(options, options.get("name") or path.name))

    def put_bytes(self, data: bytes, **options: Unpack[PutOptions]) -> ArtifactRef:
        """Store a small in-memory artifact (a manifest, a patch, a log excerpt)."""
        return self._store_bytes(data, PutRequest.of(options, options.get("name")))

    def _store_file(self, path: Path, request: PutRequest) -> ArtifactRef:
        """Store ``path``'s content as ``request`` says (the contracts of the module docstring)."""
        ...

    def _store_bytes(self, data: bytes, request: PutRequest) -> ArtifactRef:
        """Store ``data`` as ``request`` says (the contracts of the module docstring)."""
        ...

    def get_to_file(self, ref: ArtifactRef, dest: Path) -> Path:
        """Stream the artifact to ``dest`` (replaced atomically), verifying its sha256."""
        ...

    def read_bytes(self, ref: ArtifactRef) -> bytes:
        """The artifact's bytes, verified against its sha256."""
        ...

    def exists(self, ref: ArtifactRef) -> bool: ...

    def url_for(self, ref: ArtifactRef, expires_s: int = 7 * 24 * 3600) -> str:
        """A URL a reviewer's browser can open (presigned on S3, so it expires after ``expires_s``)."""
        ...

    def delete_expired(self, now: datetime, retention: dict[ArtifactKind, float]) -> list[str]:
        """Delete objects of each kind in ``retention`` last put more than that many days before ``now``.

        Returns the deleted keys.
        """
        ...
