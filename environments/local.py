"""The local-process provider: the application runs as processes on the worker, each command of the recipe in
a bubblewrap sandbox (:mod:`environments.sandbox`).

Per run, under ``state_dir/<run-key>/``: one JSON ownership record per operation (pid, process group, start
time, port, workspace), the operation's log, lock files and, once cleaned up, the run's tombstone.

Contracts (see :mod:`environments.interface`):

- ``provision`` refuses a recipe without ``start`` (``NoAppError``) and a tombstoned run before starting
  anything, runs the recipe's setup commands (or restores their result from the dependency cache, see
  :func:`environments.checks.run_setup`), starts the start command with a free port in ``$PORT``, and writes
  the ownership record *before* waiting for readiness, so a crash while waiting leaves a process that cleanup
  can find. Every process also carries the run/operation marker in its environment (see
  :mod:`environments.processes`), which covers the instant between spawning and recording and any process
  that leaves its group.
- Fixtures (the recipe's seed commands) run once per started app, after it is ready, in the workspace with
  ``$PORT`` and ``$DURAFIX_APP_URL``; only then is the record marked seeded. An app whose fixtures did not
  all succeed (one failed, or the worker died meanwhile) is never adopted: a failure stops it, and a record
  without the mark is replaced by a fresh app, seeded anew.
- Idempotent per ``op_id``: a recorded process that is still the same process (pid + start time), runs
  from the same workspace directory (path + inode) and answers the probe is adopted; anything else
  recorded for the operation is stopped and replaced.
- ``check`` re-probes the live process; ``teardown`` and ``cleanup_run`` stop a process group with SIGTERM,
  then SIGKILL after a grace period, verify nothing is left, and only then drop the record.
- ``cleanup_run`` writes the tombstone first, then waits for in-flight provisions of the run (they hold
  the run lock shared), then stops everything recorded or marked for that run and nothing else.

Sandboxing (see :mod:`environments.sandbox` and ``docs/security.md``): setup, the app, its fixtures and the tests
each run in a sandbox where only the workspace (and, for setup, the package caches) is writable and the state
directory, the Docker socket and home directories do not exist. Tests have no network; setup only when the
recipe says ``setup_network: true``, and then only the package registries, through an egress proxy started for
that setup (:mod:`environments.egress`; its tunnels are ``# egress:`` lines in the setup's log). The app runs
in a network namespace of its own, reached only through the forwarder (:mod:`environments.app_forwarder`) that
listens on the worker's loopback: the recorded process is the forwarder, its group holds the sandbox. Fixtures,
and a command reproduction that needs the app (:meth:`LocalProcessProvider.run_in`), run in a sandbox of their own
that enters the app's network namespace, so they reach the app and nothing else.
Without a working bubblewrap the provider refuses to be built unless the operator passed an ``unsandboxed``
:class:`~environments.sandbox.Sandbox`; its handles then say ``sandbox: unsandboxed``.

Secrets are resolved from the worker's environment when a command starts, only as far as the operator's
``allowed_secrets`` names them (:mod:`environments.secrets`), and are never recorded.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from environments import app_forwarder
from environments.checks import SetupOutcome, SetupSettings, result_of_tests, run_setup, run_tests
from environments.commands import command_env, exit_text, log_note, run_to_completion, spawn, tail
from environments.diagnosis import FailedCommand, Stage
from environments.files import locked, path_key, read_json, write_json_atomic
from environments.interface import (
    APP_URL_VAR,
    AppRecipe,
    ChecksRun,
    CleanupReport,
    EnvironmentError,
    EnvironmentGoneError,
    EnvironmentHandle,
    EnvironmentProvider,
    EnvironmentStatus,
    FixtureError,
    NotReadyError,
    OwnedResource,
    Progress,
    ReadinessProbe,
    RecoverySpec,
    ResourceConflictError,
    ResourceKind,
    TestRunResult,
    app_start,
)
from environments.ports import free_port
from environments.processes import StopOutcome, is_running, live_processes, stop_owned
from environments.progress import command_text, ignore
from environments.readiness import probe_once, verdict, wait_ready
from environments.run_dirs import RunDirs
from environments.sandbox import Network, Sandbox
from environments.secrets import check_allowlist

PROVIDER_NAME = "local"


class LocalProcessProvider(EnvironmentProvider):
    """Runs environments as local process groups; state and logs under ``state_dir``.

    ``setup``: how setup commands run on this worker (dependency cache, package caches, passed-through
    variables); by default none of it. An app started from a workspace whose setup was restored from the cache
    is checked like any other: it must answer its readiness probe, or the provision fails. ``sandbox``: where
    the recipe's commands run; by default :meth:`Sandbox.detect` (bubblewrap, or
    :class:`~environments.sandbox.SandboxUnavailableError`). ``allowed_secrets``: the worker variables a
    recipe's ``secrets`` may name.
    """

    name = PROVIDER_NAME

    def __init__(
        self,
        state_dir: Path,
        *,
        setup_timeout_s: float = 600.0,
        stop_grace_s: float = 5.0,
        setup: SetupSettings | None = None,
        sandbox: Sandbox | None = None,
        allowed_secrets: Sequence[str] = (),
    ) -> None:
        self.state_dir = state_dir.absolute()
        self.runs = RunDirs(self.state_dir)
        self.setup_timeout_s = setup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.setup = setup or SetupSettings()
        self.sandbox = sandbox if sandbox is not None else Sandbox.detect()
        self.allowed_secrets = check_allowlist(allowed_secrets)

    def provision(
        self, *, run_id: str, op_id: str, spec: RecoverySpec, workspace: str, progress: Progress | None = None
    ) -> EnvironmentHandle:
        """Adopt the live environment recorded for ``op_id``, or start a new one and wait for readiness.

        ``progress`` hears ``adopting <env id>``, or (after ``stopping earlier <env id>`` when a stale record
        is replaced) ``setup: <command>`` per setup command (or ``setup: restoring <paths> from the dependency
        cache``, see :func:`~environments.checks.run_setup`; ``setup: egress reached|refused <host:port>, ...``
        after a command of a setup with the network), ``starting app: <command>``, ``waiting for
        readiness at <url><path>`` and ``fixtures: <command>`` per fixture, in that order.

        Raises ``NoAppError`` (the recipe declares no ``start``; before anything is created or recorded),
        ``RunFencedError`` (run cleaned up), :class:`SetupError`, ``NotReadyError`` or ``FixtureError`` (the process
        is stopped and its record dropped), or ``SecretUnavailableError`` (before anything starts).
        """
        app_start(spec.recipe)  # no app to start: refused before the run's directory, a record or a process exists
        progress = progress or ignore
        ws = Path(workspace).absolute()
        if not ws.is_dir():
            raise EnvironmentError(f"workspace {ws} does not exist")
        key = path_key(op_id)
        with self.runs.creating(run_id, op_id) as run_dir, locked(run_dir / f"{key}.lock"):
            record = read_json(run_dir / f"{key}.json")
            if record is not None:
                if (record["run_id"], record["op_id"]) != (run_id, op_id):
                    raise ResourceConflictError(
                        f"process record for {op_id} belongs to {record['run_id']} / {record['op_id']}"
                    )
                if _adoptable(record, ws, spec):
                    handle = _handle(record)
                    progress(f"adopting {handle.env_id}")
                    return handle
                progress(f"stopping earlier {_handle(record).env_id}")
                survivors = self._stop(record).survivors
                if survivors:
                    raise EnvironmentError(f"earlier processes {sorted(survivors)} of {op_id} survived SIGKILL")
                (run_dir / f"{key}.json").unlink()
            return self._start(run_dir, key, run_id=run_id, op_id=op_id, spec=spec, ws=ws, progress=progress)

    def check(self, handle: EnvironmentHandle) -> EnvironmentStatus:
        """READY if the handle's process is alive and answers the probe now; GONE if it no longer exists."""
        record = read_json(self.runs.run_dir(handle.run_id) / f"{path_key(handle.op_id)}.json")
        if record is None or _url(record) != handle.base_url or not _alive(record):
            return EnvironmentStatus.GONE
        if probe_once(handle.base_url, _probe(record)):
            return EnvironmentStatus.READY
        return EnvironmentStatus.NOT_READY

    def list_owned(self, run_id: str | None = None) -> list[OwnedResource]:
        """Recorded processes for ``run_id`` (all runs when ``None``); ``detail['state']`` is live or dead."""
        return [_resource(record) for _, record in self.runs.records(run_id)]

    def teardown(self, handle: EnvironmentHandle) -> CleanupReport:
        """Stop the operation's processes and drop its record (the log stays); idempotent."""
        run_dir = self.runs.run_dir(handle.run_id)
        key = path_key(handle.op_id)
        report = CleanupReport(run_id=handle.run_id)
        with locked(run_dir / "run.lock", shared=True), locked(run_dir / f"{key}.lock"):
            record = read_json(run_dir / f"{key}.json")
            if record is not None:
                self._stop_into(report, run_dir, key, record)
            # Processes marked for the operation but unrecorded (a crash between spawn and record).
            _report_unrecorded(report, stop_owned(_marker(run_dir, key), grace_s=self.stop_grace_s), handle.op_id)
        return report

    def cleanup_run(self, run_id: str) -> CleanupReport:
        """Tombstone ``run_id``, then stop and forget everything it owns; idempotent, other runs untouched."""
        report = CleanupReport(run_id=run_id)
        with self.runs.cleaning(run_id) as run_dir:
            for key, record in self.runs.records(run_id):
                self._stop_into(report, run_dir, key, record)
            # Processes marked for this run but never recorded (a crash between spawn and record).
            swept = stop_owned(f"{run_dir.name}/", prefix=True, grace_s=self.stop_grace_s)
            _report_unrecorded(report, swept, "(unrecorded)")
            for leftover in [*run_dir.glob("*.log"), *run_dir.glob("*.lock")]:
                if leftover.name != "run.lock" and not leftover.with_suffix(".json").exists():
                    leftover.unlink()
        return report

    def _run_checks(self, run: ChecksRun) -> TestRunResult:
        """The recipe's setup (restored from the dependency cache when it can be) and then its tests in
        ``run.workspace``, each command in this provider's sandbox: tests with no network, writing the workspace
        only; nothing they start outlives them. Raises :class:`~environments.checks.SetupError`."""
        ws = Path(run.workspace).absolute()
        # Its own marker per call: nothing of a check is a run's recorded resource, since nothing of it outlives
        # the call (the sandbox's PID namespace ends with each command, and a call given up on stops its
        # command). The marker is under the run's key all the same, so the run's cleanup sweep and anyone
        # listing the run's processes see a check that is still running.
        checks = f"{self.runs.run_dir(run.run_id).name}/checks-{uuid.uuid4().hex}"
        if run.setup:
            self._setup(ws, run.spec, f"{checks}/setup", run.log_path, run.setup_timeout_s, run.progress)
        run.progress(f"running tests: {command_text(run.command or run.spec.recipe.test)}")
        return run_tests(
            ws,
            run.spec.recipe,
            run.test_timeout_s,
            log_path=run.log_path,
            command=run.command,
            sandbox=self.sandbox,
            allowed_secrets=self.allowed_secrets,
            marker=f"{checks}/tests",
        )

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
        """``command`` in the environment's own workspace, in a sandbox that enters the app's network namespace as
        the fixtures' does (:meth:`_seed`): the app, on ``$PORT`` at ``$DURAFIX_APP_URL``, and nothing else is
        reachable; the workspace is the one writable place. Its processes carry a marker under the run's key
        (the run's cleanup sweep finds one a dead worker left); at ``timeout_s`` they are stopped, and the sandbox's
        PID namespace ends with the command. ``collect`` is ignored: the command runs in ``workspace`` itself.
        Raises :class:`EnvironmentGoneError` when the recorded app no longer runs, or runs from another workspace."""
        ws = Path(workspace).absolute()
        key = path_key(handle.op_id)
        with self.runs.creating(handle.run_id, handle.op_id, doing="run a reproduction in") as run_dir:
            record = read_json(run_dir / f"{key}.json")
            if (
                record is None
                or (record["run_id"], record["op_id"]) != (handle.run_id, handle.op_id)
                or _url(record) != handle.base_url
                or not _alive(record)
            ):
                raise EnvironmentGoneError(f"{handle.env_id} no longer runs")
            if record["workspace"] != str(ws) or not ws.is_dir() or record["workspace_inode"] != ws.stat().st_ino:
                raise EnvironmentGoneError(f"{handle.env_id} runs from {record['workspace']}, not from {ws}")
            # A marker of its own under the run's key: the run's sweep finds it, and stopping it never touches the app.
            marker = f"{_marker(run_dir, key)}-run-{uuid.uuid4().hex}"
            run = self._beside_app(spec.recipe, record, marker, ws, log_path)
            if run is None:
                raise EnvironmentGoneError(f"the app's sandbox of {handle.env_id} has ended")
            try:
                code, duration = run(command, timeout_s)
            finally:
                # Unsandboxed, a command's children may leave its group; the marker still finds them.
                stop_owned(marker, grace_s=self.stop_grace_s)
        return result_of_tests(code, duration, log_path)

    def run_setup(
        self,
        spec: RecoverySpec,
        workspace: str,
        *,
        run_id: str,
        log_path: Path,
        timeout_s: float | None = None,
        progress: Progress | None = None,
    ) -> SetupOutcome:
        """The recipe's setup alone in ``workspace``, exactly as :meth:`provision` and :meth:`run_checks` run it
        (sandbox, dependency cache, secrets allowlist), logged to ``log_path``; for a caller that sets a workspace
        up once and then runs its tests or a reproduction with ``setup=False`` (``durafix check``). Its processes
        carry a marker under ``run_id``'s key, so the run's cleanup sweep finds one still running; nothing of it
        outlives the call. ``timeout_s``: per command, default the provider's. Raises
        :class:`~environments.checks.SetupError`."""
        marker = f"{self.runs.run_dir(run_id).name}/setup-{uuid.uuid4().hex}"
        return self._setup(
            Path(workspace).absolute(),
            spec,
            marker,
            log_path,
            self.setup_timeout_s if timeout_s is None else timeout_s,
            progress or ignore,
        )

    def _setup(
        self, ws: Path, spec: RecoverySpec, marker: str, log_path: Path, timeout_s: float, progress: Progress
    ) -> SetupOutcome:
        """The recipe's setup in ``ws`` as every caller of this provider runs it: in its sandbox, with its dependency
        cache and secrets allowlist, its processes marked ``marker`` (see :func:`environments.checks.run_setup`)."""
        return run_setup(
            ws,
            spec.recipe,
            marker=marker,
            log_path=log_path,
            timeout_s=timeout_s,
            progress=progress,
            stop_grace_s=self.stop_grace_s,
            settings=self.setup,
            repository=spec.repository,
            base_lock_hash=spec.dependency_lock_hash,
            base_revision=spec.base_revision,
            provider=PROVIDER_NAME,
            sandbox=self.sandbox,
            allowed_secrets=self.allowed_secrets,
        )

    def _start(
        self, run_dir: Path, key: str, *, run_id: str, op_id: str, spec: RecoverySpec, ws: Path, progress: Progress
    ) -> EnvironmentHandle:
        recipe = spec.recipe
        start = app_start(recipe)
        marker = _marker(run_dir, key)
        log_path = run_dir / f"{key}.log"
        self._setup(ws, spec, marker, log_path, self.setup_timeout_s, progress)
        # The port is released before the application binds it; a race with another binder shows up as a
        # readiness failure, never as a wrong environment (the probe goes to the recorded port).
        port = free_port()
        progress(f"starting app: {command_text(start)}")
        env = command_env(recipe, marker=marker, extra={"PORT": str(port)}, allowed_secrets=self.allowed_secrets)
        if self.sandbox.sandboxed:
            # The app gets a network namespace of its own; the forwarder on the worker's loopback is its one door.
            forwarder = [sys.executable, "-I", app_forwarder.__file__, str(port), str(port), "--"]
            proc, started_at = spawn(
                start, cwd=ws, env=env, log_path=log_path, sandbox=self.sandbox, launcher=forwarder
            )
        else:
            proc, started_at = spawn(start, cwd=ws, env=env, log_path=log_path)
        record: dict[str, Any] = {
            "run_id": run_id,
            "op_id": op_id,
            "pid": proc.pid,
            "pgid": proc.pid,
            "start_time": started_at,
            "port": port,
            "marker": marker,
            "workspace": str(ws),
            "workspace_inode": ws.stat().st_ino,
            "log": str(log_path),
            "probe": recipe.readiness.model_dump(mode="json"),
            "sandbox": self.sandbox.kind,
        }
        write_json_atomic(run_dir / f"{key}.json", record)
        progress(f"waiting for readiness at {_url(record)}{recipe.readiness.path}")
        if not wait_ready(_url(record), recipe.readiness, still_running=lambda: _alive(record)):
            running = _alive(record)
            log_note(log_path, verdict(_url(record), recipe.readiness) if running else "readiness: the app exited")
            self._abandon(run_dir, key, record)
            raise NotReadyError(
                f"{start!r} did not answer GET {recipe.readiness.path} with "
                f"{recipe.readiness.expected_status} within {recipe.readiness.deadline_s}s:\n{tail(log_path)}",
                log_path=log_path,
                failed=FailedCommand(Stage.START, start),
            )
        self._seed(run_dir, key, record, recipe, ws, log_path, progress)
        return _handle(record)

    def _seed(
        self,
        run_dir: Path,
        key: str,
        record: dict[str, Any],
        recipe: AppRecipe,
        ws: Path,
        log_path: Path,
        progress: Progress,
    ) -> None:
        """Run the recipe's fixtures against the ready app, then mark the record seeded (see the contract)."""
        if not recipe.fixtures:
            return
        run = self._beside_app(recipe, record, record["marker"], ws, log_path)
        if run is None:
            self._abandon(run_dir, key, record)
            raise FixtureError(f"the app's sandbox for {record['op_id']} ended before its fixtures ran")
        for command in recipe.fixtures:
            progress(f"fixtures: {command_text(command)}")
            code, _ = run(command, self.setup_timeout_s)
            if code != 0:
                self._abandon(run_dir, key, record)
                raise FixtureError(
                    f"fixture command {command!r} {exit_text(code)}:\n{tail(log_path)}",
                    log_path=log_path,
                    failed=FailedCommand(Stage.FIXTURES, command, code),
                )
        record["seeded"] = True
        write_json_atomic(run_dir / f"{key}.json", record)

    def _beside_app(
        self, recipe: AppRecipe, record: dict[str, Any], marker: str, ws: Path, log_path: Path
    ) -> Callable[[str, float], tuple[int | None, float]] | None:
        """A runner of ``recipe``'s commands beside the app of ``record`` (its fixtures, a reproduction's
        commands): each runs to its end or its timeout in ``ws``, logged to ``log_path``, carrying ``marker``,
        with ``$PORT`` and ``$DURAFIX_APP_URL`` set; sandboxed, it enters the app's own network namespace, where
        the app listens on the same port: the app and nothing else is reachable from there. Returns (exit code,
        or None at the timeout; seconds). None when the app's sandbox has ended."""
        env = command_env(
            recipe,
            marker=marker,
            extra={"PORT": str(record["port"]), APP_URL_VAR: _url(record)},
            allowed_secrets=self.allowed_secrets,
        )
        launcher: list[str] = []
        if self.sandbox.sandboxed:
            netns = _app_netns(int(record["pid"]))
            if netns is None:
                return None
            launcher = ["nsenter", f"--net={netns}", "--"]

        def run(command: str, timeout_s: float) -> tuple[int | None, float]:
            return run_to_completion(
                command,
                cwd=ws,
                env=env,
                log_path=log_path,
                timeout_s=timeout_s,
                sandbox=self.sandbox,
                network=Network.HOST,
                launcher=launcher,
            )

        return run

    def _stop(self, record: dict[str, Any]) -> StopOutcome:
        return stop_owned(
            record["marker"], pgid=record["pgid"], leader_start=record["start_time"], grace_s=self.stop_grace_s
        )

    def _abandon(self, run_dir: Path, key: str, record: dict[str, Any]) -> None:
        """Stop an app that failed to come up; drop its record unless something of it survived."""
        if not self._stop(record).survivors:
            (run_dir / f"{key}.json").unlink()

    def _stop_into(self, report: CleanupReport, run_dir: Path, key: str, record: dict[str, Any]) -> None:
        """Stop one recorded environment; drop its record only when nothing of it is left."""
        resource = _resource(record)
        survivors = self._stop(record).survivors
        if survivors:
            report.remaining.append(resource)
            report.errors.append(f"{record['op_id']}: processes {sorted(survivors)} survived SIGKILL")
        else:
            (run_dir / f"{key}.json").unlink(missing_ok=True)
            report.removed.append(resource)


