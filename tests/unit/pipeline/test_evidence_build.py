"""evidence.build as a Temporal activity: bundle, manifest, report, links; idempotent; permanent failures."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from evidence.bundle import EvidenceBundle, load_bundle
from evidence.interface import ArtifactKind, ArtifactRef
from evidence.local import LocalArtifactStore
from pipeline.activities.environments import EnvironmentActivities
from pipeline.config import DurafixConfig
from pipeline.services import Services
from pipeline.steps import BuildEvidenceInput
from tests.support.evidence_samples import solid_png, store_cart_bundle

PUBLIC = "http://127.0.0.1:8765"


def _input(bundle: EvidenceBundle, spec: ArtifactRef) -> BuildEvidenceInput:
    test_output = bundle.checks[0].output
    assert test_output is not None
    return BuildEvidenceInput(
        run_id=bundle.run_id,
        repository=bundle.repository,
        issue_number=bundle.issue_number,
        base_revision=bundle.base_revision,
        candidate_commit=bundle.candidate_commit,
        procedure_ref=bundle.procedure,
        base_reproduction=[*bundle.base.traces, *bundle.base.screenshots, *bundle.base.logs],
        candidate_reproduction=[*bundle.candidate.traces, *bundle.candidate.screenshots, *bundle.candidate.logs],
        base_status=bundle.base.status,
        candidate_status=bundle.candidate.status,
        patch_ref=bundle.patch,
        test_output_ref=test_output,
        tests_passed=True,
        spec_ref=spec,
    )


@pytest.fixture
def setup(tmp_path: Path) -> tuple[EnvironmentActivities, LocalArtifactStore, BuildEvidenceInput]:
    root = tmp_path / "evidence"
    store = LocalArtifactStore(root)
    spec = store.put_bytes(b'{"version": 1}', kind=ArtifactKind.SPEC, run_id="r")
    inp = _input(store_cart_bundle(store, solid_png(4, 4, (200, 0, 0)), solid_png(4, 4, (0, 160, 0))), spec)
    config = DurafixConfig(state_dir=tmp_path, evidence_url=root.as_uri(), evidence_public_url=PUBLIC)
    return Services(config).environment_activities(), store, inp


def test_build_stores_manifest_and_report_and_links_every_artifact(
    setup: tuple[EnvironmentActivities, LocalArtifactStore, BuildEvidenceInput],
) -> None:
    activities, store, inp = setup
    result = ActivityEnvironment().run(activities.build_evidence, inp)

    assert result.manifest_ref.sha256 == result.digest
    bundle = load_bundle(store, result.manifest_ref)
    assert bundle.candidate_commit == inp.candidate_commit and bundle.spec == inp.spec_ref
    assert result.report_ref.kind == ArtifactKind.REPORT and result.report_ref.media_type == "text/html"
    assert result.report_url == f"{PUBLIC}/a/{result.report_ref.key}"
    assert result.digest.encode() in store.read_bytes(result.report_ref)
    for ref in [*bundle.artifacts(), result.manifest_ref, result.report_ref]:
        assert result.links[ref.sha256] == f"{PUBLIC}/a/{ref.key}"


def test_a_retried_build_answers_the_same_digest_manifest_and_report(
    setup: tuple[EnvironmentActivities, LocalArtifactStore, BuildEvidenceInput],
) -> None:
    activities, _, inp = setup
    first = ActivityEnvironment().run(activities.build_evidence, inp)
    second = ActivityEnvironment().run(activities.build_evidence, inp)
    assert second == first


def test_missing_evidence_fails_permanently(
    setup: tuple[EnvironmentActivities, LocalArtifactStore, BuildEvidenceInput],
) -> None:
    activities, store, inp = setup
    store.object_path(inp.patch_ref.key).unlink()
    with pytest.raises(ApplicationError) as failed:
        ActivityEnvironment().run(activities.build_evidence, inp)
    assert failed.value.type == "Permanent" and failed.value.non_retryable
    assert inp.patch_ref.key in str(failed.value)
