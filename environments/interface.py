"""The environment capability's typed interface.

An *environment* is a running copy of the application under repair, built from a :class:`RecoverySpec`
(recorded inputs) and a workspace checkout. Providers (local processes, Docker) implement
:class:`EnvironmentProvider`; the workflow only ever sees these models.

Contracts every provider honours:

- ``provision`` is idempotent per ``op_id``: a second call with the same ``op_id`` adopts the resources the
  first call created (found by their ownership record / labels) instead of creating more. A resource that
  carries the same name but belongs to another run is a conflict, never adopted.
- Before creating anything, ``provision`` checks the run's tombstone: once ``cleanup_run`` has tombstoned a
  run, no late attempt can create resources for it (:class:`RunFencedError`).
- ``check`` re-probes readiness against the live resources; nothing is trusted from recorded state.
- ``cleanup_run`` removes only what the run owns, is idempotent, and reports what could not be removed.
- ``provision`` reports what it is doing through its optional ``progress`` callback (see :data:`Progress`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator

from environments.diagnosis import FailedCommand, Stage
from environments.progress import ignore

# A provider calls this with a short human sub-state ("setup: npm ci", "waiting for readiness at ...") each
# time its work changes, on the provisioning thread. Text only: the receiver adds timing itself. It must not
# raise; an exception from it is not caught and ends the provision like any other error.
Progress = Callable[[str], None]


class ReadinessProbe(BaseModel):
    """HTTP readiness probe: GET ``path`` until it answers ``expected_status`` or ``deadline_s`` passes."""

    path: str = "/"
    expected_status: int = 200
    deadline_s: float = 30.0


class ResourceLimits(BaseModel):
    memory_mb: int = 512
    pids: int = 256
    cpus: float = 1.0


class ImageRecipe(BaseModel):
    """How to build the environment's base image (Docker provider); ignored by the local provider."""

    base: Literal["debian-bookworm"] = "debian-bookworm"
    packages: list[str] = Field(default_factory=lambda: ["python3"])


# Where fixture commands find the app they seed.
APP_URL_VAR = "DURAFIX_APP_URL"


