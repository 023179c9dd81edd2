"""A run's tombstone in the shared evidence store: the fence that holds across worker hosts.

Each provider and the workspace manager also keep a tombstone under their own state directory, which
fences late attempts on the same host. A stale attempt can wake on *another* environments host, one that
never saw the cleanup; so ``env.cleanup_run`` first writes this tombstone to the evidence store every
worker shares, and every activity that creates resources for a run checks it before creating anything.

The tombstone is an ordinary content-addressed artifact whose bytes depend only on the run ID, so any
worker can compute its key without having seen it, and writing it twice is the same conditional create.
Its kind (``other``) has no retention period unless an operator configures one.
"""

from __future__ import annotations

from environments.interface import RunFencedError
from evidence.interface import ArtifactKind, ArtifactRef, ArtifactStore
from evidence.keys import marker_ref

_MEDIA_TYPE = "text/plain"
_NAME = "run-tombstone.txt"


def _content(run_id: str) -> bytes:
    return f"durafix run tombstone\nrun: {run_id}\n".encode()


def tombstone_ref(run_id: str) -> ArtifactRef:
    """The reference the run's tombstone has (or would have) in any store."""
    return marker_ref(_content(run_id), kind=ArtifactKind.OTHER, media_type=_MEDIA_TYPE, name=_NAME, run_id=run_id)


def write_tombstone(store: ArtifactStore, run_id: str) -> ArtifactRef:
    """Fence ``run_id`` on every host; idempotent."""
    return store.put_bytes(_content(run_id), kind=ArtifactKind.OTHER, run_id=run_id, name=_NAME, media_type=_MEDIA_TYPE)


def ensure_not_fenced(store: ArtifactStore, run_id: str, what: str) -> None:
    """Raise :class:`RunFencedError` when the run was cleaned up anywhere."""
    if store.exists(tombstone_ref(run_id)):
        raise RunFencedError(f"run {run_id} was cleaned up; refusing {what}")
