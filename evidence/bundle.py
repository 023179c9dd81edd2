"""The evidence bundle: one manifest naming everything a reviewer's approval stands on.

An :class:`EvidenceBundle` names the reproduction procedure, the base revision and the candidate commit,
what was observed on each (status, traces, screenshots, logs), the patch and the check results, every
artifact as an :class:`ArtifactRef` (so by sha256).

Its canonical JSON (sorted keys, no insignificant whitespace, UTF-8) is stored as a ``manifest`` artifact,
and :func:`bundle_digest` is the sha256 of exactly those bytes: the manifest's own ``sha256``. An approval
names this digest; anyone can fetch the manifest and re-hash it. The digest is stable across retries
because the bundle holds no clock of its own and store refs keep the time content was first stored.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from evidence.interface import ArtifactKind, ArtifactRef, ArtifactStore, IntegrityError

MANIFEST_NAME = "evidence-manifest.json"
_LATER_FIELDS = ("baseline", "regression")


class RevisionEvidence(BaseModel):
    """What the procedure observed on one revision, against what the pipeline expects there."""

    role: Literal["base", "candidate"]
    revision: str
    expected_status: str = Field(description="base: reproduced (the bug is there); candidate: not_reproduced")
    status: str
    detail: str = ""
    traces: list[ArtifactRef] = Field(default_factory=list)
    screenshots: list[ArtifactRef] = Field(default_factory=list)
    videos: list[ArtifactRef] = Field(default_factory=list)
    logs: list[ArtifactRef] = Field(default_factory=list)

    @property
    def as_expected(self) -> bool:
        return self.status == self.expected_status

    @classmethod
    def from_refs(
        cls,
        role: Literal["base", "candidate"],
        revision: str,
        status: str,
        refs: Iterable[ArtifactRef],
        detail: str = "",
    ) -> RevisionEvidence:
        """Sort a run's artifacts by kind (anything that is not a trace, screenshot or video counts as a log)."""
        evidence = cls(
            role=role,
            revision=revision,
            expected_status="reproduced" if role == "base" else "not_reproduced",
            status=status,
            detail=detail,
        )
        for ref in refs:
            if ref.kind == ArtifactKind.TRACE:
                evidence.traces.append(ref)
            elif ref.kind == ArtifactKind.SCREENSHOT:
                evidence.screenshots.append(ref)
            elif ref.kind == ArtifactKind.VIDEO:
                evidence.videos.append(ref)
            else:
                evidence.logs.append(ref)
        return evidence


class CheckResult(BaseModel):
    name: str
    passed: bool
    detail: str = ""
    output: ArtifactRef | None = None


class RegressionEvidence(BaseModel):
    """The regression proof: the patch's test files run on the base revision's code (``base_output``) and on
    the candidate (``candidate_output``; ``None`` when the candidate's full test run stands for it).
    ``status`` is ``proven`` when they fail on the base and pass on the candidate; ``fixed_cases`` names the
    test cases that do, when the recipe reports per test. Informational: the run's policy decides whether a
    missing proof fails a candidate, so it does not enter :attr:`EvidenceBundle.passed`."""

    status: str
    summary: str
    test_files: list[str] = Field(default_factory=list)
    fixed_cases: list[str] = Field(default_factory=list)
    base_output: ArtifactRef | None = None
    candidate_output: ArtifactRef | None = None


class EvidenceBundle(BaseModel):
    version: Literal[1] = 1
    run_id: str
    repository: str
    issue_number: int
    base_revision: str
    candidate_commit: str
    procedure: ArtifactRef
    spec: ArtifactRef | None = None
    base: RevisionEvidence
    candidate: RevisionEvidence
    patch: ArtifactRef
    checks: list[CheckResult] = Field(default_factory=list)
    # The recipe's tests on the base before any change: what a candidate's results are judged against.
    baseline: CheckResult | None = None
    regression: RegressionEvidence | None = None

    @model_validator(mode="after")
    def _revisions_line_up(self) -> EvidenceBundle:
        if self.base.role != "base" or self.base.revision != self.base_revision:
            raise ValueError(f"base evidence is for {self.base.role} {self.base.revision}, not {self.base_revision}")
        if self.candidate.role != "candidate" or self.candidate.revision != self.candidate_commit:
            raise ValueError(
                f"candidate evidence is for {self.candidate.role} {self.candidate.revision}, "
                f"not {self.candidate_commit}"
            )
        return self

    @property
    def passed(self) -> bool:
        """Reproduced on the base, gone on the candidate, and every check passed."""
        return self.base.as_expected and self.candidate.as_expected and all(c.passed for c in self.checks)

    def canonical_json(self) -> bytes:
        data = self.model_dump(mode="json")
        # Fields added after manifests were first stored are left out while empty, so an older manifest
        # re-serialises to its own bytes (and keeps the digest an approval named).
        for later in _LATER_FIELDS:
            if data.get(later) is None:
                data.pop(later, None)
        return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    def artifacts(self) -> list[ArtifactRef]:
        """Every artifact the bundle names, each key once, in reading order."""
        refs: list[ArtifactRef] = [self.procedure]
        if self.spec is not None:
            refs.append(self.spec)
        for side in (self.base, self.candidate):
            refs += [*side.traces, *side.screenshots, *side.videos, *side.logs]
        refs.append(self.patch)
        refs += [c.output for c in [*self.checks, *([self.baseline] if self.baseline else [])] if c.output is not None]
        if self.regression is not None:
            refs += [r for r in (self.regression.base_output, self.regression.candidate_output) if r is not None]
        seen: set[str] = set()
        unique = []
        for ref in refs:
            if ref.key not in seen:
                seen.add(ref.key)
                unique.append(ref)
        return unique


def bundle_digest(bundle: EvidenceBundle) -> str:
    """The hash an approval names: sha256 of the bundle's canonical JSON."""
    return hashlib.sha256(bundle.canonical_json()).hexdigest()


def store_bundle(bundle: EvidenceBundle, store: ArtifactStore) -> ArtifactRef:
    """Store the manifest (idempotent: the same bundle always lands on the same key)."""
    return store.put_bytes(
        bundle.canonical_json(),
        kind=ArtifactKind.MANIFEST,
        run_id=bundle.run_id,
        name=MANIFEST_NAME,
        revision=bundle.candidate_commit,
        media_type="application/json",
    )


def load_bundle(store: ArtifactStore, ref: ArtifactRef) -> EvidenceBundle:
    """Read a stored manifest back; its bytes are verified against ``ref.sha256`` and must be canonical."""
    data = store.read_bytes(ref)
    bundle = EvidenceBundle.model_validate_json(data)
    if bundle.canonical_json() != data:
        raise IntegrityError(f"manifest {ref.key} is not in canonical form, so its digest names nothing")
    return bundle
