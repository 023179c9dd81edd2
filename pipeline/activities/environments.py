"""The environments queue's activities, and the evidence build that runs beside them.

Every activity rebuilds what it needs from recorded inputs at the start of every attempt (workspace from
the mirror at the base revision plus the stored patch; the app from the stored recovery spec); nothing is
trusted from a previous attempt or another worker. Idempotency:

- ``env.prepare_spec``: content-addressed store write; the same revision gives the same spec reference.
- ``env.provision``: idempotent per operation ID (the provider adopts what an earlier attempt started).
- ``env.verify_candidate``: deterministic commit (same base + patch + message + timestamp, same SHA);
  the recipe's setup (or its result restored from the worker's dependency cache: the tests still run on it),
  then its tests; stored outputs are content-addressed.
- ``env.reproduce_in_sandbox``: a command or test reproduction on a fresh workspace (base + patch), in the
  provider's sandbox with no app; read-only towards the outside, its outputs stored by content.
- ``env.reproduce_in_environment``: a command reproduction with ``app: true`` in the provisioned environment
  (re-checked first; ``EnvironmentGone`` when its app no longer answers), stored as ``env.reproduce_in_sandbox``
  stores it; nothing outside the environment's workspace is written.
- ``env.run_baseline``: the recipe's setup and tests on a fresh workspace at the base revision; read-only
  towards the outside, its log stored by content.
- ``env.teardown`` / ``env.cleanup_run``: idempotent; cleanup tombstones the run first — in the shared
  evidence store (``environments.run_fence``, checked by every creating activity on any host) and under each
  provider's state — so a late attempt of a provisioning activity cannot recreate anything afterwards.
- ``evidence.build``: the manifest is the bundle's canonical JSON, so a retried attempt stores the same
  bytes under the same key and answers the same digest. The report is re-rendered on each attempt; on a
  local store it is byte-identical, on S3 its presigned links differ, so a retry may leave one more report
  object (harmless: the manifest is what an approval names). Missing or tampered artifacts are permanent
  failures: retrying cannot bring them back.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from temporalio import activity

from browser.procedure import Procedure
from environments.checks import SetupError, SetupSettings
from environments.command_repro import SandboxRun, collected_paths, reproduce_in_sandbox
from environments.commands import tail
from environments.diagnosis import FailedCommand, Stage, diagnose
from environments.head_capture import capture_head, rebuild_on_base
from environments.interface import (
    CleanupReport,
    EnvironmentGoneError,
    EnvironmentHandle,
    EnvironmentProvider,
    NoAppError,
    NotReadyError,
    RecoverySpec,
    TestRunResult,
)
from environments.readiness import answers
from environments.redaction import Redactor, redactor_for
from environments.regression import forget_report, prove_regression
from environments.reproduction import CommandProcedure, SandboxProcedure, load_reproduction
from environments.run_fence import ensure_not_fenced, write_tombstone
from environments.spec import build_recovery_spec, canonical_json, spec_from_json
from environments.test_results import CaseOutcome, ReportError, TestCases, read_workspace_report, regressions
from environments.workspace import Workspace, WorkspaceManager
from evidence.bundle import (
    CheckResult,
    EvidenceBundle,
    RegressionEvidence,
    RevisionEvidence,
    bundle_digest,
    store_bundle,
)
from evidence.interface import ArtifactKind, ArtifactMissingError, ArtifactRef, ArtifactStore
from evidence.report import render_report
from pipeline import steps
from pipeline.activities.classify import classified
from pipeline.activities.heartbeat import Heartbeat
from pipeline.activities.sandbox_repro import store_reproduction
from pipeline.activities.workspace import open_spec, rebuild
from pipeline.failures import FailureClass
from pipeline.state import EnvironmentFailureFact, RegressionFact
from pipeline.steps import (
    BaselineInput,
    BaselineResult,
    BuildEvidenceInput,
    CaptureHeadInput,
    CleanupRunInput,
    EnvironmentReproduceInput,
    EvidenceResult,
    HeadCaptured,
    PrepareSpecInput,
    ProvisionInput,
    RebuildOnBaseInput,
    RebuiltOnBase,
    ReproduceResult,
    SandboxReproduceInput,
    VerifyInput,
    VerifyResult,
)
from reviews.git_credentials import GitCredentials

TEST_TIMEOUT_S = 600.0
SETUP_TIMEOUT_S = 600.0

EnvironmentFailure = SetupError | NotReadyError | NoAppError
"""What keeps an environment from being provisioned that is a finding about the revision's recipe (NotReady)."""

