"""The evidence capability's activities (served on the environments queue).

``evidence.build`` turns the run's stored artifacts into an evidence bundle, stores its manifest and the
reviewer's report, and answers the bundle digest an approval names plus a URL for every artifact.

Idempotent: every artifact is already stored (content-addressed) before this runs; the manifest is the
bundle's canonical JSON, so a retried attempt stores the same bytes under the same key and answers the same
digest. The report is re-rendered on each attempt; on a local store it is byte-identical, on S3 its
presigned links differ, so a retry may leave one more report object (harmless, the manifest is what an
approval names). Missing or tampered artifacts fail with ``Permanent``: retrying cannot bring them back.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from evidence.bundle import CheckResult, EvidenceBundle, RevisionEvidence, bundle_digest, store_bundle
from evidence.interface import ArtifactKind, ArtifactMissingError, ArtifactStore, IntegrityError
from evidence.report import render_report
from pipeline.services import Services
from pipeline.steps import BuildEvidenceInput, EvidenceResult


class EvidenceActivities:
    def __init__(self, services: Services) -> None:
        self._services = services

    def store(self) -> ArtifactStore:
        return self._services.store

    def all(self) -> list[Callable[..., object]]:
        return [self.build]

    @activity.defn(name="evidence.build")
    def build(self, inp: BuildEvidenceInput) -> EvidenceResult:
        store = self.store()
        bundle = bundle_from_input(inp)
        try:
            missing = [ref.key for ref in bundle.artifacts() if not store.exists(ref)]
            if missing:
                raise ArtifactMissingError(f"evidence artifacts missing from the store: {', '.join(missing)}")
            manifest_ref = store_bundle(bundle, store)
            activity.heartbeat("manifest stored")
            digest = bundle_digest(bundle)
            with tempfile.TemporaryDirectory(prefix="durafix-report-") as tmp:
                page = render_report(bundle, store, Path(tmp))
                activity.heartbeat("report rendered")
                report_ref = store.put_file(
                    page,
                    kind=ArtifactKind.REPORT,
                    run_id=inp.run_id,
                    name=f"evidence-{digest[:12]}.html",
                    revision=inp.candidate_commit,
                    media_type="text/html",
                )
        except (ArtifactMissingError, IntegrityError) as err:
            raise ApplicationError(str(err), type="Permanent", non_retryable=True) from err
        links = {ref.sha256: store.url_for(ref) for ref in [*bundle.artifacts(), manifest_ref, report_ref]}
        return EvidenceResult(
            manifest_ref=manifest_ref,
            report_ref=report_ref,
            digest=digest,
            report_url=links[report_ref.sha256],
            links=links,
        )


def bundle_from_input(inp: BuildEvidenceInput) -> EvidenceBundle:
    return EvidenceBundle(
        run_id=inp.run_id,
        repository=inp.repository,
        issue_number=inp.issue_number,
        base_revision=inp.base_revision,
        candidate_commit=inp.candidate_commit,
        procedure=inp.procedure_ref,
        spec=inp.spec_ref,
        base=RevisionEvidence.from_refs("base", inp.base_revision, inp.base_status, inp.base_reproduction),
        candidate=RevisionEvidence.from_refs(
            "candidate", inp.candidate_commit, inp.candidate_status, inp.candidate_reproduction
        ),
        patch=inp.patch_ref,
        checks=[CheckResult(name="tests", passed=inp.tests_passed, output=inp.test_output_ref)],
    )
