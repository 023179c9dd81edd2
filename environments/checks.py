"""A recipe's commands in a workspace: its setup, and its test command as a targeted check.

Setup runs in every workspace whose app or tests are used (a provider's before it starts the app, a
verification's before the tests), so ``test`` never has to repeat it. Each command runs like any recipe
command (built environment, own session, see :mod:`environments.commands`); on timeout its whole process
group is stopped. A test command that could not run at all (the shell's 126/127: not executable, not found)
is told apart from one whose tests failed: :attr:`TestRunResult.runnable`.

How this worker runs setup is its :class:`SetupSettings`: a dependency cache (:mod:`environments.depcache`) whose
entries replace running setup in a workspace with the same lock files, the directory the package managers keep
their download caches in, and the worker variables setup may see (:mod:`environments.passthrough`). Only setup
gets those; the app, its fixtures and the tests run with the plain recipe environment.

**Package caches** are one per repository (``<package_caches>/<repository>/npm`` and so on, named by the
repository the spec is for, never by anything in the workspace), so one repository's setup can neither read
nor plant what another's installs read: the sandbox mounts only that repository's directory. A setup in a
candidate's workspace (its staged tree is not the base revision's, or its lock files differ: what it runs and
installs is the model's choice) gets a fresh, empty cache of its own instead, removed when setup ends, so
nothing it downloaded or wrote there is read by a later setup. Candidates usually skip setup anyway: the
dependency cache restores the base's result when their lock files are unchanged.

Where commands run is the caller's :class:`~environments.sandbox.Sandbox` (``None``: plain host processes, as
the ``unsandboxed`` sandbox does). In it setup may write the workspace and the package caches, and reaches the
network only when the recipe says ``setup_network: true``, and then only the package registries: through an
egress proxy of its own (:mod:`environments.egress`) that allows the settings' ``egress_hosts`` and refuses
every loopback, private, link-local or worker address; each tunnel it reached or refused is a ``# egress:``
line in the setup's log. The tests may write the workspace only and have no network. Both get the recipe's
secrets only as far as the operator's ``allowed_secrets`` names them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from opentelemetry import trace

from environments.ca_bundle import SYSTEM_BUNDLE
from environments.commands import command_env, exit_text, log_note, run_to_completion, tail
from environments.depcache import BuildRecord, CacheKey, DependencyCache, Restored
from environments.diagnosis import FailedCommand, Stage
from environments.egress import (
    ALLOWED_PORTS,
    DEFAULT_REGISTRY_HOSTS,
    EgressEvent,
    EgressProxy,
    log_events,
    parse_hosts,
)
from environments.files import locked, path_key, remove_abandoned, remove_tree
from environments.git import GitError, GitInterrupted, isolated_git
from environments.interface import AppRecipe, EnvironmentError, Progress, TestRunResult
from environments.passthrough import Screened, check_patterns, screen
from environments.processes import stop_owned
from environments.progress import command_text, ignore
from environments.sandbox import WORKSPACE, Egress, Network, Sandbox
from environments.spec import dependency_lock_hash, lock_files

_log = logging.getLogger(__name__)
# Spans through the plain OpenTelemetry API: a no-op unless the process installed an SDK.
_tracer = trace.get_tracer("durafix.environments")

# Where each package manager keeps its download cache, as the variable it reads and the directory under the
# worker's package cache directory: kept across workspaces, so a cache miss still downloads nothing it has seen.
PACKAGE_CACHE_VARS = {
    "npm_config_cache": "npm",
    # Yarn classic's cache, and yarn berry's when a project turns the global cache off (its cacheFolder).
    "YARN_CACHE_FOLDER": "yarn",
    # Yarn berry's global folder, which holds its cache by default (enableGlobalCache); else under HOME, which the
    # sandbox empties for every command.
    "YARN_GLOBAL_FOLDER": "yarn-berry",
    "PIP_CACHE_DIR": "pip",
    "UV_CACHE_DIR": "uv",
    "POETRY_CACHE_DIR": "poetry",
}
# pnpm's package store and metadata cache, for a workspace with a pnpm lock file only: npm warns about every
# npm_config_ variable it does not know. Without an explicit store, pnpm keeps one on the project's own
# filesystem, which in the sandbox is the workspace's mount: /workspace/.pnpm-store, in the checkout, so setup
# changed more than the cached paths and nothing was cached.
PNPM_STORE_VARS = {"npm_config_store_dir": "pnpm-store", "npm_config_cache_dir": "pnpm-cache"}
PNPM_LOCK = "pnpm-lock.yaml"


# A candidate's own package cache, beside the repositories'; held by a lock beside it while in use, so one a
# killed worker left is removed by the next setup that makes one.
THROWAWAY_PREFIX = ".throwaway-"


class SetupError(EnvironmentError):
    """A setup command of the recipe failed or timed out; the message holds the log tail."""


@dataclass(frozen=True)
class SetupSettings:
    """How this worker runs setup commands. The default is none of it: no cache, the package managers' own
    cache locations (under ``HOME``), no worker variable beyond the neutral ones.

    ``package_caches``: the directory under which each repository's package caches are kept (each package
    manager's cache variable, :data:`PACKAGE_CACHE_VARS`, points into the repository's; see the module).
    ``passthrough``: glob patterns of the worker variables setup may see, checked as
    :func:`environments.passthrough.check_patterns` does (a :class:`~environments.passthrough.PassthroughError`
    here); a passed-through variable wins over a package cache location of the same name (the operator set it).
    ``egress_hosts``: the host names a sandboxed setup with ``setup_network: true`` may reach through its egress
    proxy (:func:`environments.egress.parse_hosts`; default the package registries), on ``egress_ports`` only.
    ``ca_bundle``: the CA certificates the Docker provider's images trust besides Debian's (``DURAFIX_CA_BUNDLE``;
    :mod:`environments.docker.trust`), ``None`` for Debian's only; the local sandbox shows the worker's own.
    """

    cache: DependencyCache | None = None
    package_caches: Path | None = None
    passthrough: tuple[str, ...] = field(default=())
    egress_hosts: tuple[str, ...] = DEFAULT_REGISTRY_HOSTS
    egress_ports: tuple[int, ...] = ALLOWED_PORTS
    ca_bundle: Path | None = Path(SYSTEM_BUNDLE)

    def __post_init__(self) -> None:
        object.__setattr__(self, "passthrough", check_patterns(self.passthrough))
        object.__setattr__(self, "egress_hosts", parse_hosts(self.egress_hosts))

    def package_cache(self, repository: str) -> Path | None:
        """``repository``'s package cache directory (``None``: no package caches configured)."""
        if self.package_caches is None:
            return None
        return self.package_caches.absolute() / path_key(repository)

    def worker_env(
        self, environ: Mapping[str, str], packages: Path | None = None, *, pnpm: bool = False
    ) -> dict[str, str]:
        """What setup commands get from the worker on top of the neutral variables (see :func:`command_env`)."""
        return self.screen_worker_env(environ, packages, pnpm=pnpm).env

    def screen_worker_env(
        self, environ: Mapping[str, str], packages: Path | None = None, *, pnpm: bool = False
    ) -> Screened:
        """The package managers' cache variables pointing into ``packages`` (created here; pnpm's store and cache
        too when ``pnpm``: the workspace has a pnpm lock file) and the passed-through variables, with the names of
        those withheld for credentials in their value (:func:`environments.passthrough.screen`)."""
        env: dict[str, str] = {}
        if packages is not None:
            for variable, name in {**PACKAGE_CACHE_VARS, **(PNPM_STORE_VARS if pnpm else {})}.items():
                directory = packages / name
                directory.mkdir(parents=True, exist_ok=True)
                env[variable] = str(directory)
        screened = screen(self.passthrough, environ)
        env.update(screened.env)
        return Screened(env, screened.withheld)

    @contextlib.contextmanager
    def packages_for(
        self,
        ws: Path,
        recipe: AppRecipe,
        repository: str | None,
        base_lock_hash: str | None,
        candidate: bool = False,
    ) -> Iterator[Path | None]:
        """The package cache directory setup in ``ws`` gets for the block: ``repository``'s own when the
        workspace's lock files are the base revision's (``base_lock_hash``: the spec's) and it is not a
        ``candidate``'s (what a candidate's setup runs, a ``postinstall`` script say, is the model's choice, so
        it never writes a cache another setup reads); else a new empty one, removed afterwards (a changed or
        unreadable lock, a candidate, no repository named)."""
        if self.package_caches is None:
            yield None
            return
        shared = self.package_cache(repository) if repository else None
        if shared is not None:
            try:
                same = dependency_lock_hash(ws, recipe) == base_lock_hash
            except EnvironmentError:
                same = False
            if same and not candidate:
                yield shared
                return
        root = self.package_caches.absolute()
        root.mkdir(parents=True, exist_ok=True)
        # Throwaway package caches whose setup's worker died: nobody reads them any more.
        remove_abandoned(root.glob(f"{THROWAWAY_PREFIX}*"), remove_tree)
        throwaway = root / f"{THROWAWAY_PREFIX}{uuid.uuid4().hex}"
        lock = throwaway.with_name(throwaway.name + ".lock")
        try:
            with locked(lock):
                throwaway.mkdir()
                try:
                    yield throwaway
                finally:
                    remove_tree(throwaway)
        finally:
            lock.unlink(missing_ok=True)