ProviderFor = Callable[[str | None], EnvironmentProvider]
"""The provider by name; ``None`` is the worker's configured one."""


def output_redactor(recipe_secrets: Mapping[str, str], git_token: GitCredentials) -> Redactor:
    """Every secret value known on this worker (:mod:`environments.redaction`): the recipe's, the worker's
    credentials, the forge token (every installation token handed out, for a GitHub App)."""
    return redactor_for(recipe_secrets, [("DURAFIX_FORGE_TOKEN", token) for token in git_token.known_tokens()])


def put_redacted_output(
    store: ArtifactStore, path: Path, kind: ArtifactKind, run_id: str, name: str, revision: str, redactor: Redactor
) -> ArtifactRef:
    """Store what the repository's commands printed, with ``redactor``'s secret values redacted first."""
    with tempfile.TemporaryDirectory(prefix="durafix-redacted-") as tmp:
        clean = redactor.file(path, Path(tmp) / name) if redactor else path
        return store.put_file(clean, kind=kind, run_id=run_id, name=name, revision=revision, media_type="text/plain")


def put_patch(store: ArtifactStore, patch: str, *, run_id: str, name: str, revision: str) -> ArtifactRef:
    """Store a change as a patch artifact (``text/x-diff``) of ``run_id``, tagged with the revision it is on."""
    return store.put_bytes(
        patch.encode(), kind=ArtifactKind.PATCH, run_id=run_id, name=name, revision=revision, media_type="text/x-diff"
    )


