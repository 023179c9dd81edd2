"""The Docker environment provider: one container per operation, one network per run, owned by labels.

Ownership. Every container, network and volume the provider creates carries ``durafix.managed=1``,
``durafix.run=<run_id>`` and ``durafix.op=<op_id>``; :func:`~environments.docker.naming.container_name`
derives the container's name from the op_id. Listing and cleanup select by label and re-check the labels of
whatever the engine returns, so a cleanup never widens beyond its run.

Idempotency and reconciliation. ``provision`` looks the op's container up by name before building
anything: one carrying this run's and op's labels is adopted (started if it is stopped or was only
created; an op_id names one set of inputs, so an adopted container is not rebuilt); one carrying other labels
is a :class:`ResourceConflictError`. When another worker creates the same name between lookup and create,
the engine's name conflict sends us back to adoption. A worker killed anywhere in between leaves at most one
named container, which the next attempt adopts.

Fencing. The tombstone check (:class:`~environments.run_dirs.RunDirs`) spans the whole
check-then-create step, so once ``cleanup_run`` has started no late attempt creates anything for the run.

Readiness is always re-probed over HTTP against the container's live address; the probe settings travel as
labels on the container itself, so ``check`` needs nothing from recorded state.

Networking, and what it isolates. The engine runs with ``--bridge=none --iptables=false`` so that the host
firewall is never changed; published ports are therefore unavailable. Each run gets its own *internal*
bridge network, and the app listens on its recipe port on the container's own address, which the host
reaches directly (``base_url = http://<container-ip>:<port>``; the worker must run on the engine's host).
What this does *not* give, because Docker enforces internal-network isolation with the iptables rules that
are switched off here: the container keeps a default route via the bridge's host address, so it can reach
services listening on the host's addresses, and the host forwards its packets onward without NAT. Outside
peers see an unroutable private source address and cannot answer, which in practice blocks outbound
connections to other networks, but it is not a firewall: hosts that route the bridge's private range back
(another run's bridge on the same host included) are reachable. Runs that need hard network isolation need
an engine with iptables enabled or a host firewall.

Fixtures (the recipe's seed commands) run inside the container once it answers its probe, as the app's
user in the app directory with ``$PORT`` and ``$DURAFIX_APP_URL``, each under ``timeout``. Marks on the
container's ``/tmp`` (a tmpfs: they vanish with the app's process) say seeding began and ended: an adopted
container already seeded is used as it is, one whose seeding began but never ended (a worker died
half-way) is removed and replaced by a fresh container, and a failing fixture removes the container before
``FixtureError`` is raised, so no half-seeded app is ever handed out.

Hardening applied to every container: memory (swap included), pids and CPU limits from the recipe, all
capabilities dropped, ``no-new-privileges``, an unprivileged user (``65534:65534``), a read-only root
filesystem with a ``tmpfs`` on ``/tmp`` (``HOME`` points there), a minimal init as PID 1, bounded logs.

Checks (:meth:`DockerProvider.run_checks`, the verification's and the baseline's setup and tests): setup is the
app image's build (its steps as the app's user with no capabilities, see :mod:`environments.docker.images`; a
setup with the network in setup containers whose one way out is the egress proxy, each command's output and the
proxy's ``# egress:`` lines in the checks' log), and the tests run in a container of their own from that image,
with the same hardening, ``network_mode=none`` (no interface but loopback: not the app's network, not the host)
and the run's labels, named from the op ``<op_id>:checks``: one a dead worker left is adopted by the op's next
attempt (as a provisioning's container is) when its image and command are the same, else replaced, and
``cleanup_run`` finds one no attempt came back for. Its root filesystem is writable (tests
write caches into ``/app``) but dies with it; when the test command ends the container stops and every process in
it is killed. Nothing of the worker is mounted: no state directory, no Docker socket, no home.

Commands against the app (:meth:`DockerProvider.run_in`, a command reproduction with ``app: true``) run the same
way in a container of their own from the app container's image, but in the app container's network namespace
(``network_mode=container:<app>``): the app answers on its loopback, and the command has no other network than
the app's.
"""