def _uses_pnpm(ws: Path, recipe: AppRecipe) -> bool:
    """Whether one of ``ws``'s lock files is pnpm's."""
    return any(PurePosixPath(name).name == PNPM_LOCK for name in lock_files(ws, recipe))


def _is_base_tree(ws: Path, base_revision: str) -> bool:
    """Whether the tree staged in ``ws`` is ``base_revision``'s (read through the worker's own git directory:
    the workspace's metadata is never trusted); ``False`` when that cannot be told."""
    try:
        with isolated_git(ws) as git:
            return git.run(["write-tree"]) == git.run(["rev-parse", "--verify", f"{base_revision}^{{tree}}"])
    except (GitError, GitInterrupted):
        return False


@dataclass(frozen=True)
class SetupOutcome:
    """What :func:`run_setup` did: ran the commands (``ran``), restored an entry instead (``restored``), and
    whether it stored one (``stored``); ``cache`` says what the dependency cache did, as the log says it;
    ``egress``: the tunnels its commands asked the egress proxy for, reached or refused (empty without one)."""

    ran: bool
    restored: BuildRecord | None = None
    stored: BuildRecord | None = None
    cache: str = ""
    egress: tuple[EgressEvent, ...] = ()


def run_setup(
    ws_path: Path,
    recipe: AppRecipe,
    *,
    marker: str,
    log_path: Path,
    timeout_s: float,
    progress: Progress = ignore,
    stop_grace_s: float = 5.0,
    settings: SetupSettings | None = None,
    repository: str | None = None,
    base_lock_hash: str | None = None,
    base_revision: str | None = None,
    provider: str = "local",
    sandbox: Sandbox | None = None,
    allowed_secrets: tuple[str, ...] = (),
) -> SetupOutcome:
    """Run ``recipe.setup`` in order in ``ws_path``, appending to ``log_path``; raise :class:`SetupError` on
    the first command that fails or times out (after stopping everything carrying ``marker``).

    With a dependency cache in ``settings`` (then ``repository`` is required; ``provider`` is where setup runs,
    part of the key), an entry for this workspace's lock files is restored instead of running the commands
    (``progress`` hears ``setup: restoring <paths> from the dependency cache`` when there is an entry to try). On
    a miss the commands run (``setup: <command>`` each; first ``setup: waiting for another build ...`` while
    another builder of the same key finishes), then what they produced is stored (``setup: storing <paths> in
    the dependency cache``). A recipe's ``setup_check`` runs after each restore (``setup: checking the
    environment: <command>``): failing, the restored paths are removed, the entry is discarded (unless the
    workspace is a candidate's, whose patch may be what fails) and the commands run, as the log says. It runs
    after the commands of a miss too: failing there, nothing is stored. A restored workspace is not trusted more
    than one set up anew: the caller checks it the same way (readiness when provisioning, the tests when
    verifying). What the cache did is written to
    ``log_path`` (``# dependency cache: ...`` lines) and returned; a cache that cannot be used never fails
    setup, it only means the commands run. Setup commands with effects outside the workspace (a database, a
    file elsewhere) run once per entry, not once per workspace.

    The package caches setup writes are ``repository``'s, when ``ws_path``'s lock files hash to
    ``base_lock_hash`` (the spec's :attr:`~environments.interface.RecoverySpec.dependency_lock_hash`) and, given
    ``base_revision``, its staged tree is that revision's; else a throwaway one (see the module). A candidate's
    workspace (its staged tree is not ``base_revision``'s) restores dependency-cache entries but never stores
    one: an entry is only ever what the base revision's own setup produced.
    """
    settings = settings or SetupSettings()
    if not recipe.setup:
        return SetupOutcome(ran=False)
    # A workspace whose staged tree is not the base revision's holds a candidate's change.
    candidate = base_revision is not None and not _is_base_tree(ws_path, base_revision)
    with settings.packages_for(ws_path, recipe, repository, base_lock_hash, candidate) as packages:
        worker = settings.screen_worker_env(os.environ, packages, pnpm=_uses_pnpm(ws_path, recipe))
        for warning in worker.warnings():
            # The worker's log, the run's progress and the setup log all say it: a setup that then fails for want
            # of its index is explained where whoever reads any of them looks.
            _log.warning("%s", warning)
            progress(warning)
            log_note(log_path, warning)
        env = command_env(recipe, marker=marker, worker=worker.env, allowed_secrets=allowed_secrets)
        run = _Runner(
            ws_path, recipe, env, marker, log_path, timeout_s, progress, stop_grace_s, sandbox, packages, settings
        )
        outcome = _set_up(ws_path, recipe, log_path, progress, settings, repository, provider, run, candidate)
    _log_outcome(outcome, candidate)
    return outcome