class EnvironmentActivities:
    def __init__(
        self,
        store: ArtifactStore,
        workspaces: WorkspaceManager,
        provider_for: ProviderFor,
        cleanup_providers: Sequence[str],
        git_token: GitCredentials,
        setup: SetupSettings | None = None,
        host: str = "",
    ) -> None:
        """``cleanup_providers``: every provider a run's resources may live in on this host; cleanup asks
        each of them. ``setup``: this host's setup settings (the local provider's own, which it uses when it runs
        a verification's or the baseline's setup and tests: ``EnvironmentProvider.run_checks``). ``host``: the
        host queue this worker also polls (:mod:`pipeline.hosts`), stamped on every environment it provisions so
        that the steps reaching the environment run here; empty: none (any host reaches it)."""
        self.host = host
        self.setup = setup or SetupSettings()
        self.store = store
        self.workspaces = workspaces
        self.provider_for = provider_for
        self.cleanup_providers = sorted(set(cleanup_providers))
        self.git_token = git_token

    def all(self) -> Sequence[Callable[..., object]]:
        return [
            self.prepare_spec,
            self.provision,
            self.teardown,
            self.verify_candidate,
            self.reproduce_in_sandbox,
            self.reproduce_in_environment,
            self.capture_head,
            self.rebuild_on_base,
            self.run_baseline,
            self.cleanup_run,
            self.build_evidence,
        ]

    def _put_output(
        self,
        path: Path,
        kind: ArtifactKind,
        run_id: str,
        name: str,
        revision: str,
        recipe_secrets: Mapping[str, str],
    ) -> ArtifactRef:
        return put_redacted_output(
            self.store, path, kind, run_id, name, revision, output_redactor(recipe_secrets, self.git_token)
        )

    def _tests_in(
        self, ws: Workspace, spec: RecoverySpec, log: Path, beat: Heartbeat, where: str, run_id: str, op_id: str
    ) -> _Checked:
        """The recipe's setup and tests in ``ws`` (see :func:`_setup_and_test`), by the provider that runs
        commands on this worker; the summary names the stored ``log`` and never quotes it."""
        return _setup_and_test(
            ws.path,
            spec,
            log,
            beat,
            where,
            self.provider_for(None),
            run_id,
            op_id,
            output=f"its output is in {log.name}",
        )

    def _rebuild(self, run_id: str, op_id: str, clone_url: str, base: str, patch: str | None) -> Workspace:
        return rebuild(self.workspaces, self.git_token, run_id, op_id, clone_url, base, patch)

    @activity.defn(name=steps.PREPARE_SPEC.name)
    def prepare_spec(self, inp: PrepareSpecInput) -> ArtifactRef:
        """Read the repository's recipe at the base revision and store the recovery spec (by content)."""
        with classified():
            with Heartbeat("checking out base revision"):
                ws = self._rebuild(inp.run_id, inp.op_id, inp.clone_url, inp.base_revision, None)
            try:
                spec = build_recovery_spec(inp.repository, inp.clone_url, inp.base_revision, ws.path)
            finally:
                self.workspaces.remove(ws)
        return self.store.put_bytes(
            canonical_json(spec),
            kind=ArtifactKind.SPEC,
            run_id=inp.run_id,
            name="recovery-spec.json",
            revision=inp.base_revision,
            media_type="application/json",
        )

    @activity.defn(name=steps.PROVISION.name)
    def provision(self, inp: ProvisionInput) -> EnvironmentHandle:
        """Rebuild the workspace (base + patch) and start or adopt the app for ``op_id``; wait until ready.

        The provider's sub-states (each setup command, the start, the readiness wait) are heartbeat details,
        which ``durafix status`` shows. A recipe that declares no ``start`` fails ``NotReady`` at once, before a
        workspace is built, its details naming the missing ``start`` and the hint (a finding about the recipe,
        like an app that never became ready: retrying cannot help)."""
        spec = _on_base(spec_from_json(self.store.read_bytes(inp.spec_ref)), inp.base_revision)
        patch = self.store.read_bytes(inp.patch_ref).decode() if inp.patch_ref else None
        provider = self.provider_for(inp.provider)
        with classified():
            ensure_not_fenced(self.store, inp.run_id, f"to provision {inp.op_id}")
            if spec.recipe.start is None:
                raise self._not_ready(NoAppError(), inp.run_id, spec.base_revision, spec.recipe.secrets)
            with Heartbeat("rebuilding workspace") as beat:
                ws = self._rebuild(inp.run_id, inp.op_id, spec.clone_url, spec.base_revision, patch)
                beat.set(f"starting app with {provider.name}")
                try:
                    handle = provider.provision(
                        run_id=inp.run_id, op_id=inp.op_id, spec=spec, workspace=str(ws.path), progress=beat.set
                    )
                    return handle.model_copy(update={"host": self.host}) if self.host else handle
                except (SetupError, NotReadyError, NoAppError) as err:
                    raise self._not_ready(err, inp.run_id, spec.base_revision, spec.recipe.secrets) from err

    def _not_ready(
        self, err: EnvironmentFailure, run_id: str, revision: str, recipe_secrets: Mapping[str, str]
    ) -> Exception:
        """The app could not be set up or made ready (or the recipe declares none): a finding about the revision.
        The environment's log (setup, start, readiness, fixtures) is kept as evidence, also for a run that ends
        here, and the failure names it instead of quoting it (details: ``{"log_ref": ..., "environment_failure":
        ...}``, see :meth:`_failure_details`)."""
        first = str(err).splitlines()[0].rstrip(":") if str(err) else type(err).__name__
        said = f"setup failed: {first}" if isinstance(err, SetupError) else first
        log = err.log_path
        if log is None or not log.is_file():
            return FailureClass.NOT_READY.error(said, self._failure_details(err, None))
        ref = self._put_output(log, ArtifactKind.LOG, run_id, "environment.log", revision, recipe_secrets)
        return FailureClass.NOT_READY.error(
            f"{said}; its output is in environment.log",
            {"log_ref": ref.model_dump(mode="json"), **self._failure_details(err, ref)},
        )

    def _failure_details(self, err: EnvironmentFailure, ref: ArtifactRef | None) -> dict[str, object]:
        """The failed command as the workflow records it (:class:`~pipeline.state.EnvironmentFailureFact`, under
        ``environment_failure``): the command, its stored log and a link to it, and the cause
        :func:`~environments.diagnosis.diagnose` recognises in the log's tail (judged here, on the worker, from the
        unredacted log; the hint quotes none of it). Empty when the provider named no command."""
        failed = err.failed
        if failed is None:
            return {}
        log_tail = tail(err.log_path) if err.log_path is not None else str(err)
        found = diagnose(failed, log_tail)
        fact = EnvironmentFailureFact(
            stage=failed.stage.value,
            command=failed.command,
            exit_code=failed.exit_code,
            log_ref=ref,
            log_url=self.store.url_for(ref) if ref is not None else "",
            cause=found.cause.value if found else "",
            hint=found.hint if found else "",
        )
        return {"environment_failure": fact.model_dump(mode="json")}

    @activity.defn(name=steps.TEARDOWN.name)
    def teardown(self, handle: EnvironmentHandle) -> CleanupReport:
        """Stop one environment and remove its workspace; idempotent."""
        report = self.provider_for(handle.provider).teardown(handle)
        for res in self.workspaces.list_owned(handle.run_id):
            if res.op_id == handle.op_id:
                self.workspaces.remove(
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

    @activity.defn(name=steps.VERIFY_CANDIDATE.name)
    def verify_candidate(self, inp: VerifyInput) -> VerifyResult:
        """Fresh workspace from base + patch, deterministic commit, the recipe's setup and tests; outputs
        stored. A setup the patch broke is a failed verification (``tests_passed`` false), not an error."""
        store = self.store
        spec = _on_base(spec_from_json(store.read_bytes(inp.spec_ref)), inp.base_revision)
        patch = store.read_bytes(inp.patch_ref).decode()
        with classified():
            ensure_not_fenced(store, inp.run_id, f"to verify {inp.op_id}")
            with Heartbeat("rebuilding workspace from base + patch") as beat:
                if inp.parent_commit is not None:
                    # A revision is stacked on the head under review, which is on the forge already.
                    self.workspaces.mirrors.ensure(
                        spec.clone_url, inp.parent_commit, token=self.git_token.token_for(spec.clone_url)
                    )
                ws = self._rebuild(inp.run_id, inp.op_id, spec.clone_url, spec.base_revision, patch)
                commit = self.workspaces.commit(ws, inp.message, inp.commit_timestamp, parent=inp.parent_commit)
                with tempfile.TemporaryDirectory(prefix="durafix-verify-") as tmp:
                    log = Path(tmp) / "tests.log"
                    result = self._tests_in(ws, spec, log, beat, f"on {commit[:12]}", inp.run_id, inp.op_id)
                    cases = _cases(ws.path, spec)
                    if cases is not None and not result.passed and result.runnable and inp.baseline_cases_ref:
                        result = _judged_per_test(result, cases, store.read_bytes(inp.baseline_cases_ref))
                    test_ref = self._put_output(
                        log, ArtifactKind.TEST_OUTPUT, inp.run_id, "tests.log", commit, spec.recipe.secrets
                    )
                    beat.set("snapshotting candidate")
                    bundle = self.workspaces.snapshot(ws, Path(tmp) / "candidate.bundle", commit)
                    bundle_ref = store.put_file(
                        bundle,
                        kind=ArtifactKind.BUNDLE,
                        run_id=inp.run_id,
                        name="candidate.bundle",
                        revision=commit,
                        media_type="application/x-git-bundle",
                    )
                    regression = None
                    if result.passed:
                        beat.set("regression proof: the patch's tests on the base revision's code")
                        regression = self._prove(
                            ws.path, spec, Path(tmp) / "regression", cases, inp.run_id, inp.op_id, commit, beat
                        )
                self.workspaces.remove(ws)
        return VerifyResult(
            commit=commit,
            tree=ws.tree_sha,
            tests_passed=result.passed,
            test_summary=result.summary,
            test_output_ref=test_ref,
            bundle_ref=bundle_ref,
            regression=regression,
        )

    @activity.defn(name=steps.REPRODUCE_IN_SANDBOX.name)
    def reproduce_in_sandbox(self, inp: SandboxReproduceInput) -> ReproduceResult:
        """The run's command or test reproduction on a fresh workspace (base + patch, rebuilt as provision and
        verification rebuild it), by the provider that runs commands on this worker: the recipe's setup first
        (restored from the dependency cache when it can be), then each run's script in the sandbox, no app. The
        verdict, every run's record (``<label>-reproduction.json``, the result's ``log_ref``) and each run's log
        are stored redacted; the workspace is removed. A setup that fails is the environment's finding about the
        revision, as provision's (``NotReady`` with the failed command, see :meth:`_not_ready`)."""
        store = self.store
        spec = _on_base(spec_from_json(store.read_bytes(inp.spec_ref)), inp.base_revision)
        patch = store.read_bytes(inp.patch_ref).decode() if inp.patch_ref else None
        procedure = load_reproduction(store.read_bytes(inp.procedure_ref))
        if isinstance(procedure, Procedure):
            raise FailureClass.PERMANENT.error("a browser procedure runs against the app (browser.reproduce)")
        provider = self.provider_for(None)
        with classified():
            ensure_not_fenced(store, inp.run_id, f"to reproduce {inp.op_id}")
            with Heartbeat("rebuilding workspace") as beat:
                ws = self._rebuild(inp.run_id, inp.op_id, spec.clone_url, spec.base_revision, patch)
                try:

                    def run(command: str, log: Path, setup_first: bool, timeout_s: float) -> TestRunResult:
                        return provider.run_checks(
                            spec,
                            str(ws.path),
                            run_id=inp.run_id,
                            op_id=inp.op_id,
                            log_path=log,
                            setup_timeout_s=SETUP_TIMEOUT_S,
                            test_timeout_s=timeout_s,
                            progress=beat.set,
                            command=command,
                            setup=setup_first,
                            collect=collected_paths(procedure),
                        )

                    return self._run_and_store(ws.path, spec, procedure, run, inp.run_id, inp.op_id, inp.revision, beat)
                finally:
                    self.workspaces.remove(ws)

    @activity.defn(name=steps.REPRODUCE_IN_ENVIRONMENT.name)
    def reproduce_in_environment(self, inp: EnvironmentReproduceInput) -> ReproduceResult:
        """The run's command reproduction with ``app: true`` in the provisioned environment ``inp.environment``:
        re-checked first (as ``browser.reproduce`` does: an app that does not answer its readiness path now is
        ``EnvironmentGone``, and the workflow provisions anew), then each run's script by the environment's provider
        (:meth:`~environments.interface.EnvironmentProvider.run_in`: in the environment's own workspace, setup not
        run again, reaching the app and nothing else). Stored as ``env.reproduce_in_sandbox`` stores it; the
        environment and its workspace are left to ``env.teardown``. An app that stops answering meanwhile is
        ``EnvironmentGone`` too: what the runs found is not trusted."""
        store = self.store
        env = inp.environment
        spec = spec_from_json(store.read_bytes(inp.spec_ref))
        procedure = load_reproduction(store.read_bytes(inp.procedure_ref))
        if not isinstance(procedure, CommandProcedure) or not procedure.app:
            raise FailureClass.PERMANENT.error("only a command reproduction with `app: true` runs in the environment")
        provider = self.provider_for(env.provider)
        with classified():
            ensure_not_fenced(store, inp.run_id, f"to reproduce {inp.op_id}")
            probe = spec.recipe.readiness.path
            down = answers(env.base_url, probe)
            if down is not None:
                raise FailureClass.ENVIRONMENT_GONE.error(f"{env.env_id} does not answer at {env.base_url}: {down}")
            # The workspace provision built for the environment's operation, as teardown finds it.
            found = [r for r in self.workspaces.list_owned(env.run_id) if r.op_id == env.op_id]
            ws = Path(found[0].detail.get("path", "")) if found else None
            if ws is None or not ws.is_dir():
                raise FailureClass.ENVIRONMENT_GONE.error(f"the workspace of {env.env_id} is gone")
            with Heartbeat(f"reproducing in {env.env_id}") as beat:

                def run(command: str, log: Path, setup_first: bool, timeout_s: float) -> TestRunResult:
                    # Provisioning ran the setup: never again (``setup_first`` is ignored).
                    return provider.run_in(
                        env,
                        spec,
                        str(ws),
                        command,
                        log_path=log,
                        timeout_s=timeout_s,
                        collect=collected_paths(procedure),
                    )

                try:
                    result = self._run_and_store(
                        ws, spec, procedure, run, inp.run_id, inp.op_id, inp.revision, beat, setup=False
                    )
                except EnvironmentGoneError as err:
                    raise FailureClass.ENVIRONMENT_GONE.error(str(err)) from err
            down = answers(env.base_url, probe)
            if down is not None:
                raise FailureClass.ENVIRONMENT_GONE.error(f"{env.env_id} died during the reproduction: {down}")
        return result

    def _run_and_store(
        self,
        ws: Path,
        spec: RecoverySpec,
        procedure: SandboxProcedure,
        run: SandboxRun,
        run_id: str,
        op_id: str,
        revision: str,
        beat: Heartbeat,
        *,
        setup: bool = True,
    ) -> ReproduceResult:
        """``procedure`` run by ``run`` in ``ws`` (:func:`~environments.command_repro.reproduce_in_sandbox`), then its
        record and each run's log stored redacted (:func:`~pipeline.activities.sandbox_repro.store_reproduction`).
        A setup that fails is ``NotReady`` with the failed command (:meth:`_not_ready`)."""
        with tempfile.TemporaryDirectory(prefix="durafix-sandbox-repro-") as tmp:
            log_dir = Path(tmp)
            try:
                found = reproduce_in_sandbox(ws, spec.recipe, procedure, run, log_dir, setup=setup, progress=beat.set)
            except SetupError as err:
                raise self._not_ready(err, run_id, spec.base_revision, spec.recipe.secrets) from err
            beat.set("storing the reproduction's outputs")
            return store_reproduction(
                self.store,
                found,
                log_dir,
                run_id=run_id,
                op_id=op_id,
                revision=revision,
                redactor=output_redactor(spec.recipe.secrets, self.git_token),
            )

    @activity.defn(name=steps.CAPTURE_HEAD.name)
    def capture_head(self, inp: CaptureHeadInput) -> HeadCaptured:
        """Fetch ``head_sha`` from the forge into this host's mirror and store its change from the run's base as
        a patch artifact. Read-only on the forge; idempotent (the artifact is stored by content)."""
        spec = spec_from_json(self.store.read_bytes(inp.spec_ref))
        with classified(), Heartbeat(f"fetching {inp.head_sha[:12]}"):
            mirror = self.workspaces.mirrors.ensure(
                spec.clone_url, inp.head_sha, token=self.git_token.token_for(spec.clone_url)
            )
            captured = capture_head(mirror, inp.base_revision, inp.head_sha)
        patch_ref = put_patch(self.store, captured.patch, run_id=inp.run_id, name="head.patch", revision=inp.head_sha)
        return HeadCaptured(
            head_sha=inp.head_sha,
            patch_ref=patch_ref,
            tree=captured.tree,
            parents=captured.parents,
            message=captured.message,
            committed_at=captured.committed_at,
            descends_from_base=captured.descends_from_base,
            empty=not captured.patch.strip(),
        )

    @activity.defn(name=steps.REBUILD_ON_BASE.name)
    def rebuild_on_base(self, inp: RebuildOnBaseInput) -> RebuiltOnBase:
        """Rebuild the head's change (made on ``old_base``) on ``new_base`` in this host's mirror (both fetched
        from the forge), and store the rebuilt change as a patch artifact. Read-only on the forge; idempotent
        (a three-way merge of the same commits gives the same tree; the artifact is stored by content)."""
        spec = spec_from_json(self.store.read_bytes(inp.spec_ref))
        with classified(), Heartbeat(f"rebuilding {inp.head_sha[:12]} on {inp.new_base[:12]}"):
            for revision in (inp.old_base, inp.head_sha):
                self.workspaces.mirrors.ensure(spec.clone_url, revision, token=self.git_token.token_for(spec.clone_url))
            mirror = self.workspaces.mirrors.ensure(
                spec.clone_url, inp.new_base, token=self.git_token.token_for(spec.clone_url)
            )
            rebuilt = rebuild_on_base(mirror, inp.old_base, inp.head_sha, inp.new_base)
        if rebuilt.conflict:
            return RebuiltOnBase(conflict=True, detail=rebuilt.detail)
        patch_ref = put_patch(self.store, rebuilt.patch, run_id=inp.run_id, name="rebuilt.patch", revision=inp.new_base)
        return RebuiltOnBase(conflict=False, patch_ref=patch_ref, tree=rebuilt.tree, same_change=rebuilt.same_change)

    def _prove(
        self,
        ws: Path,
        spec: RecoverySpec,
        log_dir: Path,
        cases: TestCases | None,
        run_id: str,
        op_id: str,
        commit: str,
        beat: Heartbeat,
    ) -> RegressionFact:
        """The regression proof in the verified workspace (after its snapshot: the proof reverts files), each
        run in the provider's sandbox like the verification's; its logs stored by content (redacted), the base
        run's under the base revision."""
        recipe = spec.recipe
        provider = self.provider_for(None)

        def run(command: str, log: Path, setup_first: bool) -> TestRunResult:
            return provider.run_checks(
                spec,
                str(ws),
                run_id=run_id,
                op_id=f"{op_id}:regression",
                log_path=log,
                setup_timeout_s=SETUP_TIMEOUT_S,
                test_timeout_s=TEST_TIMEOUT_S,
                progress=beat.set,
                command=command,
                setup=setup_first,
            )

        proof = prove_regression(
            ws, spec.base_revision, recipe, run=run, log_dir=log_dir, candidate_cases=cases, candidate=commit
        )

        def stored(log: Path | None, revision: str) -> ArtifactRef | None:
            if log is None or not log.exists():
                return None
            return self._put_output(log, ArtifactKind.TEST_OUTPUT, run_id, log.name, revision, recipe.secrets)

        return RegressionFact(
            status=proof.status,
            summary=proof.summary(),
            test_files=proof.test_files,
            fixed_cases=proof.fixed_cases,
            base_output_ref=stored(proof.base_log, spec.base_revision),
            candidate_output_ref=stored(proof.candidate_log, commit),
        )

    @activity.defn(name=steps.RUN_BASELINE.name)
    def run_baseline(self, inp: BaselineInput) -> BaselineResult:
        """The recipe's setup and tests on a fresh workspace at the base revision, once per run before any
        repair attempt: a fix is judged against it, and tests that cannot run are a recipe error found
        before the model is asked for anything. Its summary names the stored log and never quotes what the
        repository's commands printed (the summary reaches the ticket)."""
        spec = open_spec(self.store, inp.spec_ref, inp.run_id, f"to run the baseline {inp.op_id}")
        with classified(), Heartbeat("rebuilding workspace at the base revision") as beat:
            ws = self._rebuild(inp.run_id, inp.op_id, spec.clone_url, spec.base_revision, None)
            try:
                with tempfile.TemporaryDirectory(prefix="durafix-baseline-") as tmp:
                    log = Path(tmp) / "baseline-tests.log"
                    result = self._tests_in(ws, spec, log, beat, "on the base revision", inp.run_id, inp.op_id)
                    test_ref = self._put_output(
                        log,
                        ArtifactKind.TEST_OUTPUT,
                        inp.run_id,
                        "baseline-tests.log",
                        spec.base_revision,
                        spec.recipe.secrets,
                    )
                    failure = self._baseline_failure(result, log, test_ref)
                    cases = _cases(ws.path, spec) if result.runnable else None
                    cases_ref = None
                    if cases is not None:
                        result = _Checked(result.runnable, result.passed, f"{result.summary} ({cases.counts()})")
                        cases_ref = self.store.put_bytes(
                            cases.to_json(),
                            kind=ArtifactKind.TEST_OUTPUT,
                            run_id=inp.run_id,
                            name="baseline-cases.json",
                            revision=spec.base_revision,
                            media_type="application/json",
                        )
            finally:
                self.workspaces.remove(ws)
        return BaselineResult(
            runnable=result.runnable,
            passed=result.passed,
            summary=result.summary,
            test_output_ref=test_ref,
            cases_ref=cases_ref,
            environment_failure=failure,
        )

    def _baseline_failure(self, result: _Checked, log: Path, log_ref: ArtifactRef) -> EnvironmentFailureFact | None:
        """The command a baseline failed on, when the workflow says it: tests that could not run (setup failed,
        the test command not found, a timeout), or failing tests whose log shows a recognised cause (the network,
        which tests never have); with the stored log, its link and the diagnosis."""
        if result.passed or result.failed is None:
            return None
        found = diagnose(result.failed, tail(log))
        if result.runnable and found is None:
            return None
        return EnvironmentFailureFact(
            stage=result.failed.stage.value,
            command=result.failed.command,
            exit_code=result.failed.exit_code,
            log_ref=log_ref,
            log_url=self.store.url_for(log_ref),
            cause=found.cause.value if found else "",
            hint=found.hint if found else "",
        )

    @activity.defn(name=steps.CLEANUP_RUN.name)
    def cleanup_run(self, inp: CleanupRunInput) -> CleanupReport:
        """Tombstone the run and remove everything it owns across providers and workspaces; idempotent."""
        total = CleanupReport(run_id=inp.run_id)
        # The shared tombstone first: from now on no host creates anything for this run.
        write_tombstone(self.store, inp.run_id)
        with Heartbeat("cleaning up owned resources") as beat:
            for name in self.cleanup_providers:
                beat.set(f"cleaning up {name} resources")
                _merge(total, self.provider_for(name).cleanup_run(inp.run_id))
            beat.set("removing workspaces")
            _merge(total, self.workspaces.cleanup_run(inp.run_id))
        return total

    @activity.defn(name=steps.BUILD_EVIDENCE.name)
    def build_evidence(self, inp: BuildEvidenceInput) -> EvidenceResult:
        """The run's stored artifacts as an evidence bundle: its manifest, the reviewer's report, the digest
        an approval names, and a URL for every artifact."""
        store = self.store
        bundle = bundle_from_input(inp)
        with classified():
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
        links = {ref.sha256: store.url_for(ref) for ref in [*bundle.artifacts(), manifest_ref, report_ref]}
        return EvidenceResult(
            manifest_ref=manifest_ref,
            report_ref=report_ref,
            digest=digest,
            report_url=links[report_ref.sha256],
            links=links,
        )


@dataclass(frozen=True)
class _Checked:
    """What one setup-and-test run came to, in the words the workflow records; ``failed``: the command that
    failed (a setup command, or the test command), for :func:`~environments.diagnosis.diagnose`."""

    runnable: bool
    passed: bool
    summary: str
    failed: FailedCommand | None = None

    @classmethod
    def of(cls, result: TestRunResult, output: str | None, command: str = "") -> _Checked:
        """``output``: what to say of the output, ``None`` for its last 400 characters; ``command``: the test
        command that ran."""
        if result.passed:
            return cls(True, True, "passed")
        failed = FailedCommand(Stage.TESTS, command, result.exit_code)
        if result.timed_out:
            return cls(False, False, f"timed out after {result.duration_s:.0f} s", failed)
        why = "could not run (not found or not executable)" if not result.runnable else "failed"
        said = result.output_tail[-400:] if output is None else output
        return cls(result.runnable, False, f"{why}, exit {result.exit_code}: {said}", failed)


def _on_base(spec: RecoverySpec, base_revision: str | None) -> RecoverySpec:
    """The spec with its patch applied to ``base_revision`` instead (a candidate rebuilt on a moved base)."""
    return spec if base_revision is None else spec.model_copy(update={"base_revision": base_revision})


def _cases(ws: Path, spec: RecoverySpec) -> TestCases | None:
    """The run's test cases from the recipe's ``test_report``; ``None`` without one, or when it was not
    written or cannot be read (then the exit code is all there is)."""
    if not spec.recipe.test_report:
        return None
    try:
        return read_workspace_report(ws, spec.recipe.test_report)
    except ReportError:
        return None


def _judged_per_test(result: _Checked, cases: TestCases, baseline: bytes) -> _Checked:
    """A failing run judged against the baseline's cases: it passes when every test that fails already failed
    on the base (and none that passed there is gone)."""
    lost = regressions(TestCases.from_json(baseline), cases)
    if not lost:
        failing = len(cases.named(CaseOutcome.FAILED))
        return _Checked(True, True, f"passed: the {failing} failing test case(s) fail on the base too")
    named = ", ".join(lost[:10]) + (f" and {len(lost) - 10} more" if len(lost) > 10 else "")
    return _Checked(True, False, f"{len(lost)} test case(s) that pass on the base fail or are gone: {named}")


def _setup_and_test(
    ws: Path,
    spec: RecoverySpec,
    log: Path,
    beat: Heartbeat,
    where: str,
    provider: EnvironmentProvider,
    run_id: str,
    op_id: str,
    *,
    output: str | None = None,
) -> _Checked:
    """The recipe's setup then its tests in ``ws``, both logged to ``log``, run by ``provider`` inside its
    sandbox (local: bubblewrap on this worker, with its dependency cache; Docker: a container from the app
    image); a failed setup is an unrunnable test run.

    With ``output`` the summary names the stored log in those words instead of quoting the commands'
    output: what the repository's commands print must not reach the run's state and its ticket.
    """

    def progress(text: str) -> None:
        beat.set(text.replace("running tests:", f"running tests {where}:", 1))

    forget_report(ws, spec.recipe)  # a report already there (committed, say) is not this run's
    try:
        result = provider.run_checks(
            spec,
            str(ws),
            run_id=run_id,
            op_id=op_id,
            log_path=log,
            setup_timeout_s=SETUP_TIMEOUT_S,
            test_timeout_s=TEST_TIMEOUT_S,
            progress=progress,
        )
    except SetupError as err:
        said = str(err)[-400:] if output is None else f"{str(err).splitlines()[0].rstrip(':')}; {output}"
        return _Checked(False, False, f"setup failed: {said}", err.failed)
    return _Checked.of(result, output, spec.recipe.test)


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
        checks=[
            CheckResult(name="tests", passed=inp.tests_passed, detail=inp.test_summary, output=inp.test_output_ref)
        ],
        baseline=(
            CheckResult(
                name="baseline (base revision, before any change)",
                passed=inp.baseline_passed,
                detail=inp.baseline_summary,
                output=inp.baseline_output_ref,
            )
            if inp.baseline_passed is not None
            else None
        ),
        regression=(
            RegressionEvidence(
                status=inp.regression.status,
                summary=inp.regression.summary,
                test_files=inp.regression.test_files,
                fixed_cases=inp.regression.fixed_cases,
                base_output=inp.regression.base_output_ref,
                candidate_output=inp.regression.candidate_output_ref,
            )
            if inp.regression is not None
            else None
        ),
    )


def _merge(total: CleanupReport, part: CleanupReport) -> None:
    total.removed.extend(part.removed)
    total.remaining.extend(part.remaining)
    total.errors.extend(part.errors)