from __future__ import annotations

import io
import re
import tarfile
import time
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import docker
from docker.errors import APIError, NotFound
from requests.exceptions import RequestException

from environments.ca_bundle import SYSTEM_BUNDLE
from environments.checks import SetupError, result_of_tests
from environments.commands import log_note
from environments.docker.hardening import hardened
from environments.docker.images import APP_DIR, ImageBuilder, SetupStepError
from environments.docker.naming import (
    MANAGED_LABEL,
    OP_LABEL,
    RUN_LABEL,
    container_name,
    network_name,
    owned_by,
    ownership_labels,
    run_filter,
)
from environments.egress import ALLOWED_PORTS, DEFAULT_REGISTRY_HOSTS
from environments.files import locked, path_key
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
    RunFencedError,
    TestRunResult,
    app_start,
)
from environments.progress import command_text, ignore
from environments.readiness import probe_once, wait_ready
from environments.run_dirs import RunDirs
from environments.untrusted_files import UntrustedFileError, unlink_beneath, write_beneath

PROVIDER_NAME = "docker"
APP_USER = "65534:65534"
PORT_LABEL = "durafix.port"
PROBE_PATH_LABEL = "durafix.probe.path"
PROBE_STATUS_LABEL = "durafix.probe.status"
_LOG_TAIL = 30
_TMP_MOUNT = "rw,nosuid,nodev,size=64m"
# Seeding marks live on the tmpfs, so they die with the app's process.
_SEEDING = "/tmp/.durafix-seeding"
_SEEDED = "/tmp/.durafix-seeded"


class UnsupportedRecipeError(EnvironmentError):
    """The recipe asks for something this provider does not do (permanent for these inputs)."""