def _log_outcome(outcome: SetupOutcome, candidate: bool) -> None:
    """One line in the worker's log for every setup that had commands to run: whether they ran or the dependency
    cache restored their result, and for which tree. With the run and step the worker's log lines carry, it is
    how an operator (and the real-project tests) count how often a run's revisions were set up."""
    tree = "a candidate's tree" if candidate else "the base revision's tree"
    did = "ran the recipe's setup commands" if outcome.ran else "restored the dependency cache's entry"
    # Quoted: the cache's note may name the recipe's paths, which the repository wrote.
    _log.info("setup of %s: %s (dependency cache: %r)", tree, did, outcome.cache or "none")


def _set_up(
    ws_path: Path,
    recipe: AppRecipe,
    log_path: Path,
    progress: Progress,
    settings: SetupSettings,
    repository: str | None,
    provider: str,
    run: _Runner,
    candidate: bool,
) -> SetupOutcome:
    cache = settings.cache
    if cache is None:
        return SetupOutcome(ran=True, egress=run())
    if not repository:
        raise ValueError("run_setup with a dependency cache needs the repository")
    # Sandboxed, setup saw the workspace at the sandbox's fixed path: restored entries are used unchanged.
    mount = WORKSPACE if run.sandbox is not None and run.sandbox.sandboxed else ""
    key = cache.key_for(ws_path, recipe, repository=repository, provider=provider, mount=mount)
    uncached = key if isinstance(key, str) else cache.occupied(key, ws_path)
    if uncached or isinstance(key, str):
        _note(log_path, uncached)
        return SetupOutcome(ran=True, cache=uncached, egress=run())
    if cache.entry_path(key).is_dir():
        progress(f"setup: restoring {', '.join(key.paths)} from the dependency cache")
    restored, rejected = _restore_checked(cache, key, run)
    if isinstance(restored, str):
        with cache.building(key, progress) as exclusive:
            if rejected and exclusive and not candidate:
                # Under the build lock, so the setup about to run stores its result in the entry's place. A
                # candidate's failing check may be its patch's doing: the base's entry stays.
                cache.discard(key)
            # Another builder may have finished while this one waited for the lock.
            again = _restore_checked(cache, key, run)[0] if exclusive and not rejected else restored
            if isinstance(again, str):
                if candidate:
                    # What a candidate's setup produced is the model's doing: restored from, never stored.
                    note = f"miss ({again}); running setup (a candidate's setup result is not stored)"
                    _note(log_path, note)
                    return SetupOutcome(ran=True, cache=note, egress=run())
                _note(log_path, f"miss ({again}); running setup")
                before = cache.checkout_state(ws_path)
                egress = run()
                failed = run.check() if recipe.setup_check else ""
                if failed:
                    # An entry this check rejects would be discarded at every restore: not stored at all.
                    note = f"not cached: the recipe's setup_check failed after setup itself ({failed})"
                    _note(log_path, note)
                    return SetupOutcome(ran=True, cache=note, egress=egress)
                progress(f"setup: storing {', '.join(key.paths)} in the dependency cache")
                stored = cache.store(key, ws_path, before, exclusive=exclusive)
                if isinstance(stored, str):
                    _note(log_path, stored)
                    return SetupOutcome(ran=True, cache=stored, egress=egress)
                note = f"stored entry {key.key[:12]} ({stored.files} files, {stored.method})"
                _note(log_path, note)
                return SetupOutcome(ran=True, stored=stored, cache=note, egress=egress)
            restored = again
    note = (
        f"restored entry {key.key[:12]} instead of running setup ({restored.record.summary()}; "
        f"{restored.record.files} files by {restored.method} in {restored.seconds:.2f} s)"
    )
    _note(log_path, note)
    return SetupOutcome(ran=False, restored=restored.record, cache=note)


