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

Where commands run is the caller's :class:`~environments.sandbox.Sandbox` (``None``: plain host processes, as
the ``unsandboxed`` sandbox does). In it setup may write the workspace and the package caches, and reaches the
network only when the recipe says ``setup_network: true``; the tests may write the workspace only and have no
network. Both get the recipe's secrets only as far as the operator's ``allowed_secrets`` names them.
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from environments.commands import command_env, run_to_completion, tail
from environments.depcache import BuildRecord, DependencyCache
from environments.interface import AppRecipe, EnvironmentError, Progress, TestRunResult
from environments.passthrough import Screened, check_patterns, screen
from environments.processes import stop_owned
from environments.progress import command_text, ignore
from environments.sandbox import Network, Sandbox

_log = logging.getLogger(__name__)

# Where each package manager keeps its download cache, as the variable it reads and the directory under the
# worker's package cache directory: kept across workspaces, so a cache miss still downloads nothing it has seen.
PACKAGE_CACHE_VARS = {
    "npm_config_cache": "npm",
    "YARN_CACHE_FOLDER": "yarn",
    "PIP_CACHE_DIR": "pip",
    "UV_CACHE_DIR": "uv",
    "POETRY_CACHE_DIR": "poetry",
}


class SetupError(EnvironmentError):
    """A setup command of the recipe failed or timed out; the message holds the log tail."""


@dataclass(frozen=True)
class SetupSettings:
    """How this worker runs setup commands. The default is none of it: no cache, the package managers' own
    cache locations (under ``HOME``), no worker variable beyond the neutral ones.

    ``package_caches``: the directory each package manager's cache variable (:data:`PACKAGE_CACHE_VARS`) points
    into. ``passthrough``: glob patterns of the worker variables setup may see, checked as
    :func:`environments.passthrough.check_patterns` does (a :class:`~environments.passthrough.PassthroughError`
    here); a passed-through variable wins over a package cache location of the same name (the operator set it).
    """

    cache: DependencyCache | None = None
    package_caches: Path | None = None
    passthrough: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "passthrough", check_patterns(self.passthrough))

    def worker_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """What setup commands get from the worker on top of the neutral variables (see :func:`command_env`)."""
        return self.screen_worker_env(environ).env

    def screen_worker_env(self, environ: Mapping[str, str]) -> Screened:
        """:meth:`worker_env` with the names of the variables withheld for credentials in their value
        (:func:`environments.passthrough.screen`)."""
        env: dict[str, str] = {}
        if self.package_caches is not None:
            for variable, name in PACKAGE_CACHE_VARS.items():
                directory = self.package_caches.absolute() / name
                directory.mkdir(parents=True, exist_ok=True)
                env[variable] = str(directory)
        screened = screen(self.passthrough, environ)
        env.update(screened.env)
        return Screened(env, screened.withheld)


@dataclass(frozen=True)
class SetupOutcome:
    """What :func:`run_setup` did: ran the commands (``ran``), restored an entry instead (``restored``), and
    whether it stored one (``stored``); ``cache`` says what the dependency cache did, as the log says it."""

    ran: bool
    restored: BuildRecord | None = None
    stored: BuildRecord | None = None
    cache: str = ""


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
    the dependency cache``). A restored workspace is not trusted more than one set up anew: the caller checks it
    the same way (readiness when provisioning, the tests when verifying). What the cache did is written to
    ``log_path`` (``# dependency cache: ...`` lines) and returned; a cache that cannot be used never fails
    setup, it only means the commands run. Setup commands with effects outside the workspace (a database, a
    file elsewhere) run once per entry, not once per workspace.
    """
    settings = settings or SetupSettings()
    outcome = SetupOutcome(ran=False)
    if not recipe.setup:
        return outcome
    worker = settings.screen_worker_env(os.environ)
    for warning in worker.warnings():
        # The worker's log, the run's progress and the setup log all say it: a setup that then fails for want
        # of its index is explained where whoever reads any of them looks.
        _log.warning("%s", warning)
        progress(warning)
        _log_line(log_path, warning)
    env = command_env(recipe, marker=marker, worker=worker.env, allowed_secrets=allowed_secrets)
    run = _Runner(ws_path, recipe, env, marker, log_path, timeout_s, progress, stop_grace_s, sandbox, settings)
    cache = settings.cache
    if cache is None:
        run()
        return SetupOutcome(ran=True)
    if not repository:
        raise ValueError("run_setup with a dependency cache needs the repository")
    key = cache.key_for(ws_path, recipe, repository=repository, provider=provider)
    uncached = key if isinstance(key, str) else cache.occupied(key, ws_path)
    if uncached or isinstance(key, str):
        _note(log_path, uncached)
        run()
        return SetupOutcome(ran=True, cache=uncached)
    if cache.entry_path(key).is_dir():
        progress(f"setup: restoring {', '.join(key.paths)} from the dependency cache")
    restored = cache.restore(key, ws_path)
    if isinstance(restored, str):
        with cache.building(key, progress) as exclusive:
            # Another builder may have finished while this one waited for the lock.
            again = cache.restore(key, ws_path) if exclusive else restored
            if isinstance(again, str):
                _note(log_path, f"miss ({again}); running setup")
                before = cache.checkout_state(ws_path)
                run()
                progress(f"setup: storing {', '.join(key.paths)} in the dependency cache")
                stored = cache.store(key, ws_path, before, exclusive=exclusive)
                if isinstance(stored, str):
                    _note(log_path, stored)
                    return SetupOutcome(ran=True, cache=stored)
                note = f"stored entry {key.key[:12]} ({stored.files} files, {stored.method})"
                _note(log_path, note)
                return SetupOutcome(ran=True, stored=stored, cache=note)
            restored = again
    note = (
        f"restored entry {key.key[:12]} instead of running setup ({restored.record.summary()}; "
        f"{restored.record.files} files by {restored.method} in {restored.seconds:.2f} s)"
    )
    _note(log_path, note)
    return SetupOutcome(ran=False, restored=restored.record, cache=note)


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
    settings: SetupSettings

    def __call__(self) -> None:
        writable = [self.settings.package_caches.absolute()] if self.settings.package_caches is not None else []
        network = Network.HOST if self.recipe.setup_network else Network.NONE
        for command in self.recipe.setup:
            self.progress(f"setup: {command_text(command)}")
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
            if code != 0:
                stop_owned(self.marker, grace_s=self.stop_grace_s)
                outcome = "timed out" if code is None else f"exited {code}"
                raise SetupError(f"setup command {command!r} {outcome}:\n{tail(self.log_path)}", log_path=self.log_path)


def _note(log_path: Path, text: str) -> None:
    _log_line(log_path, f"dependency cache: {text}")


def _log_line(log_path: Path, text: str) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"# {text}\n")


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
    return TestRunResult(
        passed=code == 0,
        exit_code=code,
        timed_out=code is None,
        duration_s=duration,
        output_tail=tail(log_path),
        log_path=log_path,
    )