def _app_netns(forwarder_pid: int) -> str | None:
    """``/proc/<pid>/ns/net`` of the app's sandbox while it runs: the namespace of the child of the forwarder's
    bwrap (bwrap's outer process stays in the worker's namespaces, its child is the sandbox's init)."""
    own = os.readlink("/proc/self/ns/net")
    processes = live_processes()
    for bwrap in (p for p in processes if p.ppid == forwarder_pid):
        for init in (p for p in processes if p.ppid == bwrap.pid):
            path = f"/proc/{init.pid}/ns/net"
            try:
                if os.readlink(path) != own:
                    return path
            except OSError:
                continue
    return None


def _adoptable(record: dict[str, Any], ws: Path, spec: RecoverySpec) -> bool:
    return (
        (record.get("seeded", False) or not spec.recipe.fixtures)
        and _alive(record)
        and record["workspace"] == str(ws)
        and record["workspace_inode"] == ws.stat().st_ino
        and probe_once(_url(record), spec.recipe.readiness)
    )


def _alive(record: dict[str, Any]) -> bool:
    return is_running(int(record["pid"]), int(record["start_time"]))


def _url(record: dict[str, Any]) -> str:
    return f"http://127.0.0.1:{record['port']}"


def _probe(record: dict[str, Any]) -> ReadinessProbe:
    return ReadinessProbe.model_validate(record["probe"])