def _restore_checked(cache: DependencyCache, key: CacheKey, run: _Runner) -> tuple[Restored | str, bool]:
    """Restore ``key``'s entry into the workspace and run the recipe's ``setup_check`` there; (the restore or why
    there is none, whether the check rejected it). A rejected restore is removed from the workspace again."""
    restored = cache.restore(key, run.ws_path)
    if isinstance(restored, str) or not run.recipe.setup_check:
        return restored, False
    failed = run.check()
    if not failed:
        return restored, False
    for path in key.paths:
        remove_tree(run.ws_path / path)
    reason = f"entry {key.key[:12]} failed the recipe's setup_check ({failed}); discarded it"
    return reason, True


@dataclass(frozen=True)
class _Runner:
    """Runs the recipe's setup commands in order, in the sandbox when there is one."""

    ws_path: Path
    recipe: AppRecipe
    env: Mapping[str, str]
    marker: str
    log_path: Path
    timeout_s: float
    progress: Progress
    stop_grace_s: float
    sandbox: Sandbox | None
    packages: Path | None
    settings: SetupSettings

    def __call__(self) -> tuple[EgressEvent, ...]:
        """Run the commands; the egress proxy's events when they had one (see the module docstring)."""
        if not self.recipe.setup_network:
            self._run(Network.NONE)
            return ()
        if self.sandbox is None or not self.sandbox.sandboxed:
            # Plain host processes (the operator's explicit choice): nothing here can confine their network.
            self._run(Network.HOST)
            return ()
        # The marker, not only the process group, is what stops a proxy: one left by an earlier try of this
        # setup (its worker died) goes when this one does.
        marker = f"{self.marker}/egress"
        with EgressProxy(self.settings.egress_hosts, ports=self.settings.egress_ports, marker=marker) as proxy:
            self._run(Egress(proxy.socket_path), proxy)
            return tuple(proxy.events())

    def check(self) -> str:
        """Run the recipe's ``setup_check`` as the tests run (no network, the workspace its only writable
        tree); how it failed, or ``""``."""
        command = self.recipe.setup_check or "true"
        self.progress(f"setup: checking the environment: {command_text(command)}")
        code = self._one(command, Network.NONE, writable=[])
        if code == 0:
            return ""
        return exit_text(code)

    def _one(self, command: str, network: Network | Egress, *, writable: list[Path]) -> int | None:
        """One command in the workspace, logged, in the sandbox; its exit code (``None``: timed out)."""
        code, _ = run_to_completion(
            command,
            cwd=self.ws_path,
            env=self.env,
            log_path=self.log_path,
            timeout_s=self.timeout_s,
            sandbox=self.sandbox,
            writable=writable,
            network=network,
        )
        return code

    def _run(self, network: Network | Egress, proxy: EgressProxy | None = None) -> None:
        writable = [self.packages] if self.packages is not None else []
        logged = 0
        for command in self.recipe.setup:
            self.progress(f"setup: {command_text(command)}")
            with _tracer.start_as_current_span("setup command", attributes={"command": command_text(command)}) as span:
                code = self._one(command, network, writable=writable)
                span.set_attribute("exit", exit_text(code))
                if code != 0:
                    span.set_status(trace.StatusCode.ERROR, exit_text(code))
            if proxy is not None:
                logged = self._log_egress(proxy, logged)
            if code != 0:
                stop_owned(self.marker, grace_s=self.stop_grace_s)
                raise SetupError(
                    f"setup command {command!r} {exit_text(code)}:\n{tail(self.log_path)}",
                    log_path=self.log_path,
                    failed=FailedCommand(Stage.SETUP, command, code, setup_network=self.recipe.setup_network),
                )

    def _log_egress(self, proxy: EgressProxy, logged: int) -> int:
        """Append the proxy's events since the ``logged`` first ones to the setup log (see
        :func:`environments.egress.log_events`); return how many events are logged now."""
        events = proxy.events()
        log_events(events[logged:], self.log_path, self.progress)
        return len(events)


