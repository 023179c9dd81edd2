"""A dry run of a repository's recipe, and of a report's reproduction, on a local checkout: what ``durafix check``
runs, stage by stage, with no forge and no Temporal (and a model only to draft a reproduction, when one is
configured and the report has none).

Each stage runs as a worker would run it: the workspace is built from the checkout's HEAD commit with the
worker's workspace machinery (:class:`~environments.workspace.WorkspaceManager`: a mirror of the checkout, a
fresh tree at that commit, so neither untracked files nor uncommitted changes reach it), setup, the app, the tests
and a command or test reproduction run through the local provider (:class:`~environments.local.LocalProcessProvider`:
bubblewrap, the egress proxy for ``setup_network``, the dependency cache it is given), and a browser procedure
runs with the worker's :class:`~browser.runner.BrowserRunner` against the started app. The recipe is read from the
checkout's working tree (``durafix.yaml`` is what is being tried before it is committed).

Stages, in order; the first that fails decides :attr:`CheckResult.code` (:class:`Outcome`):

1. ``recipe``: ``durafix.yaml`` loads (:func:`environments.spec.load_recipe`); and, with a report, its
   ``durafix-repro`` block parses. Nothing else runs when the recipe does not load.
2. ``setup``: the recipe's setup in the workspace. Nothing else runs when it fails.
3. ``start``: only when the app is needed, that is for a browser procedure or a command reproduction with ``app:
   true``, or, with no reproduction to run, when the recipe declares ``start``: the app starts (``provision``, which
   runs the setup of stage 2 first, so setup then runs as part of it), answers its readiness probe, and is stopped
   again once the reproduction against it is done.
4. ``tests``: the recipe's ``test`` in the set-up workspace, as the baseline runs it (126/127 or a timeout: it
   cannot run; another non-zero exit: the tests fail).
5. ``report``: the report's reproduction: a command or test reproduction with
   :func:`environments.command_repro.reproduce_in_sandbox` in the set-up workspace (after the tests, which ran
   there first), a browser procedure, or a command reproduction with ``app: true``
   (:meth:`~environments.local.LocalProcessProvider.run_in`), against the app of stage 3. A report without a block:
   with a model configured (``CheckSettings.model``, read from the environment as the worker reads it), the model
   drafts a command or test reproduction from the report's prose and each draft runs in the set-up workspace, sent
   back with what its run found until one shows the bug (up to :data:`DRAFT_ROUNDS`, as a run does; a run may also
   draft a browser procedure for a served app, which the check does not); the drafts are kept in the logs.
   Without a model it cannot be checked: a run would have the model draft one.

Everything the check starts is owned by a run ID of its own (``check-<hex>``) under a work directory of its own,
and removed on every way out, an interrupt included (:meth:`RecipeCheck.run`'s ``finally``: ``cleanup_run`` of
the provider and of the workspaces, then the work directory). The logs stay in ``log_dir``. Nothing is written
into the checkout.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

from browser.procedure import Procedure, ProcedureError
from browser.results import BrowserInfraError, ReproductionStatus
from browser.runner import BrowserRunner
from environments.checks import SetupError, SetupSettings
from environments.command_repro import SandboxRun, reproduce_in_sandbox
from environments.commands import tail
from environments.diagnosis import FailedCommand, Stage, diagnose
from environments.git import GitError, isolated_git, run_git
from environments.interface import (
    AppRecipe,
    EnvironmentError,
    EnvironmentHandle,
    NotReadyError,
    RecoverySpec,
    TestRunResult,
)
from environments.local import LocalProcessProvider
from environments.progress import command_text
from environments.regression import forget_report
from environments.reproduction import (
    CommandProcedure,
    Reproduction,
    ReproductionKind,
    SandboxProcedure,
    TestProcedure,
    describe,
    extract_reproduction,
)
from environments.sandbox import Sandbox
from environments.spec import RECIPE_FILE, RecipeError, dependency_lock_hash, load_recipe
from environments.workspace import Workspace, WorkspaceManager
from repair.config import ModelConfig
from repair.interface import RepairError
from repair.procedure_draft import DraftRound, ProcedureDrafter, recipe_kinds, repository_facts

SETUP_TIMEOUT_S = 600.0
# As many drafts as a run gets (pipeline.flow.intake.DRAFT_ROUNDS; the workflow's module is not imported here).
DRAFT_ROUNDS = 3
TEST_TIMEOUT_S = 600.0


class Outcome(IntEnum):
    """``durafix check``'s exit codes beyond the command line's own (0, 1: this host cannot run the check, 2)."""

    PASSED = 0
    NO_REPRODUCTION = 3
    """The report holds no ``durafix-repro`` block (a run would ask the model to draft one), or an invalid one."""
    RECIPE_INVALID = 4
    SETUP_FAILED = 5
    APP_NOT_READY = 6
    TESTS_CANNOT_RUN = 7
    TESTS_FAIL = 8
    NOT_REPRODUCED = 9
    INCONCLUSIVE = 10


class CheckError(Exception):
    """The check cannot run here at all (DIR is not a git checkout with a commit, the browser failed): not a
    finding about the recipe."""


@dataclass
class StageResult:
    """One stage as it ended: ``status`` passed, failed or skipped; ``summary`` what happened; ``hint`` the
    recognised fix (:func:`environments.diagnosis.diagnose`); ``log`` the full log, kept."""

    name: str
    status: str
    duration_s: float = 0.0
    summary: str = ""
    hint: str = ""
    log: Path | None = None
    code: Outcome = Outcome.PASSED


class Listener:
    """What the check tells as it goes (the command prints it); the default says nothing."""

    def started(self, stage: str, what: str) -> None:
        """``stage`` begins; ``what``: what it runs."""

    def progress(self, text: str) -> None:
        """A sub-state of the running stage (the provider's ``setup: <command>`` and so on)."""

    def ended(self, result: StageResult) -> None:
        """A stage ended (or was skipped)."""


@dataclass
class CheckResult:
    """The whole check: the commit whose tree was checked, every stage, and the exit code."""

    directory: Path
    commit: str
    log_dir: Path
    stages: list[StageResult] = field(default_factory=list)

    @property
    def code(self) -> Outcome:
        """The first failed stage's outcome, else :attr:`Outcome.PASSED`."""
        return next((s.code for s in self.stages if s.status == "failed"), Outcome.PASSED)


@dataclass(frozen=True)
class CheckSettings:
    """Where and how the check runs. ``work_dir``: created and removed by the check (workspaces, the mirror, the
    provider's records); ``log_dir``: kept. ``setup``: the worker's setup settings (its dependency and package
    caches). ``browser``: makes the runner, only when a browser procedure runs."""

    directory: Path
    log_dir: Path
    work_dir: Path
    setup: SetupSettings
    sandbox: Sandbox
    browser: Callable[[], BrowserRunner]
    report: Path | None = None
    allowed_secrets: tuple[str, ...] = ()
    # Drafts a reproduction for a report with no block; None: no model is configured.
    model: ModelConfig | None = None
    setup_timeout_s: float = SETUP_TIMEOUT_S
    test_timeout_s: float = TEST_TIMEOUT_S


def checkout_head(directory: Path) -> str:
    """The full commit ID of ``directory``'s HEAD; :class:`CheckError` when it is not the root of a git checkout
    with a commit."""
    try:
        top = run_git(["rev-parse", "--show-toplevel"], cwd=directory, timeout_s=60)
        if Path(top).resolve() != directory.resolve():
            raise CheckError(f"{directory} is not the root of its git checkout ({top} is); check the root")
        return run_git(["rev-parse", "--verify", "HEAD^{commit}"], cwd=directory, timeout_s=60)
    except GitError as err:
        raise CheckError(f"{directory} is not a git checkout with a commit: {str(err).strip()}") from err


def uncommitted(directory: Path) -> list[str]:
    """The checkout's changed tracked files and untracked files, as ``git status --porcelain`` names them."""
    try:
        out = run_git(["status", "--porcelain", "--untracked-files=normal"], cwd=directory, timeout_s=60)
    except GitError:
        return []
    return [line for line in out.splitlines() if line.strip()]


def repository_name(directory: Path) -> str:
    """``owner/name`` of the checkout's ``origin`` (the key a worker's caches use for it), else
    ``local/<directory name>``."""
    try:
        url = run_git(["remote", "get-url", "origin"], cwd=directory, timeout_s=60)
    except GitError:
        url = ""
    parts = [p for p in url.rstrip("/").removesuffix(".git").replace(":", "/").split("/") if p]
    if len(parts) >= 2:
        return f"{parts[-2]}/{parts[-1]}"
    return f"local/{directory.name}"


class RecipeCheck:
    """One run of the check (see the module); :meth:`run` once."""

    def __init__(self, settings: CheckSettings, listener: Listener | None = None) -> None:
        self.settings = settings
        self.listener = listener or Listener()
        self.run_id = f"check-{uuid.uuid4().hex[:12]}"
        self.commit = ""
        self._runner: BrowserRunner | None = None
        # A report with no block, when a model is configured to draft its reproduction.
        self._prose: str | None = None

    def run(self) -> CheckResult:
        """All stages; the result's :attr:`~CheckResult.code` is the exit code. Raises :class:`CheckError` (the
        check could not run) and passes an interrupt on, in both cases after removing everything it made."""
        s = self.settings
        directory = s.directory.resolve()
        self.commit = checkout_head(directory)
        s.log_dir.mkdir(parents=True, exist_ok=True)
        result = CheckResult(directory=directory, commit=self.commit, log_dir=s.log_dir)
        s.work_dir.mkdir(parents=True, exist_ok=True)
        workspaces = WorkspaceManager(cache_dir=s.work_dir / "cache", root=s.work_dir / "workspaces")
        provider = LocalProcessProvider(
            s.work_dir / "environments", setup=s.setup, sandbox=s.sandbox, allowed_secrets=s.allowed_secrets
        )
        try:
            self._stages(result, directory, workspaces, provider)
        finally:
            try:
                if self._runner is not None:
                    self._runner.close()
            finally:
                provider.cleanup_run(self.run_id)
                workspaces.cleanup_run(self.run_id)
                shutil.rmtree(s.work_dir, ignore_errors=True)
        return result

    # ---- the stages ----------------------------------------------------------------------------------------

    def _stages(
        self, result: CheckResult, directory: Path, workspaces: WorkspaceManager, provider: LocalProcessProvider
    ) -> None:
        """The stages in order; each is told to the listener as it runs. ``result.stages`` holds them in the order
        they decide the exit code: a browser procedure runs before the tests (against the app, which is then
        stopped) but is judged after them."""
        stages = result.stages
        recipe_stage, recipe, reproduction, no_reproduction = self._recipe(directory)
        stages.append(recipe_stage)
        if recipe is None:
            return
        try:
            ws = workspaces.rebuild(
                run_id=self.run_id, op_id="check:workspace", clone_url=str(directory), base_revision=self.commit
            )
        except (EnvironmentError, GitError) as err:
            raise CheckError(f"cannot build a workspace of {self.commit[:12]} from {directory}: {err}") from err
        try:
            lock_hash = dependency_lock_hash(ws.path, recipe)
        except RecipeError as err:
            # A declared lock file the commit does not hold: the recipe does not fit the tree it is for.
            hint = "list in `lock_files` only files the repository commits"
            stages.append(
                self._end("recipe", time.monotonic(), failed=Outcome.RECIPE_INVALID, summary=str(err), hint=hint)
            )
            return
        spec = RecoverySpec(
            repository=repository_name(directory),
            clone_url=str(directory),
            base_revision=self.commit,
            recipe=recipe,
            dependency_lock_hash=lock_hash,
        )
        # What runs against the started app: a browser procedure, or a command reproduction with ``app: true``.
        against_app: Procedure | CommandProcedure | None = None
        if isinstance(reproduction, Procedure) or (isinstance(reproduction, CommandProcedure) and reproduction.app):
            against_app = reproduction
        sandboxed = (
            reproduction
            if isinstance(reproduction, (CommandProcedure, TestProcedure)) and against_app is None
            else None
        )
        # ``start`` may become optional in the recipe; an empty one is a recipe without an app.
        app_needed = against_app is not None or (sandboxed is None and bool(recipe.start))
        browsed: StageResult | None = None
        if app_needed:
            set_up, started, browsed = self._setup_and_start(ws, spec, provider, against_app)
            stages.append(set_up)
            if started is None:
                return
            stages.append(started)
        else:
            set_up = self._setup(ws, spec, provider)
            stages.append(set_up)
            if set_up.status == "failed":
                return
            why = "the reproduction runs in the sandbox, without the app" if sandboxed else "the recipe has no `start`"
            stages.append(self._skipped("start", f"not needed: {why}"))
        stages.append(self._tests(ws, spec, provider))
        if browsed is not None:
            stages.append(browsed)
        elif against_app is not None:
            stages.append(self._skipped("report", "not run: the app did not start"))
        elif sandboxed is not None:
            stages.append(self._reproduce_in_sandbox(ws, spec, provider, sandboxed))
        elif self._prose is not None:
            stages.append(self._draft(ws, spec, provider, self._prose))
        elif no_reproduction is not None:
            self.listener.ended(no_reproduction)
            stages.append(no_reproduction)

    def _recipe(self, directory: Path) -> tuple[StageResult, AppRecipe | None, Reproduction | None, StageResult | None]:
        """Stage 1: the recipe loads, and the report's block parses. A missing or invalid block is answered as the
        failed ``report`` stage (last), which the caller adds after the others."""
        self.listener.started("recipe", f"{directory / RECIPE_FILE}")
        started = time.monotonic()
        try:
            recipe = load_recipe(directory)
        except RecipeError as err:
            hint = f"fix {RECIPE_FILE} (docs/environments.md lists its fields); `durafix init` writes a starter"
            return (
                self._end("recipe", started, failed=Outcome.RECIPE_INVALID, summary=str(err), hint=hint),
                None,
                None,
                None,
            )
        reproduction: Reproduction | None = None
        problem = ""
        report = self.settings.report
        if report is not None:
            try:
                reproduction = extract_reproduction(report.read_text(encoding="utf-8", errors="replace"))
            except ProcedureError as err:
                problem = f"invalid durafix-repro block in {report}: {err}"
            except OSError as err:
                raise CheckError(f"cannot read the report {report}: {err}") from err
            if reproduction is None and not problem and self.settings.model is not None:
                self._prose = report.read_text(encoding="utf-8", errors="replace")
            elif reproduction is None and not problem:
                problem = (
                    f"{report} has no ```durafix-repro block: a run would ask the model to draft one from the "
                    "report, which `durafix check` does only with a model configured (OPENAI_API_KEY, "
                    "DURAFIX_MODEL and OPENAI_BASE_URL, as the worker reads them)"
                )
        said = f"{RECIPE_FILE} loads"
        if reproduction is not None:
            said += f"; the report's {_kind(reproduction)} reproduction parses"
        elif self._prose is not None:
            said += "; the report has no reproduction: the model will draft one"
        stage = self._end("recipe", started, summary=said)
        missing = None
        if problem:
            hint = "write the block yourself (docs/browser.md: browser, command and test reproductions)"
            missing = StageResult("report", "failed", summary=problem, hint=hint, code=Outcome.NO_REPRODUCTION)
        return stage, recipe, reproduction, missing

    def _setup(self, ws: Workspace, spec: RecoverySpec, provider: LocalProcessProvider) -> StageResult:
        """Stage 2 alone (the app is not needed)."""
        recipe = spec.recipe
        log = self.settings.log_dir / "setup.log"
        self.listener.started("setup", _commands(recipe.setup) or "nothing to run")
        started = time.monotonic()
        try:
            outcome = provider.run_setup(
                spec,
                str(ws.path),
                run_id=self.run_id,
                log_path=log,
                timeout_s=self.settings.setup_timeout_s,
                progress=self.listener.progress,
            )
        except SetupError as err:
            return self._failed_command("setup", started, err, Outcome.SETUP_FAILED, log)
        said = "nothing to run" if not recipe.setup else (outcome.cache or "ran")
        return self._end("setup", started, summary=said, log=log if log.exists() else None)

    def _setup_and_start(
        self,
        ws: Workspace,
        spec: RecoverySpec,
        provider: LocalProcessProvider,
        against_app: Procedure | CommandProcedure | None,
    ) -> tuple[StageResult, StageResult | None, StageResult | None]:
        """Stages 2 and 3 through ``provision`` (setup, then the app's start and readiness), told apart by its
        progress; then the reproduction that needs the app, if any, against it (a browser procedure, or a command
        reproduction with ``app: true``); then the app is stopped. Answers the setup stage, the start stage
        (``None`` when setup failed) and that reproduction's report stage (``None`` when it did not run)."""
        recipe = spec.recipe
        log = self.settings.log_dir / "environment.log"
        self.listener.started("setup", _commands(recipe.setup) or "nothing to run")
        clock = {"setup": time.monotonic(), "start": 0.0}
        ended: list[StageResult] = []

        def end_setup() -> None:
            if not ended:
                ended.append(self._end("setup", clock["setup"], summary="done" if recipe.setup else "nothing to run"))
                clock["start"] = time.monotonic()
                self.listener.started("start", f"{command_text(recipe.start or '')}, then readiness")

        def progress(text: str) -> None:
            if text.startswith("starting app:"):
                end_setup()
            self.listener.progress(text)

        try:
            handle = provider.provision(
                run_id=self.run_id, op_id="check:app", spec=spec, workspace=str(ws.path), progress=progress
            )
        except SetupError as err:
            _keep(err.log_path, log)
            return self._failed_command("setup", clock["setup"], err, Outcome.SETUP_FAILED, log), None, None
        except NotReadyError as err:
            _keep(err.log_path, log)
            end_setup()
            return ended[0], self._failed_command("start", clock["start"], err, Outcome.APP_NOT_READY, log), None
        end_setup()
        url = f"{handle.base_url}{recipe.readiness.path}"
        said = f"ready: GET {url} answered {recipe.readiness.expected_status}; sandbox: {handle.sandbox}"
        started = self._end("start", clock["start"], summary=said, log=log)
        browsed = None
        try:
            if isinstance(against_app, Procedure):
                browsed = self._browse(against_app, handle, recipe)
            elif against_app is not None:
                browsed = self._reproduce_against_app(ws, spec, provider, handle, against_app)
        finally:
            provider.teardown(handle)
            self.listener.progress("the app is stopped")
            logged = [r.detail.get("log", "") for r in handle.resources]
            _keep(Path(logged[0]) if logged and logged[0] else None, log)
        return ended[0], started, browsed

    def _browse(self, procedure: Procedure, handle: EnvironmentHandle, recipe: AppRecipe) -> StageResult:
        """Stage 5 for a browser procedure: the worker's runner against the started app."""
        self.listener.started("report", f"browser procedure {procedure.name!r}, {procedure.runs} run(s)")
        started = time.monotonic()
        out = self.settings.log_dir / "browser"
        out.mkdir(parents=True, exist_ok=True)
        if self._runner is None:
            self._runner = self.settings.browser()
        try:
            found = self._runner.run(
                procedure,
                handle.base_url,
                out,
                on_step=lambda _, what: self.listener.progress(what),
                allowed_origins=recipe.browser_origins,
            )
        except BrowserInfraError as err:
            raise CheckError(f"the browser failed (not a finding about the report): {err}") from err
        return self._judged(started, found.status, found.detail, found.log_path)

    def _tests(self, ws: Workspace, spec: RecoverySpec, provider: LocalProcessProvider) -> StageResult:
        """Stage 4: the recipe's tests in the set-up workspace, judged as the baseline judges them."""
        recipe = spec.recipe
        log = self.settings.log_dir / "tests.log"
        self.listener.started("tests", command_text(recipe.test))
        started = time.monotonic()
        forget_report(ws.path, recipe)
        result = provider.run_checks(
            spec,
            str(ws.path),
            run_id=self.run_id,
            op_id="check:tests",
            log_path=log,
            setup_timeout_s=self.settings.setup_timeout_s,
            test_timeout_s=self.settings.test_timeout_s,
            progress=self.listener.progress,
            setup=False,
        )
        if result.passed:
            return self._end("tests", started, summary="passed", log=log)
        failed = FailedCommand(Stage.TESTS, recipe.test, result.exit_code)
        found = diagnose(failed, tail(log))
        hint = found.hint if found else ""
        if not result.runnable:
            why = (
                f"timed out after {result.duration_s:.0f} s"
                if result.timed_out
                else f"could not run (exit {result.exit_code}: not found or not executable)"
            )
            return self._end(
                "tests",
                started,
                failed=Outcome.TESTS_CANNOT_RUN,
                summary=why,
                hint=hint or ("a test command that cannot run is a recipe error: fix `test` in durafix.yaml"),
                log=log,
            )
        return self._end(
            "tests",
            started,
            failed=Outcome.TESTS_FAIL,
            summary=f"failed, exit {result.exit_code} (a run would report these failures on its base)",
            hint=hint,
            log=log,
        )

    def _reproduce_in_sandbox(
        self, ws: Workspace, spec: RecoverySpec, provider: LocalProcessProvider, procedure: SandboxProcedure
    ) -> StageResult:
        """Stage 5 for a command or test reproduction, in the set-up workspace."""
        self.listener.started("report", f"{procedure.kind} reproduction {procedure.name!r}, {procedure.runs} run(s)")
        started = time.monotonic()
        logs = self.settings.log_dir / "reproduction"
        logs.mkdir(parents=True, exist_ok=True)
        found = reproduce_in_sandbox(
            ws.path,
            spec.recipe,
            procedure,
            self._sandbox_run(ws, spec, provider),
            logs,
            setup=False,
            progress=self.listener.progress,
        )
        (logs / "reproduction.json").write_text(found.model_dump_json(indent=2), encoding="utf-8")
        hint = ""
        if isinstance(procedure, TestProcedure) and not spec.recipe.test_subset:
            # Nothing ran: the generic "a step or check could not be completed" would send the reader to a log
            # that holds no run. The fix is one line of the recipe.
            hint = (
                "add `test_subset` to durafix.yaml: the command that runs only the named tests, `{files}` standing "
                f"for them (for pytest: `test_subset: {spec.recipe.test} {{files}}`)"
                if "pytest" in spec.recipe.test
                else "add `test_subset` to durafix.yaml: the command that runs only the named tests, `{files}` "
                "standing for them (e.g. `python -m pytest {files}`, `node --test {files}`)"
            )
        return self._judged(started, found.status, found.detail, logs / "reproduction.json", hint=hint)

    def _sandbox_run(self, ws: Workspace, spec: RecoverySpec, provider: LocalProcessProvider) -> SandboxRun:
        """A reproduction's script run in the set-up workspace's sandbox, as a worker's sandbox step runs it."""

        def sandboxed(command: str, log: Path, setup_first: bool, timeout_s: float) -> TestRunResult:
            return provider.run_checks(
                spec,
                str(ws.path),
                run_id=self.run_id,
                op_id="check:reproduction",
                log_path=log,
                setup_timeout_s=self.settings.setup_timeout_s,
                test_timeout_s=timeout_s,
                command=command,
                setup=setup_first,
            )

        return sandboxed

    def _draft(self, ws: Workspace, spec: RecoverySpec, provider: LocalProcessProvider, prose: str) -> StageResult:
        """Stage 5 for a report with no block: drafts run in the set-up workspace until one shows the bug (see the
        module docstring). The model's requests carry the check's run ID in their operation IDs."""
        model = self.settings.model
        assert model is not None
        kinds = [k for k in recipe_kinds(spec.recipe) if k != ReproductionKind.BROWSER]
        self.listener.started("report", f"drafting a reproduction with {model.model} (up to {DRAFT_ROUNDS} drafts)")
        started = time.monotonic()
        logs = self.settings.log_dir / "drafts"
        logs.mkdir(parents=True, exist_ok=True)
        # Setup has run in the workspace: its files are listed by a git of the check's own, at the checked commit.
        with isolated_git(ws.path, head=self.commit) as git:
            listed = git.run(["ls-tree", "-r", "-z", "--name-only", "--full-tree", self.commit])
        facts = repository_facts(spec.recipe, [p for p in listed.split("\0") if p])
        title, body = _title_and_body(prose)
        drafter = ProcedureDrafter.from_config(model)
        previous: list[DraftRound] = []
        last = ""
        for n in range(1, DRAFT_ROUNDS + 1):
            try:
                draft = drafter.draft(
                    title, body, f"{self.run_id}:draft-procedure:{n}", kinds=kinds, facts=facts, previous=previous
                )
            except RepairError as err:
                hint = (
                    "the model is configured by OPENAI_BASE_URL, OPENAI_API_KEY and DURAFIX_MODEL; or write the block"
                )
                return self._end("report", started, failed=Outcome.NO_REPRODUCTION, summary=f"{err}", hint=hint)
            procedure = draft.procedure
            assert isinstance(procedure, CommandProcedure | TestProcedure)  # only those kinds were offered
            saved = logs / f"draft-{n}.yaml"
            saved.write_text(draft.procedure_yaml, encoding="utf-8")
            self.listener.progress(f"draft {n}: {describe(procedure)}; running it on {self.commit[:12]}")
            found = reproduce_in_sandbox(
                ws.path,
                spec.recipe,
                procedure,
                self._sandbox_run(ws, spec, provider),
                logs / f"draft-{n}",
                setup=False,
                progress=self.listener.progress,
            )
            (logs / f"draft-{n}.json").write_text(found.model_dump_json(indent=2), encoding="utf-8")
            if found.status == ReproductionStatus.REPRODUCED:
                said = f"reproduces with {describe(procedure)}, drafted from the report (draft {n}): {found.detail}"
                hint = f"to skip drafting, put {saved} in the report as its ```durafix-repro block"
                return self._end("report", started, summary=said, hint=hint, log=saved)
            last = f"{found.status.value}: {found.detail}"
            refusal = f"ran on the base revision {self.commit[:12]}: {last}"
            previous.append(DraftRound(yaml=draft.procedure_yaml, refusal=refusal))
        return self._end(
            "report",
            started,
            failed=Outcome.NOT_REPRODUCED,
            summary=f"none of the {DRAFT_ROUNDS} drafts showed the bug on {self.commit[:12]}; the last: {last}",
            hint=f"the drafts are in {logs}; say in the report how to see the bug, or write the block yourself",
            log=logs,
        )

    def _reproduce_against_app(
        self,
        ws: Workspace,
        spec: RecoverySpec,
        provider: LocalProcessProvider,
        handle: EnvironmentHandle,
        procedure: CommandProcedure,
    ) -> StageResult:
        """Stage 5 for a command reproduction with ``app: true``: each run's script in the started app's
        environment (:meth:`~environments.local.LocalProcessProvider.run_in`), as a run's
        ``env.reproduce_in_environment`` runs it."""
        self.listener.started(
            "report", f"command reproduction {procedure.name!r} against the app, {procedure.runs} run(s)"
        )
        started = time.monotonic()
        logs = self.settings.log_dir / "reproduction"
        logs.mkdir(parents=True, exist_ok=True)

        def in_environment(command: str, log: Path, setup_first: bool, timeout_s: float) -> TestRunResult:
            return provider.run_in(handle, spec, str(ws.path), command, log_path=log, timeout_s=timeout_s)

        found = reproduce_in_sandbox(
            ws.path, spec.recipe, procedure, in_environment, logs, setup=False, progress=self.listener.progress
        )
        (logs / "reproduction.json").write_text(found.model_dump_json(indent=2), encoding="utf-8")
        return self._judged(started, found.status, found.detail, logs / "reproduction.json")

    def _judged(
        self, started: float, status: ReproductionStatus, detail: str, log: Path, *, hint: str = ""
    ) -> StageResult:
        if status == ReproductionStatus.REPRODUCED:
            return self._end("report", started, summary=f"reproduces: {detail}", log=log)
        if status == ReproductionStatus.NOT_REPRODUCED:
            return self._end(
                "report",
                started,
                failed=Outcome.NOT_REPRODUCED,
                summary=f"did not reproduce: {detail}",
                hint="the bug is not present on this commit as the procedure checks it: fix the procedure's "
                "`bug_present` checks, or check a commit that has the bug",
                log=log,
            )
        return self._end(
            "report",
            started,
            failed=Outcome.INCONCLUSIVE,
            summary=f"inconclusive: {detail}",
            hint=hint or "a step or check could not be completed, or the runs disagreed: the log says which",
            log=log,
        )

    # ---- saying it -----------------------------------------------------------------------------------------

    def _failed_command(
        self, stage: str, started: float, err: EnvironmentError, code: Outcome, log: Path
    ) -> StageResult:
        found = diagnose(err.failed, tail(err.log_path) if err.log_path else str(err)) if err.failed else None
        first = str(err).splitlines()[0].rstrip(":") if str(err) else type(err).__name__
        return self._end(
            stage,
            started,
            failed=code,
            summary=first,
            hint=found.hint if found else "",
            log=log if log.exists() else None,
        )

    def _end(
        self,
        stage: str,
        started: float,
        *,
        failed: Outcome | None = None,
        summary: str = "",
        hint: str = "",
        log: Path | None = None,
    ) -> StageResult:
        result = StageResult(
            stage,
            "failed" if failed is not None else "passed",
            time.monotonic() - started,
            summary,
            hint,
            log,
            failed if failed is not None else Outcome.PASSED,
        )
        self.listener.ended(result)
        return result

    def _skipped(self, stage: str, why: str) -> StageResult:
        result = StageResult(stage, "skipped", summary=why)
        self.listener.ended(result)
        return result


def _title_and_body(report: str) -> tuple[str, str]:
    """A report file as an issue's title and body: its first line (a Markdown heading's text) and the rest."""
    first, _, rest = report.strip().partition("\n")
    return first.lstrip("#").strip() or "bug report", rest.strip()


def _kind(reproduction: Reproduction) -> str:
    return "browser" if isinstance(reproduction, Procedure) else str(reproduction.kind)


def _commands(commands: list[str]) -> str:
    return "; ".join(command_text(c) for c in commands)


def _keep(source: Path | None, dest: Path) -> None:
    """Copy the provider's log (which its cleanup removes) into the kept log directory."""
    if source is not None and source.is_file() and source != dest:
        shutil.copyfile(source, dest)
