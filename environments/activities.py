"""Temporal activities of the environments queue.

Every activity rebuilds what it needs from recorded inputs at the start of every attempt (workspace from
the mirror at the base revision plus the stored patch; the app from the stored recovery spec); nothing is
trusted from a previous attempt or another worker. Idempotency:

- ``env.prepare_spec``: content-addressed store write; the same revision gives the same spec reference.
- ``env.provision``: idempotent per operation ID (the provider adopts what an earlier attempt started).
- ``env.verify_candidate``: deterministic commit (same base + patch + message + timestamp, same SHA);
  stored outputs are content-addressed.
- ``env.teardown`` / ``env.cleanup_run``: idempotent; cleanup tombstones the run first — in the shared
  evidence store (``environments.run_fence``, checked by every creating activity on any host) and under each
  provider's state — so a late attempt of a provisioning activity cannot recreate anything afterwards.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from temporalio import activity

from environments.checks import run_tests
from environments.git import GitError
from environments.interface import (
    CleanupReport,
    EnvironmentHandle,
    EnvironmentProvider,
    NotReadyError,
    ResourceConflictError,
    RunFencedError,
)
from environments.mirror import RevisionNotFoundError
from environments.run_fence import ensure_not_fenced, write_tombstone
from environments.spec import RecipeError, build_recovery_spec, canonical_json, spec_from_json
from environments.workspace import PatchError, TreeMismatchError, Workspace
from evidence.interface import ArtifactKind, ArtifactRef
from pipeline import failures
from pipeline.heartbeat import Heartbeat
from pipeline.services import Services
from pipeline.steps import CleanupRunInput, PrepareSpecInput, ProvisionInput, VerifyInput, VerifyResult

TEST_TIMEOUT_S = 600.0


def classify(err: Exception) -> Exception:
    """Map environment errors onto the pipeline's failure classes."""
    if isinstance(err, RunFencedError):
        return failures.policy(f"run fenced: {err}")
    if isinstance(err, ResourceConflictError):
        return failures.policy(f"resource conflict: {err}")
    if isinstance(err, NotReadyError):
        return failures.not_ready(str(err))
    if isinstance(err, RecipeError | PatchError | TreeMismatchError | RevisionNotFoundError):
        return failures.permanent(f"{type(err).__name__}: {err}")
    if isinstance(err, GitError):
        return failures.transient(f"git: {err}")
    return err