def _note(log_path: Path, text: str) -> None:
    log_note(log_path, f"dependency cache: {text}")


def run_tests(
    ws_path: Path,
    recipe: AppRecipe,
    timeout_s: float,
    *,
    log_path: Path | None = None,
    command: str | None = None,
    sandbox: Sandbox | None = None,
    allowed_secrets: tuple[str, ...] = (),
    marker: str | None = None,
) -> TestRunResult:
    """Run ``command`` (default ``recipe.test``) in ``ws_path``; passed means exit code 0 within ``timeout_s``.

    ``marker``: the ownership marker its processes carry (default: one of their own, ``tests/<uuid>``); a
    provider passes one under the run's key, so the run's cleanup and inventory see a test still running.

    In ``sandbox`` (when given) the tests may write ``ws_path`` only and have no network; whatever they leave
    running dies when the test command ends. The full output goes to ``log_path`` (default: a new temporary
    file, which the caller owns); the result carries its last 4 KB.
    """
    if log_path is None:
        with tempfile.NamedTemporaryFile(prefix="durafix-tests-", suffix=".log", delete=False) as fh:
            log_path = Path(fh.name)
    code, duration = run_to_completion(
        command or recipe.test,
        cwd=ws_path,
        env=command_env(recipe, marker=marker or f"tests/{uuid.uuid4().hex}", allowed_secrets=allowed_secrets),
        log_path=log_path,
        timeout_s=timeout_s,
        sandbox=sandbox,
        network=Network.NONE,
    )
    return result_of_tests(code, duration, log_path)


def result_of_tests(code: int | None, duration_s: float, log_path: Path) -> TestRunResult:
    """What a test command came to, in any provider: passed means exit code 0; ``code`` None means it was
    killed at its timeout; the output tail is read from ``log_path``, where the full output is."""
    return TestRunResult(
        passed=code == 0,
        exit_code=code,
        timed_out=code is None,
        duration_s=duration_s,
        output_tail=tail(log_path),
        log_path=log_path,
    )