class DockerProvider(EnvironmentProvider):
    """:class:`~environments.interface.EnvironmentProvider` over the engine at ``docker_host``.

    ``state_dir`` holds the run tombstones (``runs/``) and, unless ``image_cache_dir`` names another place,
    the image cache (``cache/``). ``egress_hosts`` / ``egress_ports``: what a setup with ``setup_network: true``
    may reach through its egress proxy (default: the package registries on 443; see
    :mod:`environments.docker.setup_containers`). ``ca_bundle``: the CA certificates images with
    ``ca-certificates`` trust besides Debian's (:mod:`environments.docker.trust`; ``None``: Debian's only).
    ``passthrough``: glob patterns of the worker variables setup containers get (``DURAFIX_SETUP_PASSTHROUGH``;
    :func:`environments.docker.setup_containers.container_passthrough`).
    """

    name = PROVIDER_NAME

    def __init__(
        self,
        state_dir: Path,
        docker_host: str,
        *,
        image_cache_dir: Path | None = None,
        mirror: str | None = None,
        stop_timeout_s: float = 10.0,
        read_only_rootfs: bool = True,
        fixture_timeout_s: float = 600.0,
        egress_hosts: tuple[str, ...] = DEFAULT_REGISTRY_HOSTS,
        egress_ports: tuple[int, ...] = ALLOWED_PORTS,
        ca_bundle: Path | None = Path(SYSTEM_BUNDLE),
        passthrough: tuple[str, ...] = (),
    ) -> None:
        self.state_dir = state_dir.absolute()
        self.client = docker.DockerClient(base_url=docker_host, timeout=300)
        self.images = ImageBuilder(
            self.client,
            image_cache_dir or self.state_dir / "cache",
            mirror=mirror,
            egress_hosts=egress_hosts,
            egress_ports=egress_ports,
            ca_bundle=ca_bundle,
            passthrough=passthrough,
        )
        self.fence = RunDirs(self.state_dir / "runs")
        self.stop_timeout_s = stop_timeout_s
        self.read_only_rootfs = read_only_rootfs
        self.fixture_timeout_s = fixture_timeout_s

    def close(self) -> None:
        self.client.close()

    def provision(
        self, *, run_id: str, op_id: str, spec: RecoverySpec, workspace: str, progress: Progress | None = None
    ) -> EnvironmentHandle:
        """Create or adopt the op's container, start it if needed, and wait until its probe answers.

        ``progress`` hears ``adopting <name>`` for an existing container, or what building the images reports
        (``building base image ...``, ``importing base image <tag>``, ``building image <tag>``, ``setup:
        <command>`` per setup step; nothing for cached images); then ``starting container <name>`` unless it
        runs already, ``waiting for readiness at <url><path>`` and ``fixtures: <command>`` per fixture.

        Raises ``NoAppError`` (the recipe declares no ``start``; before any image, network or container exists),
        ``RunFencedError`` (run cleaned up), ``ResourceConflictError`` (name held by someone else),
        ``NotReadyError`` (exited or not ready by the probe deadline; the container is kept for adoption or
        cleanup), ``UnsupportedRecipeError``, or ``ImageBuildError``.
        """
        progress = progress or ignore
        recipe = spec.recipe
        app_start(recipe)  # no app to start: refused before an image is built or anything is created
        if recipe.secrets:
            raise UnsupportedRecipeError(
                "the docker provider does not inject secrets: Docker would keep their values in the container's "
                "stored configuration"
            )
        if not Path(workspace).is_dir():
            raise EnvironmentError(f"workspace {workspace} does not exist")
        name = container_name(op_id)
        for _ in range(2):
            with self.fence.creating(run_id, op_id) as run_dir, locked(run_dir / f"{path_key(op_id)}.lock"):
                container = self._adopt(name, run_id, op_id)
                if container is None:
                    build_log = run_dir / f"{path_key(op_id)}.image.log"
                    image = self._app_image(recipe, Path(workspace), progress, build_log)
                    network = self._ensure_network(run_dir, run_id, op_id)
                    container = self._create(name, image, network, run_id, op_id, recipe)
                else:
                    progress(f"adopting {name}")
                if container.status != "running":
                    progress(f"starting container {name}")
                    container.start()
            base_url = self._wait_ready(container, run_id, op_id, recipe.readiness, progress)
            if self._seed(container, run_id, recipe, progress):
                break
        else:
            raise NotReadyError(f"{name} was left half-seeded twice in a row")
        return EnvironmentHandle(
            env_id=name,
            provider=PROVIDER_NAME,
            run_id=run_id,
            op_id=op_id,
            base_url=base_url,
            resources=[_container_resource(container), self._network_resource(run_id, op_id)],
            sandbox="container",
        )

    def check(self, handle: EnvironmentHandle) -> EnvironmentStatus:
        """GONE when the op's container no longer exists (or the name now holds another's); else probe it."""
        try:
            container = self.client.containers.get(handle.env_id)
        except NotFound:
            return EnvironmentStatus.GONE
        if not owned_by(container.labels, handle.run_id, handle.op_id):
            return EnvironmentStatus.GONE
        base_url = _base_url(container)
        if container.status != "running" or base_url is None:
            return EnvironmentStatus.NOT_READY
        ready = probe_once(base_url, _probe_from_labels(container.labels))
        return EnvironmentStatus.READY if ready else EnvironmentStatus.NOT_READY

    def list_owned(self, run_id: str | None = None) -> list[OwnedResource]:
        """Containers, networks and volumes labelled as managed (for ``run_id`` only, when given)."""
        owned: list[OwnedResource] = []
        filters = run_filter(run_id)
        for container in self.client.containers.list(all=True, filters=filters, ignore_removed=True):
            if _is_managed(container.labels, run_id):
                owned.append(_container_resource(container))
        for network in self.client.networks.list(filters=filters):
            if _is_managed(network.attrs.get("Labels"), run_id):
                owned.append(_labelled_resource(ResourceKind.NETWORK, network.name, network.id, network.attrs))
        for volume in self.client.volumes.list(filters=filters):
            if _is_managed(volume.attrs.get("Labels"), run_id):
                owned.append(_labelled_resource(ResourceKind.VOLUME, volume.name, volume.id, volume.attrs))
        return owned

    def teardown(self, handle: EnvironmentHandle) -> CleanupReport:
        """Stop and remove the op's container (never another's); the run's network stays for ``cleanup_run``."""
        report = CleanupReport(run_id=handle.run_id)
        try:
            container = self.client.containers.get(handle.env_id)
        except NotFound:
            return report
        if owned_by(container.labels, handle.run_id, handle.op_id):
            self._remove_container(container, report)
        return report

    def cleanup_run(self, run_id: str) -> CleanupReport:
        """Tombstone ``run_id``, then remove its containers, networks and volumes; idempotent.

        A container is stopped (SIGTERM, SIGKILL after ``stop_timeout_s``) and force-removed; one the engine
        cannot stop or remove stays in ``remaining`` with the engine's error, as does a network still in use
        by it. Calling again after the cause is gone finishes the job.
        """
        report = CleanupReport(run_id=run_id)
        filters = run_filter(run_id)
        with self.fence.cleaning(run_id):
            for container in self.client.containers.list(all=True, filters=filters, ignore_removed=True):
                if owned_by(container.labels, run_id):
                    self._remove_container(container, report)
            for network in self.client.networks.list(filters=filters):
                if owned_by(network.attrs.get("Labels"), run_id):
                    resource = _labelled_resource(ResourceKind.NETWORK, network.name, network.id, network.attrs)
                    _remove(network.remove, resource, report)
            for volume in self.client.volumes.list(filters=filters):
                if owned_by(volume.attrs.get("Labels"), run_id):
                    resource = _labelled_resource(ResourceKind.VOLUME, volume.name, volume.id, volume.attrs)
                    _remove(volume.remove, resource, report)
        return report

    def _run_checks(self, run: ChecksRun) -> TestRunResult:
        """The app image for the workspace (its build is setup, so ``setup=False`` still builds: the image holds the
        workspace as it is now: a failing setup step is a :class:`~environments.checks.SetupError`), then the tests
        in a container of their own from it (see the module's contract), logged to ``log_path``. ``setup_timeout_s``
        bounds each setup container of a setup with the network, not a classic image build (the engine's builder has
        no per-step limit); ``test_timeout_s`` bounds the test container, which is killed when it passes. The
        container is removed whatever happens (a cancellation raised into the call included); one a dead worker
        left (it carries the run's and the op's labels) is adopted by the op's next attempt when it was made from
        the same image for the same command, started if it never was, waited for the rest of its timeout (one
        that ran all of it counts as timed out), and read as if this call had made it: one container per
        op, whatever is killed. One of other inputs is replaced; one no attempt comes back for goes with
        ``cleanup_run``."""
        recipe = run.spec.recipe
        if recipe.secrets:
            raise UnsupportedRecipeError("the docker provider does not inject secrets (see provision)")
        log_path, workspace, command = run.log_path, Path(run.workspace), run.command or recipe.test
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # Setup with the network runs in setup containers committed to the image, else as its build steps.
        how = "in setup containers (egress proxy only) committed to" if recipe.setup_network else "as build steps of"
        try:
            image = self.images.ensure_app(
                recipe, workspace, progress=run.progress, log_path=log_path, setup_timeout_s=run.setup_timeout_s
            )
        except SetupStepError as exc:
            with log_path.open("a", encoding="utf-8") as log:
                log.write(f"# setup ran {how} the app image\n{exc}\n")
            raise SetupError(str(exc), failed=exc.failed) from exc
        with log_path.open("a", encoding="utf-8") as log:
            log.write(f"# setup ran {how} {image}\n$ {command}\n")
        run.progress(f"running tests: {command_text(command)}")
        # An op of its own (labelled and named ``<op>:checks``), apart from any environment of ``op_id``.
        checks_op = f"{run.op_id}:checks"
        name = container_name(checks_op)
        argv = ["/bin/sh", "-c", command]
        with self.fence.creating(run.run_id, checks_op):
            container = self._adopt(name, run.run_id, checks_op)
            if container is not None and not _runs(container, image, argv):
                # Another image or command under this op's name: an op ID names one set of inputs, so this is
                # not a run of ours to wait for.
                self._remove_container(container, CleanupReport(run_id=run.run_id))
                container = None
            if container is None:
                container = self._create_checks(name, image, run.run_id, checks_op, recipe, argv)
            else:
                # A dead worker's attempt of this op made it (the same image and command): its run is this one's.
                run.progress(f"adopting {name}")
                log_note(log_path, f"{name} adopted as an earlier attempt of {checks_op} left it ({container.status})")
        started = time.monotonic()
        code: int | None = None
        try:
            ran_s = _ran_s(container)  # an adopted container's time so far (None: never started)
            if container.status == "created":
                container.start()
            # An adopted container that ran its whole timeout was killed at it by the attempt that left it.
            if not (container.status == "exited" and ran_s is not None and ran_s >= run.test_timeout_s):
                try:
                    left = run.test_timeout_s - (ran_s or 0.0)
                    code = int(container.wait(timeout=max(left, 1.0))["StatusCode"])
                except RequestException:
                    container.kill()
            duration = (ran_s or 0.0) + time.monotonic() - started
            with log_path.open("ab") as log:
                log.write(bytes(container.logs(stdout=True, stderr=True)))
            for path in (*([recipe.test_report] if recipe.test_report else []), *run.collect):
                copy_out(container, path, workspace)
        finally:
            report = CleanupReport(run_id=run.run_id)
            _remove(lambda: container.remove(force=True), _container_resource(container), report)
        return result_of_tests(code, duration, log_path)

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
        """``command`` in a container of its own from the app container's image (the workspace as provisioned,
        its setup built in), sharing the app container's network namespace: the app answers on its loopback at
        ``$DURAFIX_APP_URL``, and the command has no other network than the app's (see the module's contract for
        what that network reaches). Hardened as the checks' container, its root filesystem writable but gone
        with it; labelled with the run (``<op>:run-in``), killed at ``timeout_s`` and removed whatever happens.
        ``collect`` is copied back into ``workspace`` (:func:`copy_out`). Raises :class:`EnvironmentGoneError`
        when the app's container no longer exists, is not the handle's, or no longer runs."""
        recipe = spec.recipe
        try:
            app = self.client.containers.get(handle.env_id)
        except NotFound:
            raise EnvironmentGoneError(f"{handle.env_id} no longer exists") from None
        if not owned_by(app.labels, handle.run_id, handle.op_id) or app.status != "running":
            raise EnvironmentGoneError(f"{handle.env_id} is not this environment's running container")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        run_op = f"{handle.op_id}:run-in"
        name = container_name(run_op)
        with self.fence.creating(handle.run_id, run_op, doing="run a reproduction in"):
            stale = self._adopt(name, handle.run_id, run_op)
            if stale is not None:  # a dead worker's: its outputs are not ours to trust
                self._remove_container(stale, CleanupReport(run_id=handle.run_id))
            port = app.labels.get(PORT_LABEL, str(recipe.port))
            container = self.client.containers.create(
                app.image.id,
                ["/bin/sh", "-c", command],
                name=name,
                labels=ownership_labels(handle.run_id, run_op),
                environment={**recipe.env, "PORT": port, "HOME": "/tmp", APP_URL_VAR: f"http://127.0.0.1:{port}"},
                working_dir=APP_DIR,
                user=APP_USER,
                network_mode=f"container:{app.id}",
                **hardened(recipe.limits),
                tmpfs={"/tmp": _TMP_MOUNT},
            )
        started = time.monotonic()
        code: int | None
        try:
            container.start()
            try:
                code = int(container.wait(timeout=timeout_s)["StatusCode"])
            except RequestException:
                container.kill()
                code = None
            duration = time.monotonic() - started
            with log_path.open("ab") as log:
                log.write(f"$ {command}\n".encode())
                log.write(bytes(container.logs(stdout=True, stderr=True)))
            for path in collect:
                copy_out(container, path, Path(workspace))
        finally:
            _remove(
                lambda: container.remove(force=True),
                _container_resource(container),
                CleanupReport(run_id=handle.run_id),
            )
        return result_of_tests(code, duration, log_path)

    def _app_image(self, recipe: AppRecipe, workspace: Path, progress: Progress, log_path: Path) -> str:
        """The app image for ``workspace``, its build logged to ``log_path`` (the CA layer, setup containers'
        output and the egress proxy's lines; kept in the run's directory); a setup command that fails while it is
        built is the recipe's failure, a :class:`~environments.checks.SetupError` naming the command and carrying
        that log (the failure's tail appended), as on the local provider."""
        try:
            return self.images.ensure_app(recipe, workspace, progress=progress, log_path=log_path)
        except SetupStepError as exc:
            with log_path.open("a", encoding="utf-8") as log:
                log.write(f"{exc}\n")
            raise SetupError(str(exc), failed=exc.failed, log_path=log_path) from exc

    def _create_checks(self, name: str, image: str, run_id: str, op_id: str, recipe: AppRecipe, argv: list[str]) -> Any:
        limits = recipe.limits
        return self.client.containers.create(
            image,
            argv,
            name=name,
            labels=ownership_labels(run_id, op_id),
            environment={**recipe.env, "HOME": "/tmp"},
            working_dir=APP_DIR,
            user=APP_USER,
            network_mode="none",
            **hardened(limits),
            tmpfs={"/tmp": _TMP_MOUNT},
        )

    def _adopt(self, name: str, run_id: str, op_id: str) -> Any:
        try:
            container = self.client.containers.get(name)
        except NotFound:
            return None
        if not owned_by(container.labels, run_id, op_id):
            labels = container.labels or {}
            raise ResourceConflictError(
                f"container {name} exists but belongs to run={labels.get(RUN_LABEL)!r} op={labels.get(OP_LABEL)!r}"
            )
        return container

    def _ensure_network(self, run_dir: Path, run_id: str, op_id: str) -> str:
        name = network_name(run_id)
        with locked(run_dir / "network.lock"):
            # The names filter matches substrings, hence the exact comparison.
            existing = [n for n in self.client.networks.list(names=[name]) if n.name == name]
            for network in existing:
                if not owned_by(network.attrs.get("Labels"), run_id):
                    raise ResourceConflictError(f"network {name} exists but is not labelled for run {run_id}")
            if not existing:
                self.client.networks.create(
                    name, driver="bridge", internal=True, check_duplicate=True, labels=ownership_labels(run_id, op_id)
                )
        return name

    def _create(self, name: str, image: str, network: str, run_id: str, op_id: str, recipe: AppRecipe) -> Any:
        limits = recipe.limits
        labels = {
            **ownership_labels(run_id, op_id),
            PORT_LABEL: str(recipe.port),
            PROBE_PATH_LABEL: recipe.readiness.path,
            PROBE_STATUS_LABEL: str(recipe.readiness.expected_status),
        }
        try:
            return self.client.containers.create(
                image,
                ["/bin/sh", "-c", app_start(recipe)],
                name=name,
                labels=labels,
                environment={**recipe.env, "PORT": str(recipe.port), "HOME": "/tmp"},
                working_dir=APP_DIR,
                user=APP_USER,
                network=network,
                **hardened(limits),
                read_only=self.read_only_rootfs,
                tmpfs={"/tmp": _TMP_MOUNT},
            )
        except APIError as exc:
            if exc.status_code != 409:
                raise
            # Another worker created the name after our lookup: its container is ours to adopt (or a conflict).
            adopted = self._adopt(name, run_id, op_id)
            if adopted is None:
                raise
            return adopted

    def _network_resource(self, run_id: str, op_id: str) -> OwnedResource:
        name = network_name(run_id)
        network = self.client.networks.get(name)
        return _labelled_resource(ResourceKind.NETWORK, name, network.id, network.attrs)

    def _wait_ready(self, container: Any, run_id: str, op_id: str, probe: ReadinessProbe, progress: Progress) -> str:
        def still_running() -> bool:
            try:
                container.reload()
            except NotFound:
                return False
            return bool(container.status == "running")

        base_url = _base_url(container) if still_running() else None
        if base_url is not None:
            progress(f"waiting for readiness at {base_url}{probe.path}")
            if wait_ready(base_url, probe, still_running=still_running):
                return base_url
        try:
            container.reload()
        except NotFound:
            if self.fence.is_tombstoned(run_id):
                raise RunFencedError(f"run {run_id} was cleaned up while {op_id} was starting") from None
            raise NotReadyError(f"container {container.name} disappeared while starting") from None
        state = container.attrs.get("State", {})
        raise NotReadyError(
            f"{container.name} ({container.status}, exit code {state.get('ExitCode')}) did not answer GET "
            f"{probe.path} with {probe.expected_status} within {probe.deadline_s:.0f}s; last output:\n"
            f"{_logs_tail(container)}"
        )

    def _seed(self, container: Any, run_id: str, recipe: AppRecipe, progress: Progress) -> bool:
        """Run the fixtures once (see the module's contract); False when a half-seeded container was removed
        and must be replaced."""
        if not recipe.fixtures or _exec(container, ["test", "-e", _SEEDED])[0] == 0:
            return True
        if _exec(container, ["test", "-e", _SEEDING])[0] == 0:
            progress(f"removing half-seeded {container.name}")
            self._remove_container(container, CleanupReport(run_id=run_id))
            return False
        _exec(container, ["touch", _SEEDING])
        env = {**recipe.env, "PORT": str(recipe.port), "HOME": "/tmp", APP_URL_VAR: f"http://127.0.0.1:{recipe.port}"}
        for command in recipe.fixtures:
            progress(f"fixtures: {command_text(command)}")
            limit = ["timeout", "--kill-after=5", str(max(1, round(self.fixture_timeout_s)))]
            code, output = _exec(container, [*limit, "/bin/sh", "-c", command], env)
            if code != 0:
                report = CleanupReport(run_id=run_id)
                self._remove_container(container, report)
                outcome = "timed out" if code == 124 else f"exited {code}"
                left = f" (the container could not be removed: {report.errors})" if report.errors else ""
                raise FixtureError(f"fixture command {command!r} {outcome}{left}:\n{output[-4000:]}")
        _exec(container, ["touch", _SEEDED])
        return True

    def _remove_container(self, container: Any, report: CleanupReport) -> None:
        resource = _container_resource(container)

        def stop_and_remove() -> None:
            container.stop(timeout=max(1, round(self.stop_timeout_s)))
            container.remove(force=True)

        _remove(stop_and_remove, resource, report)