class EnvironmentActivities:
    def __init__(self, services: Services) -> None:
        self.services = services

    def all(self) -> Sequence[Callable[..., object]]:
        return [self.prepare_spec, self.provision, self.teardown, self.verify_candidate, self.cleanup_run]

    def _rebuild(self, run_id: str, op_id: str, spec_clone_url: str, base: str, patch: str | None) -> Workspace:
        return self.services.workspaces.rebuild(
            run_id=run_id,
            op_id=op_id,
            clone_url=spec_clone_url,
            base_revision=base,
            patch=patch,
            token=self.services.config.forge_token or None,
        )

    @activity.defn(name="env.prepare_spec")
    def prepare_spec(self, inp: PrepareSpecInput) -> ArtifactRef:
        """Read the repository's recipe at the base revision and store the recovery spec (by content)."""
        try:
            with Heartbeat("checking out base revision"):
                ws = self._rebuild(inp.run_id, inp.op_id, inp.clone_url, inp.base_revision, None)
            try:
                spec = build_recovery_spec(inp.repository, inp.clone_url, inp.base_revision, ws.path)
            finally:
                self.services.workspaces.remove(ws)
        except Exception as err:
            raise classify(err) from err
        return self.services.store.put_bytes(
            canonical_json(spec),
            kind=ArtifactKind.SPEC,
            run_id=inp.run_id,
            name="recovery-spec.json",
            revision=inp.base_revision,
            media_type="application/json",
        )

    @activity.defn(name="env.provision")
    def provision(self, inp: ProvisionInput) -> EnvironmentHandle:
        """Rebuild the workspace (base + patch) and start or adopt the app for ``op_id``; wait until ready."""
        store = self.services.store
        spec = spec_from_json(store.read_bytes(inp.spec_ref))
        patch = store.read_bytes(inp.patch_ref).decode() if inp.patch_ref else None
        provider: EnvironmentProvider = self.services.provider(inp.provider)
        try:
            ensure_not_fenced(store, inp.run_id, f"to provision {inp.op_id}")
            with Heartbeat("rebuilding workspace") as beat:
                ws = self._rebuild(inp.run_id, inp.op_id, spec.clone_url, spec.base_revision, patch)
                beat.set(f"starting app with {provider.name}")
                return provider.provision(run_id=inp.run_id, op_id=inp.op_id, spec=spec, workspace=str(ws.path))
        except Exception as err:
            raise classify(err) from err

    @activity.defn(name="env.teardown")
    def teardown(self, handle: EnvironmentHandle) -> CleanupReport:
        """Stop one environment and remove its workspace; idempotent."""
        report = self.services.provider(handle.provider).teardown(handle)
        for res in self.services.workspaces.list_owned(handle.run_id):
            if res.op_id == handle.op_id:
                self.services.workspaces.remove(
                    Workspace(
                        path=Path(res.detail.get("path", "")),
                        run_id=handle.run_id,
                        op_id=handle.op_id,
                        base_revision="0" * 40,
                        head_commit="0" * 40,
                        tree_sha="",
                    )
                )
        return report

    @activity.defn(name="env.verify_candidate")
    def verify_candidate(self, inp: VerifyInput) -> VerifyResult:
        """Fresh workspace from base + patch, deterministic commit, the recipe's tests; outputs stored."""
        store = self.services.store
        spec = spec_from_json(store.read_bytes(inp.spec_ref))
        patch = store.read_bytes(inp.patch_ref).decode()
        try:
            ensure_not_fenced(store, inp.run_id, f"to verify {inp.op_id}")
            with Heartbeat("rebuilding workspace from base + patch") as beat:
                ws = self._rebuild(inp.run_id, inp.op_id, spec.clone_url, spec.base_revision, patch)
                commit = self.services.workspaces.commit(ws, inp.message, inp.commit_timestamp)
                beat.set(f"running tests on {commit[:12]}")
                with tempfile.TemporaryDirectory(prefix="durafix-verify-") as tmp:
                    log = Path(tmp) / "tests.log"
                    result = run_tests(ws.path, spec.recipe, TEST_TIMEOUT_S, log_path=log)
                    test_ref = store.put_file(
                        log,
                        kind=ArtifactKind.TEST_OUTPUT,
                        run_id=inp.run_id,
                        name="tests.log",
                        revision=commit,
                        media_type="text/plain",
                    )
                    beat.set("snapshotting candidate")
                    bundle = self.services.workspaces.snapshot(ws, Path(tmp) / "candidate.bundle")
                    bundle_ref = store.put_file(
                        bundle,
                        kind=ArtifactKind.BUNDLE,
                        run_id=inp.run_id,
                        name="candidate.bundle",
                        revision=commit,
                        media_type="application/x-git-bundle",
                    )
                self.services.workspaces.remove(ws)
        except Exception as err:
            raise classify(err) from err
        summary = (
            "passed"
            if result.passed
            else ("timed out" if result.timed_out else f"exit {result.exit_code}: {result.output_tail[-400:]}")
        )
        return VerifyResult(
            commit=commit,
            tree=ws.tree_sha,
            tests_passed=result.passed,
            test_summary=summary,
            test_output_ref=test_ref,
            bundle_ref=bundle_ref,
        )

    @activity.defn(name="env.cleanup_run")
    def cleanup_run(self, inp: CleanupRunInput) -> CleanupReport:
        """Tombstone the run and remove everything it owns across providers and workspaces; idempotent."""
        total = CleanupReport(run_id=inp.run_id)
        # The shared tombstone first: from now on no host creates anything for this run.
        write_tombstone(self.services.store, inp.run_id)
        names = {"local", self.services.config.environment_provider}
        with Heartbeat("cleaning up owned resources"):
            for name in sorted(names):
                part = self.services.provider(name).cleanup_run(inp.run_id)
                _merge(total, part)
            _merge(total, self.services.workspaces.cleanup_run(inp.run_id))
        return total


def _merge(total: CleanupReport, part: CleanupReport) -> None:
    total.removed.extend(part.removed)
    total.remaining.extend(part.remaining)
    total.errors.extend(part.errors)
