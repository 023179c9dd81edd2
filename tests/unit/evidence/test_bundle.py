"""The evidence bundle: canonical manifest, the digest an approval names, and revision bookkeeping."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from evidence.bundle import RegressionEvidence, RevisionEvidence, bundle_digest, load_bundle, store_bundle
from evidence.interface import ArtifactKind, IntegrityError
from evidence.local import LocalArtifactStore
from tests.support.evidence_samples import CANDIDATE, solid_png, store_cart_bundle


@pytest.fixture
def store(tmp_path: Path) -> LocalArtifactStore:
    return LocalArtifactStore(tmp_path / "store")


def test_digest_is_the_sha256_of_the_stored_manifest(store: LocalArtifactStore) -> None:
    bundle = store_cart_bundle(store, solid_png(4, 4, (200, 0, 0)), solid_png(4, 4, (0, 160, 0)))
    ref = store_bundle(bundle, store)
    assert ref.kind == ArtifactKind.MANIFEST and ref.revision == CANDIDATE
    assert ref.sha256 == bundle_digest(bundle)
    assert hashlib.sha256(store.read_bytes(ref)).hexdigest() == bundle_digest(bundle)
    assert load_bundle(store, ref) == bundle


def test_rebuilding_the_same_bundle_gives_the_same_manifest_and_digest(store: LocalArtifactStore) -> None:
    pngs = solid_png(4, 4, (200, 0, 0)), solid_png(4, 4, (0, 160, 0))
    first = store_bundle(store_cart_bundle(store, *pngs), store)
    again = store_bundle(store_cart_bundle(store, *pngs), store)
    assert again == first


def test_any_change_to_the_evidence_changes_the_digest(store: LocalArtifactStore) -> None:
    bundle = store_cart_bundle(store, solid_png(4, 4, (200, 0, 0)), solid_png(4, 4, (0, 160, 0)))
    other_png = store.put_bytes(solid_png(4, 4, (1, 2, 3)), kind=ArtifactKind.SCREENSHOT, run_id=bundle.run_id)
    variants = [
        bundle.model_copy(update={"checks": [bundle.checks[0].model_copy(update={"passed": False})]}),
        bundle.model_copy(update={"candidate": bundle.candidate.model_copy(update={"screenshots": [other_png]})}),
        bundle.model_copy(update={"candidate": bundle.candidate.model_copy(update={"status": "inconclusive"})}),
    ]
    digests = {bundle_digest(bundle), *(bundle_digest(v) for v in variants)}
    assert len(digests) == 4


def test_a_manifest_that_is_not_canonical_is_refused(store: LocalArtifactStore) -> None:
    bundle = store_cart_bundle(store, solid_png(4, 4, (200, 0, 0)), solid_png(4, 4, (0, 160, 0)))
    pretty = json.dumps(bundle.model_dump(mode="json"), indent=2).encode()
    ref = store.put_bytes(pretty, kind=ArtifactKind.MANIFEST, run_id=bundle.run_id, media_type="application/json")
    with pytest.raises(IntegrityError):
        load_bundle(store, ref)


def test_revision_evidence_sorts_a_runs_artifacts_by_kind(store: LocalArtifactStore) -> None:
    trace = store.put_bytes(b"t", kind=ArtifactKind.TRACE, run_id="r")
    shot = store.put_bytes(b"s", kind=ArtifactKind.SCREENSHOT, run_id="r")
    log = store.put_bytes(b"l", kind=ArtifactKind.LOG, run_id="r")
    side = RevisionEvidence.from_refs("candidate", "c0ffee", "not_reproduced", [log, shot, trace])
    assert (side.traces, side.screenshots, side.logs) == ([trace], [shot], [log])
    assert side.expected_status == "not_reproduced" and side.as_expected


def test_evidence_recorded_on_another_revision_is_refused(store: LocalArtifactStore) -> None:
    bundle = store_cart_bundle(store, solid_png(4, 4, (200, 0, 0)), solid_png(4, 4, (0, 160, 0)))
    data = bundle.model_dump()
    data["candidate_commit"] = "f" * 40
    with pytest.raises(ValidationError, match="candidate evidence is for"):
        type(bundle).model_validate(data)


def test_a_manifest_stored_before_the_test_evidence_fields_keeps_its_bytes_and_digest(
    store: LocalArtifactStore,
) -> None:
    bundle = store_cart_bundle(store, solid_png(4, 4, (200, 0, 0)), solid_png(4, 4, (0, 160, 0)))
    older = json.loads(bundle.canonical_json())
    assert "baseline" not in older and "regression" not in older
    # What an older durafix stored (no such keys) loads and re-serialises to exactly those bytes.
    ref = store.put_bytes(bundle.canonical_json(), kind=ArtifactKind.MANIFEST, run_id=bundle.run_id)
    assert load_bundle(store, ref).canonical_json() == bundle.canonical_json()
    log = store.put_bytes(b"FAILED (failures=1)\n", kind=ArtifactKind.TEST_OUTPUT, run_id=bundle.run_id)
    proven = bundle.model_copy(
        update={
            "regression": RegressionEvidence(
                status="proven", summary="fail -> pass", test_files=["tests/test_cart.py"], base_output=log
            )
        }
    )
    assert bundle_digest(proven) != bundle_digest(bundle)
    assert log in proven.artifacts()
