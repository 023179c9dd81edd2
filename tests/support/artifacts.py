"""Artifact references for tests that need one without a store: a one-byte artifact of run ``r``."""

from __future__ import annotations

from evidence.interface import ArtifactKind, ArtifactRef


def artifact_ref(
    name: str,
    *,
    key: str,
    media_type: str,
    kind: ArtifactKind = ArtifactKind.OTHER,
    sha256: str = "0" * 64,
    created_at: str = "2026-01-01T00:00:00Z",
) -> ArtifactRef:
    """A reference to a one-byte artifact ``name`` of run ``r``, at no revision."""
    return ArtifactRef(
        key=key,
        sha256=sha256,
        size=1,
        kind=kind,
        media_type=media_type,
        name=name,
        run_id="r",
        revision=None,
        created_at=created_at,
    )