def _marker(run_dir: Path, key: str) -> str:
    return f"{run_dir.name}/{key}"


def _resource(record: dict[str, Any]) -> OwnedResource:
    return OwnedResource(
        kind=ResourceKind.PROCESS,
        provider=PROVIDER_NAME,
        resource_id=f"pid:{record['pid']}@{record['start_time']}",
        run_id=record["run_id"],
        op_id=record["op_id"],
        detail={
            "pid": str(record["pid"]),
            "pgid": str(record["pgid"]),
            "port": str(record["port"]),
            "log": record["log"],
            "state": "live" if _alive(record) else "dead",
        },
    )


def _handle(record: dict[str, Any]) -> EnvironmentHandle:
    return EnvironmentHandle(
        env_id=f"{PROVIDER_NAME}:{record['marker']}",
        provider=PROVIDER_NAME,
        run_id=record["run_id"],
        op_id=record["op_id"],
        base_url=_url(record),
        resources=[_resource(record)],
        sandbox=record.get("sandbox", ""),
    )


def _report_unrecorded(report: CleanupReport, outcome: StopOutcome, op_id: str) -> None:
    """Add marked-but-unrecorded processes to ``report`` as removed or remaining."""

    def resource(pid: int) -> OwnedResource:
        return OwnedResource(
            kind=ResourceKind.PROCESS,
            provider=PROVIDER_NAME,
            resource_id=f"pid:{pid}",
            run_id=report.run_id,
            op_id=op_id,
            detail={"pid": str(pid), "recorded": "no"},
        )

    report.removed.extend(resource(pid) for pid in sorted(outcome.stopped))
    report.remaining.extend(resource(pid) for pid in sorted(outcome.survivors))
    report.errors.extend(f"process {pid} survived SIGKILL" for pid in sorted(outcome.survivors))