class AppRecipe(BaseModel):
    """What a repository declares about itself in ``durafix.yaml`` at its root."""

    setup: list[str] = Field(default_factory=list)
    start: str | None = Field(
        default=None,
        description="the command serving the app on `$PORT`; needed only by what reproduces a report in the running "
        "app (a browser procedure). Not given: the repository has no app "
        "to start, and provisioning an environment is refused (NoAppError)",
    )
    port: int = 8000
    readiness: ReadinessProbe = Field(
        default_factory=ReadinessProbe, description="how the started app is probed; meaningless without `start`"
    )
    test: str
    fixtures: list[str] = Field(
        default_factory=list,
        description="seed commands run once against the ready app (``$DURAFIX_APP_URL``), in its workspace",
    )
    env: dict[str, str] = Field(default_factory=dict)
    secrets: dict[str, str] = Field(
        default_factory=dict, description="name -> reference (e.g. 'env:NAME'); values are never stored"
    )
    limits: ResourceLimits = Field(default_factory=ResourceLimits)
    image: ImageRecipe = Field(default_factory=ImageRecipe)
    lock_files: list[str] = Field(
        default_factory=list,
        description="files hashed into the dependency lock hash; when empty, the common ecosystems' lock files "
        "at the repository root are recognised (package-lock.json, yarn.lock, pnpm-lock.yaml, uv.lock, "
        "poetry.lock, requirements*.txt)",
    )
    test_report: str | None = Field(
        default=None,
        description="the JUnit XML file (relative to the repository root) that `test` writes; with it a candidate "
        "is judged per test (it may fail only tests that already fail on the base) and the regression proof names "
        "the tests that fail before the fix and pass after it",
    )
    test_subset: str | None = Field(
        default=None,
        description="a command running only some test files, `{files}` standing for them (shell-quoted, space "
        "separated), e.g. `python -m pytest {files}`; the regression proof runs the patch's test files with it. "
        "Not given: the proof runs `test`",
    )
    test_files: list[str] = Field(
        default_factory=list,
        description="globs naming more test files than the common conventions (tests/, test_*.py, *.test.js, "
        "*.spec.ts, ...; see environments.test_files): `*` within a directory, `**` across directories",
    )
    agent_commands: list[str] = Field(
        default_factory=list,
        description="commands the repair agent's `run` tool may run, in the tests' sandbox (no network, no "
        "secrets), e.g. `npm run lint`: a call runs when its words start with an entry's words. The agent's "
        "`run_tests` tool needs no entry",
    )
    setup_network: bool = Field(
        default=False,
        description="setup commands may use the network (installs such as npm ci, pip install); otherwise they "
        "run, like the tests, with no network at all. On the local provider setup then reaches the package "
        "registries only, through an egress proxy (DURAFIX_SETUP_EGRESS; docs/security.md, Sandbox)",
    )
    setup_check: str | None = Field(
        default=None,
        description="a cheap command proving a restored setup works in this workspace, e.g. `.venv/bin/python -I "
        "-c 'import pkg'`: run (sandboxed, no network) after the dependency cache restored setup's result instead of "
        "running setup; failing, the entry is discarded and setup runs (the environment log says so)",
    )
    cache: list[str] | None = Field(
        default=None,
        description="paths (relative to the repository root) that setup creates and that are cached per lock hash, "
        "so that a workspace with the same lock files gets them restored instead of running setup again. Not "
        "given: node_modules next to a JavaScript lock file, .venv next to a Python one. [] turns caching off",
    )
    browser_origins: list[str] = Field(
        default_factory=list,
        description="origins (scheme://host[:port], http or https) the app's pages may reach from the reproduction "
        "browser besides the app's own; every other request is blocked and listed in the evidence",
    )

    @field_validator("browser_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        return [_origin(item) for item in value]


def _origin(text: str) -> str:
    """``text`` as a normalized origin (lower case, default port explicit: ``https://cdn.example:443``).

    The browser normalizes the same way when it compares (``browser/origins.py``; this package may not
    import it), so what the recipe lists is exactly what the browser allows."""
    try:
        url = urlsplit(text.strip())
        port = url.port
    except ValueError as err:
        raise ValueError(f"{text!r} is not an origin: {err}") from err
    defaults = {"http": 80, "https": 443}
    if url.scheme not in defaults or not url.hostname:
        raise ValueError(f"{text!r} is not an origin: expected http(s)://host[:port]")
    if url.username is not None or url.password is not None:
        raise ValueError(f"{text!r} is not an origin: it carries credentials")
    if url.path not in ("", "/") or url.query or url.fragment or text.strip().endswith(("?", "#")):
        raise ValueError(f"{text!r} is not an origin: no path, query or fragment")
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return f"{url.scheme}://{host}:{port if port is not None else defaults[url.scheme]}"


class RecoverySpec(BaseModel):
    """Everything needed to rebuild an environment on any worker: recipe + repository + exact revision."""

    version: Literal[1] = 1
    repository: str
    clone_url: str
    base_revision: str
    recipe: AppRecipe
    dependency_lock_hash: str | None = None


class ResourceKind(StrEnum):
    PROCESS = "process"
    CONTAINER = "container"
    NETWORK = "network"
    VOLUME = "volume"
    WORKSPACE = "workspace"


class OwnedResource(BaseModel):
    """A resource created by a run, with the identity it was labelled with."""

    kind: ResourceKind
    provider: str
    resource_id: str
    run_id: str
    op_id: str
    detail: dict[str, str] = Field(default_factory=dict)


class EnvironmentStatus(StrEnum):
    READY = "ready"
    NOT_READY = "not-ready"
    GONE = "gone"


# How an environment's untrusted commands ran: in the provider's sandbox, or (local provider, the operator's
# explicit DURAFIX_UNSANDBOXED=1 on a machine without bubblewrap) as plain host processes.
SANDBOX_UNSANDBOXED = "unsandboxed"


class EnvironmentHandle(BaseModel):
    env_id: str
    provider: str
    run_id: str
    op_id: str
    base_url: str
    resources: list[OwnedResource] = Field(default_factory=list)
    sandbox: str = Field(
        default="",
        description="what isolated the environment's commands: 'bubblewrap', 'container', or 'unsandboxed' "
        "(say so wherever the run is reported); empty in handles recorded before sandboxes existed",
    )
    host: str = Field(
        default="",
        description="the worker host that holds the environment, where every step that reaches it must run (its "
        "app answers on that host's loopback only); empty: any host may (one host, or handles recorded before)",
    )

    @property
    def unsandboxed(self) -> bool:
        return self.sandbox == SANDBOX_UNSANDBOXED


# What /bin/sh answers for a command it found but could not execute, and for one it did not find.
NOT_RUNNABLE_EXIT_CODES = (126, 127)


class TestRunResult(BaseModel):
    """Outcome of one test run. ``exit_code`` is ``None`` when the run timed out and was killed."""

    __test__ = False  # a result model, not a pytest test class

    passed: bool
    exit_code: int | None
    timed_out: bool
    duration_s: float
    output_tail: str
    log_path: Path

    @property
    def runnable(self) -> bool:
        """The test command ran (passing or failing): it did not time out and the shell could execute it."""
        return not self.timed_out and self.exit_code not in NOT_RUNNABLE_EXIT_CODES


class CleanupReport(BaseModel):
    run_id: str
    removed: list[OwnedResource] = Field(default_factory=list)
    remaining: list[OwnedResource] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.remaining


class EnvironmentError(Exception):
    """Base of environment failures. ``log_path``: the log of the commands that failed, when there is one; the
    caller keeps it as evidence (what the repository's commands printed goes no further than that log).
    ``failed``: the recipe command that failed, when one did (:func:`environments.diagnosis.diagnose` judges it
    with the log's tail)."""

    def __init__(self, *args: object, log_path: Path | None = None, failed: FailedCommand | None = None) -> None:
        super().__init__(*args)
        self.log_path = log_path
        self.failed = failed


class RunFencedError(EnvironmentError):
    """The run was cleaned up (tombstoned); a late attempt must not create anything."""


class ResourceConflictError(EnvironmentError):
    """A resource with this run's name exists but belongs to someone else."""


class NotReadyError(EnvironmentError):
    """The environment did not become ready before the probe's deadline."""


class FixtureError(NotReadyError):
    """A fixture (seed) command failed against the ready app: the environment is not in the state the
    reproduction expects. The app is stopped, so no later provision adopts a half-seeded environment."""


NO_APP_MESSAGE = (
    "durafix.yaml declares no `start`: this reproduction needs the app running (a browser procedure); "
    "add `start` (and `readiness`) or reproduce with a command or test"
)


class EnvironmentGoneError(EnvironmentError):
    """The environment a handle names no longer runs (its app stopped, its record or container is gone, or it now
    belongs to another operation): nothing was run in it. The caller provisions a new one."""


class NoAppError(EnvironmentError):
    """The recipe declares no ``start`` and what was asked needs the app running. Raised before anything is
    created (no workspace, process, container or record). ``failed`` names the ``start`` stage with an empty
    command: no command failed, none was declared (:func:`environments.diagnosis.diagnose` says so)."""

    def __init__(self, message: str = NO_APP_MESSAGE) -> None:
        super().__init__(message, failed=FailedCommand(Stage.START, ""))


def app_start(recipe: AppRecipe) -> str:
    """The recipe's ``start`` command; :class:`NoAppError` when it declares none."""
    if recipe.start is None:
        raise NoAppError()
    return recipe.start


@dataclass(frozen=True)
class ChecksRun:
    """One :meth:`EnvironmentProvider.run_checks` call as the provider carries it out: the call's arguments, with
    ``progress`` always a callback (one that ignores everything when the caller gave none)."""

    spec: RecoverySpec
    workspace: str
    run_id: str
    op_id: str
    log_path: Path
    setup_timeout_s: float
    test_timeout_s: float
    progress: Progress
    command: str | None
    setup: bool
    collect: tuple[str, ...] = ()


class EnvironmentProvider(ABC):
    """What every provider implements; the base of the local and the Docker provider."""

    name: str

    @abstractmethod
    def provision(
        self, *, run_id: str, op_id: str, spec: RecoverySpec, workspace: str, progress: Progress | None = None
    ) -> EnvironmentHandle:
        """Start (or adopt) the environment for ``op_id`` from ``workspace`` and wait for readiness.

        ``progress``, when given, hears each sub-state as it begins, at least: ``adopting <env id>`` for an
        environment already running, ``setup: <command>`` before each setup command it runs (a setup restored
        from a cache says so instead: ``setup: restoring <paths> from the dependency cache``), ``starting app:
        <command>`` (or the provider's equivalent, such as ``starting container <name>``), ``waiting for
        readiness at <url><path>``, and ``fixtures: <command>`` before each fixture command (commands on one
        line, cut to about 80 characters). It must not raise (see :data:`Progress`).

        A recipe without ``start`` has no app to provision: :class:`NoAppError`, before anything is created.
        """

    @abstractmethod
    def check(self, handle: EnvironmentHandle) -> EnvironmentStatus:
        """Re-probe the live environment; never answers from recorded state."""

    @abstractmethod
    def list_owned(self, run_id: str | None = None) -> list[OwnedResource]:
        """Resources this provider holds for ``run_id`` (all runs when ``None``)."""

    @abstractmethod
    def teardown(self, handle: EnvironmentHandle) -> CleanupReport:
        """Stop one environment; idempotent."""

    @abstractmethod
    def cleanup_run(self, run_id: str) -> CleanupReport:
        """Tombstone ``run_id`` then remove everything it owns; idempotent, never widens its target."""

    def run_checks(
        self,
        spec: RecoverySpec,
        workspace: str,
        *,
        run_id: str,
        op_id: str,
        log_path: Path,
        setup_timeout_s: float,
        test_timeout_s: float,
        progress: Progress | None = None,
        command: str | None = None,
        setup: bool = True,
        collect: tuple[str, ...] = (),
    ) -> TestRunResult:
        """Run the recipe's setup, then its tests, for ``workspace`` inside this provider's sandbox (the local
        provider: bubblewrap, no network for the tests; Docker: a container from the app image, network none,
        capabilities dropped, an unprivileged user); both logged to ``log_path``. What it creates is owned by
        ``run_id`` / ``op_id`` (so ``cleanup_run`` finds whatever a dead worker left) and is refused once the run
        is tombstoned.

        ``progress`` hears ``setup: <command>`` (or what restoring it from a cache says) and ``running tests:
        <command>``. Raises ``environments.checks.SetupError`` when setup fails (the message's first line says
        which command and how); nothing either step started survives the call.

        ``command`` runs instead of the recipe's ``test`` (the regression proof's subset). ``setup=False``: the
        workspace is set up already (a provider whose setup is part of what it builds from the workspace, as
        Docker's image, may still build).

        ``collect``: workspace paths (files or directories) the command writes and the caller reads afterwards, as
        a command or test reproduction's outputs: a provider whose command does not run in ``workspace`` itself
        (Docker: in a container from an image of it) copies their regular files back into ``workspace`` (no link
        followed on the way in; capped), so the caller reads them where they would be.
        """
        progress = progress or ignore
        return self._run_checks(
            ChecksRun(
                spec,
                workspace,
                run_id,
                op_id,
                log_path,
                setup_timeout_s,
                test_timeout_s,
                progress,
                command,
                setup,
                collect,
            )
        )

    @abstractmethod
    def run_in(
        self,
        handle: EnvironmentHandle,
        spec: RecoverySpec,
        workspace: str,
        command: str,
        *,
        log_path: Path,
        timeout_s: float,
        collect: tuple[str, ...] = (),
    ) -> TestRunResult:
        """Run ``command`` (a command reproduction's script, from an untrusted report) against the provisioned,
        ready environment ``handle``, which ``provision`` built from ``workspace`` (its setup done: none runs
        again), logged to ``log_path``.

        The command runs in this provider's sandbox, in the environment's own files (the local provider: the
        workspace the app runs from; Docker: a container of its own from the app's image), with ``PORT`` and
        ``$DURAFIX_APP_URL`` naming the app, and no network but the app's: it reaches the app and nothing else
        (the local provider enters the app's network namespace, as fixtures do; Docker shares the app container's).
        Its processes carry a marker (or labels) of the run, so the run's cleanup finds one a dead worker left; it
        is killed after ``timeout_s`` and nothing of it outlives the call. ``collect``: workspace paths it writes
        that the caller reads afterwards, copied back into ``workspace`` by a provider whose command does not run
        there (see :meth:`run_checks`).

        Raises :class:`EnvironmentGoneError` when the environment no longer runs (nothing was run), and
        ``RunFencedError`` once the run is tombstoned.
        """

    @abstractmethod
    def _run_checks(self, run: ChecksRun) -> TestRunResult:
        """:meth:`run_checks` as this provider carries it out."""