def _exec(container: Any, argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``argv`` in the container as the app's user, in the app directory: (exit code, output)."""
    result = container.exec_run(argv, user=APP_USER, workdir=APP_DIR, environment=env or {})
    output = result.output.decode(errors="replace") if isinstance(result.output, bytes) else ""
    return int(result.exit_code), output


def _remove(action: Any, resource: OwnedResource, report: CleanupReport) -> None:
    """Run a removal; already-gone counts as removed, any engine error leaves the resource in ``remaining``."""
    try:
        action()
    except NotFound:
        report.removed.append(resource)
    except (APIError, RequestException) as exc:
        report.remaining.append(resource)
        report.errors.append(f"{resource.kind.value} {resource.resource_id}: {exc}")
    else:
        report.removed.append(resource)


def _is_managed(labels: dict[str, str] | None, run_id: str | None) -> bool:
    labels = labels or {}
    if run_id is not None:
        return owned_by(labels, run_id)
    return labels.get(MANAGED_LABEL) == "1" and RUN_LABEL in labels and OP_LABEL in labels


def _base_url(container: Any) -> str | None:
    labels = container.labels or {}
    networks = container.attrs.get("NetworkSettings", {}).get("Networks") or {}
    address = (networks.get(network_name(labels.get(RUN_LABEL, ""))) or {}).get("IPAddress")
    if not address or PORT_LABEL not in labels:
        return None
    return f"http://{address}:{labels[PORT_LABEL]}"


def _probe_from_labels(labels: dict[str, str]) -> ReadinessProbe:
    return ReadinessProbe(path=labels[PROBE_PATH_LABEL], expected_status=int(labels[PROBE_STATUS_LABEL]))


def _logs_tail(container: Any) -> str:
    try:
        return bytes(container.logs(tail=_LOG_TAIL)).decode(errors="replace")
    except (APIError, RequestException) as exc:
        return f"(logs unavailable: {exc})"


def _runs(container: Any, image: str, argv: list[str]) -> bool:
    """Whether ``container`` was created from ``image`` (the tag it was given) to run ``argv``."""
    config = container.attrs.get("Config") or {}
    return bool(config.get("Image") == image and list(config.get("Cmd") or []) == argv)


def _ran_s(container: Any) -> float | None:
    """How long ``container`` has run (until it exited, or until now), by the engine's own record; None when it
    was never started."""
    state = container.attrs.get("State") or {}
    began = _instant(str(state.get("StartedAt") or ""))
    if began is None:
        return None
    ended = _instant(str(state.get("FinishedAt") or "")) if container.status == "exited" else None
    return max(0.0, ((ended or datetime.now(UTC)) - began).total_seconds())


def _instant(text: str) -> datetime | None:
    """The engine's RFC 3339 timestamp (nanoseconds, ``Z``) as a datetime; None for its zero time or garbage."""
    found = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    if found is None or found[1].startswith("0001-"):
        return None
    zone = "+00:00" if found[3] == "Z" else found[3]
    return datetime.fromisoformat(f"{found[1]}.{(found[2] or '').ljust(6, '0')[:6]}{zone}")


def _container_resource(container: Any) -> OwnedResource:
    labels = container.labels or {}
    return OwnedResource(
        kind=ResourceKind.CONTAINER,
        provider=PROVIDER_NAME,
        resource_id=str(container.name),
        run_id=labels.get(RUN_LABEL, ""),
        op_id=labels.get(OP_LABEL, ""),
        detail={"id": str(container.id), "status": str(container.status), "image": _image_name(container)},
    )


def _image_name(container: Any) -> str:
    return str(container.attrs.get("Config", {}).get("Image", ""))


def _labelled_resource(kind: ResourceKind, name: str, resource_id: str, attrs: dict[str, Any]) -> OwnedResource:
    labels = attrs.get("Labels") or {}
    return OwnedResource(
        kind=kind,
        provider=PROVIDER_NAME,
        resource_id=str(name),
        run_id=labels.get(RUN_LABEL, ""),
        op_id=labels.get(OP_LABEL, ""),
        detail={"id": str(resource_id)},
    )


# A test report is small; one larger than this is left in the container (the run is then judged by its exit code).
_MAX_REPORT_ARCHIVE = 64 * 1024 * 1024


def copy_out(container: Any, rel: str, workspace: Path) -> None:
    """Copy ``rel`` (a file or a directory under the app directory) out of the finished container into
    ``workspace``: the recipe's ``test_report``, which per-test judging reads (:mod:`environments.test_results`),
    or a reproduction's outputs. Only regular files come out, each written fresh and never through a link the
    repository left there (at the file or any parent), at most ``_MAX_REPORT_ARCHIVE`` bytes in all. What the
    command did not write, or what is not a regular file, is simply absent: the caller says so."""
    try:
        stream, stat = container.get_archive(f"{APP_DIR}/{rel}")
    except (docker.errors.NotFound, docker.errors.APIError):
        return
    if int(stat.get("size", 0)) > _MAX_REPORT_ARCHIVE:
        return
    # A directory's stat says nothing of what it holds: the archive is read up to the cap, and dropped beyond it.
    chunks, size = [], 0
    for chunk in stream:
        size += len(chunk)
        if size > _MAX_REPORT_ARCHIVE:
            return
        chunks.append(chunk)
    data = b"".join(chunks)
    parent = PurePosixPath(rel).parent
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member in archive.getmembers():
            # The archive's root is the path's last component: its members land under the path's parent.
            name = PurePosixPath(member.name)
            if not member.isfile() or name.is_absolute() or ".." in name.parts:
                continue
            extracted = archive.extractfile(member)
            if extracted is None:
                continue
            target = str(parent / name) if str(parent) != "." else str(name)
            try:
                unlink_beneath(workspace, target)
                write_beneath(workspace, target, extracted.read(_MAX_REPORT_ARCHIVE))
            except UntrustedFileError:
                continue
