"""The Docker provider against a real engine: creation, adoption, conflicts, recovery, fencing, cleanup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import docker
import httpx
import pytest

from environments.checks import SetupError
from environments.diagnosis import Cause, FailedCommand, Stage, diagnose
from environments.docker import DockerProvider, UnsupportedRecipeError
from environments.docker.naming import container_name, network_name, ownership_labels, run_filter
from environments.interface import (
    AppRecipe,
    EnvironmentHandle,
    EnvironmentStatus,
    FixtureError,
    NoAppError,
    Progress,
    RecoverySpec,
    ResourceConflictError,
    ResourceKind,
    RunFencedError,
    TestRunResult,
)
from environments.test_results import CaseOutcome, read_workspace_report
from infra.docker.engine import DockerEngine
from tests.support.docker import REPO_ROOT
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

IMAGE_PROGRESS = ("building base image ", "importing base image ", "building image ", "setup: ")


def containers_of(client: docker.DockerClient, run_id: str) -> list[docker.models.containers.Container]:
    return list(client.containers.list(all=True, filters=run_filter(run_id)))


def wait_for_status(provider: DockerProvider, handle: EnvironmentHandle, wanted: EnvironmentStatus) -> None:
    deadline = time.monotonic() + 20
    while provider.check(handle) is not wanted:
        assert time.monotonic() < deadline, f"{handle.env_id} never became {wanted}"
        time.sleep(0.2)


class Provision(Protocol):
    def __call__(
        self,
        run_id: str,
        op_id: str | None = None,
        spec: RecoverySpec | None = None,
        progress: Progress | None = None,
    ) -> EnvironmentHandle: ...


@pytest.fixture
def provision(provider: DockerProvider, cart_spec: RecoverySpec, cart_workspace: Path) -> Provision:
    """Provisions the sample app for a run: operation ``<run_id>:env`` and the cart's spec unless named."""

    def provision_run(
        run_id: str, op_id: str | None = None, spec: RecoverySpec | None = None, progress: Progress | None = None
    ) -> EnvironmentHandle:
        return provider.provision(
            run_id=run_id,
            op_id=op_id or f"{run_id}:env",
            spec=spec or cart_spec,
            workspace=str(cart_workspace),
            progress=progress,
        )

    return provision_run


@pytest.fixture
def run_id(new_run: Callable[[], str]) -> str:
    """A fresh run, cleaned up (completely) after the test."""
    return new_run()


@pytest.fixture
def foreign_container(docker_client: docker.DockerClient) -> Iterator[list[str]]:
    """Names of containers a test creates outside the provider; removed after the test."""
    names: list[str] = []
    yield names
    for name in names:
        docker_client.containers.get(name).remove(force=True)


def test_cart_container_starts_and_answers_its_probe_from_the_host(
    provider: DockerProvider, run_id: str, provision: Provision
) -> None:
    handle = provision(run_id)

    assert httpx.get(f"{handle.base_url}/healthz", trust_env=False).text == "ok"
    assert httpx.get(f"{handle.base_url}/api/cart", trust_env=False).json()["items"]
    assert provider.check(handle) is EnvironmentStatus.READY
    assert {r.kind for r in handle.resources} == {ResourceKind.CONTAINER, ResourceKind.NETWORK}


def test_provision_twice_with_one_op_id_gives_one_container(
    run_id: str, provision: Provision, docker_client: docker.DockerClient
) -> None:
    first = provision(run_id)
    second = provision(run_id)

    assert first == second
    assert [c.name for c in containers_of(docker_client, run_id)] == [first.env_id]
    assert len(docker_client.networks.list(filters=run_filter(run_id))) == 1


def killed_after_create(
    engine: DockerEngine,
    provider: DockerProvider,
    run_id: str,
    op_id: str,
    workspace: Path,
    spec: RecoverySpec,
    *mode: str,
) -> None:
    """``workers/kill_after_create.py``: the provider in a process of its own, SIGKILLed at the point ``mode``
    names (default: right after the engine created the op's container); asserts it died so."""
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.workers.kill_after_create",
            str(provider.state_dir),
            str(provider.images.cache_dir),
            engine.docker_host,
            run_id,
            op_id,
            str(workspace),
            spec.model_dump_json(),
            *mode,
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr


def test_provision_killed_after_create_is_adopted_by_the_next_attempt(
    docker_engine: DockerEngine,
    provider: DockerProvider,
    run_id: str,
    cart_spec: RecoverySpec,
    cart_workspace: Path,
    provision: Provision,
    docker_client: docker.DockerClient,
) -> None:
    op_id = f"{run_id}:env:1"
    killed_after_create(docker_engine, provider, run_id, op_id, cart_workspace, cart_spec)
    orphans = containers_of(docker_client, run_id)
    assert [(c.name, c.status) for c in orphans] == [(container_name(op_id), "created")]

    handle = provision(run_id, op_id)

    survivors = containers_of(docker_client, run_id)
    assert [c.id for c in survivors] == [orphans[0].id]
    assert provider.check(handle) is EnvironmentStatus.READY


@pytest.mark.parametrize("killed", ["checks-after-create", "checks-after-start"])
def test_checks_killed_after_their_container_was_created_or_started_are_adopted_by_the_next_attempt(
    docker_engine: DockerEngine,
    provider: DockerProvider,
    run_id: str,
    cart_spec: RecoverySpec,
    cart_workspace: Path,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    killed: str,
) -> None:
    """A worker dies by SIGKILL right after the engine created (or started) the tests' container of a check: the
    op's next attempt runs the same checks and adopts that container (started if it never was, waited for if it
    runs), reads its result as its own and removes it. The engine created one container for the op, whatever was
    killed, and none is left."""
    since = int(time.time()) - 1
    op_id = f"{run_id}:verify:1"
    spec = cart_spec.model_copy(
        update={"recipe": cart_spec.recipe.model_copy(update={"test": "echo tests-began; sleep 3; echo tests-ran"})}
    )
    killed_after_create(docker_engine, provider, run_id, op_id, cart_workspace, spec, killed)
    [orphan] = containers_of(docker_client, run_id)
    assert orphan.name == container_name(f"{op_id}:checks")
    assert orphan.status == ("created" if killed == "checks-after-create" else "running")

    log = tmp_path / "checks.log"
    result = provider.run_checks(
        spec, str(cart_workspace), run_id=run_id, op_id=op_id, log_path=log, setup_timeout_s=60, test_timeout_s=120
    )

    assert result.passed and not result.timed_out
    assert "adopted" in log.read_text() and "tests-ran" in log.read_text()
    created = docker_client.events(
        since=since,
        until=int(time.time()) + 1,
        filters={"type": "container", "event": "create", "label": [f"durafix.run={run_id}"]},
        decode=True,
    )
    assert [e["Actor"]["Attributes"]["name"] for e in created] == [orphan.name]
    assert containers_of(docker_client, run_id) == []


def test_a_checks_container_of_other_inputs_under_the_ops_name_is_replaced_not_adopted(
    provider: DockerProvider,
    run_id: str,
    cart_spec: RecoverySpec,
    cart_workspace: Path,
    docker_client: docker.DockerClient,
    tmp_path: Path,
) -> None:
    """A container under the checks' name, with the op's labels but another command, is not this op's run: it is
    removed and the checks run in a container of their own."""
    op_id = f"{run_id}:verify:1"
    base = provider.images.ensure_base(cart_spec.recipe.image)
    other = docker_client.containers.create(
        base, ["/bin/sh", "-c", "exit 0"], name=container_name(f"{op_id}:checks"),
        labels=ownership_labels(run_id, f"{op_id}:checks"),
    )  # fmt: skip
    failing = cart_spec.model_copy(update={"recipe": cart_spec.recipe.model_copy(update={"test": "exit 4"})})
    result = provider.run_checks(
        failing, str(cart_workspace), run_id=run_id, op_id=op_id, log_path=tmp_path / "checks.log",
        setup_timeout_s=60, test_timeout_s=60,
    )  # fmt: skip
    assert not result.passed and result.exit_code == 4
    assert "adopted" not in (tmp_path / "checks.log").read_text()
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(other.id)
    assert containers_of(docker_client, run_id) == []


@pytest.mark.parametrize(
    "labels",
    [{"owner": "someone-else"}, ownership_labels("another-run", "another-run:env")],
    ids=["unlabelled", "another-runs-labels"],
)
def test_foreign_container_with_the_same_name_is_a_conflict_and_is_left_alone(
    provider: DockerProvider,
    run_id: str,
    cart_spec: RecoverySpec,
    provision: Provision,
    docker_client: docker.DockerClient,
    foreign_container: list[str],
    labels: dict[str, str],
) -> None:
    op_id = f"{run_id}:env"
    base = provider.images.ensure_base(cart_spec.recipe.image)
    foreign = docker_client.containers.create(base, ["true"], name=container_name(op_id), labels=labels)
    foreign_container.append(foreign.name)

    with pytest.raises(ResourceConflictError):
        provision(run_id, op_id)
    report = provider.cleanup_run(run_id)

    assert all(r.resource_id != foreign.name for r in report.removed)
    assert docker_client.containers.get(foreign.name).id == foreign.id


def test_app_killed_inside_the_container_is_reported_not_ready_and_the_next_provision_restarts_it(
    provider: DockerProvider, run_id: str, provision: Provision, docker_client: docker.DockerClient
) -> None:
    handle = provision(run_id)
    top = docker_client.containers.get(handle.env_id).top()
    command = top["Titles"].index("CMD")
    (app_pid,) = [int(p[1]) for p in top["Processes"] if p[command].startswith("python3 app.py")]

    os.kill(app_pid, signal.SIGKILL)

    wait_for_status(provider, handle, EnvironmentStatus.NOT_READY)
    # The probe sees the app gone before the engine has seen the container's process exit. A provision in that
    # moment adopts a container still running, fails not ready once it exits, and its retry starts it; the
    # provision here is the one after the engine saw the exit.
    wait_for(lambda: docker_client.containers.get(handle.env_id).status == "exited", 30, "the container to exit", 0.1)
    again = provision(run_id)
    assert provider.check(again) is EnvironmentStatus.READY
    assert len(containers_of(docker_client, run_id)) == 1


def test_cleanup_run_removes_everything_of_that_run_and_nothing_of_another(
    provider: DockerProvider, new_run: Callable[[], str], provision: Provision, docker_client: docker.DockerClient
) -> None:
    doomed, kept = new_run(), new_run()
    doomed_env = provision(doomed)
    kept_env = provision(kept)
    # Volumes labelled for a run belong to it too (the provider itself mounts only tmpfs).
    docker_client.volumes.create(f"vol-{doomed}", labels=ownership_labels(doomed, f"{doomed}:data"))
    docker_client.volumes.create(f"vol-{kept}", labels=ownership_labels(kept, f"{kept}:data"))

    report = provider.cleanup_run(doomed)

    assert report.complete, report.errors
    assert {(r.kind, r.resource_id) for r in report.removed} == {
        (ResourceKind.CONTAINER, doomed_env.env_id),
        (ResourceKind.NETWORK, network_name(doomed)),
        (ResourceKind.VOLUME, f"vol-{doomed}"),
    }
    assert provider.list_owned(doomed) == []
    assert provider.check(doomed_env) is EnvironmentStatus.GONE
    assert provider.check(kept_env) is EnvironmentStatus.READY
    assert {(r.kind, r.resource_id) for r in provider.list_owned(kept)} == {
        (ResourceKind.CONTAINER, kept_env.env_id),
        (ResourceKind.NETWORK, network_name(kept)),
        (ResourceKind.VOLUME, f"vol-{kept}"),
    }
    assert provider.cleanup_run(doomed).removed == []


def test_late_provision_after_cleanup_is_fenced_and_creates_nothing(
    provider: DockerProvider, run_id: str, provision: Provision, docker_client: docker.DockerClient
) -> None:
    provision(run_id, f"{run_id}:env:1")
    provider.cleanup_run(run_id)

    with pytest.raises(RunFencedError):
        provision(run_id, f"{run_id}:env:2")

    assert containers_of(docker_client, run_id) == []
    assert docker_client.networks.list(filters=run_filter(run_id)) == []


def test_limits_and_hardening_are_applied_to_the_container(
    run_id: str, provision: Provision, cart_spec: RecoverySpec, docker_client: docker.DockerClient
) -> None:
    handle = provision(run_id)
    container = docker_client.containers.get(handle.env_id)
    host = container.attrs["HostConfig"]
    limits = cart_spec.recipe.limits

    assert host["Memory"] == host["MemorySwap"] == limits.memory_mb * 1024 * 1024
    assert host["PidsLimit"] == limits.pids
    assert host["NanoCpus"] == int(limits.cpus * 1_000_000_000)
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["ReadonlyRootfs"] is True
    assert set(host["Tmpfs"]) == {"/tmp"}
    assert host["NetworkMode"] == network_name(run_id)
    assert container.attrs["Config"]["User"] == "65534:65534"
    assert docker_client.networks.get(network_name(run_id)).attrs["Internal"] is True
    write = container.exec_run(["/bin/sh", "-c", "touch /app/x"])
    assert write.exit_code != 0 and b"Read-only file system" in write.output


def test_cleanup_reports_a_container_the_engine_cannot_remove_and_a_retry_finishes(
    provider: DockerProvider, run_id: str, provision: Provision, docker_client: docker.DockerClient
) -> None:
    handle = provision(run_id)
    container = docker_client.containers.get(handle.env_id)
    # An immutable file in the container's directory makes the engine's removal fail for real.
    pinned = Path(docker_client.info()["DockerRootDir"]) / "containers" / container.id / "hostname"
    subprocess.run(["chattr", "+i", str(pinned)], check=True)
    try:
        report = provider.cleanup_run(run_id)
    finally:
        subprocess.run(["chattr", "-i", str(pinned)], check=True)

    assert [r.resource_id for r in report.remaining] == [handle.env_id]
    assert "operation not permitted" in report.errors[0]
    retry = provider.cleanup_run(run_id)
    assert retry.complete, retry.errors
    assert containers_of(docker_client, run_id) == []


def test_a_setup_step_failing_in_the_image_build_is_the_recipes_setup_error_naming_its_cause(
    provider: DockerProvider, cart_spec: RecoverySpec, cart_workspace: Path, new_run: Callable[[], str]
) -> None:
    """A virtual environment made in an image without python3-venv: provisioning fails as the local provider's
    does, a SetupError naming the command and its exit (so the run ends with the recipe's reason, never retried as
    durafix's own failure), and its message carries what the diagnosis recognises."""
    run_id = new_run()
    recipe = cart_spec.recipe.model_copy(update={"setup": ["python3 -m venv .venv"]})
    with pytest.raises(SetupError) as failed:
        provider.provision(
            run_id=run_id,
            op_id=f"{run_id}:env",
            spec=cart_spec.model_copy(update={"recipe": recipe}),
            workspace=str(cart_workspace),
        )
    assert failed.value.failed == FailedCommand(Stage.SETUP, "python3 -m venv .venv", 1)
    found = diagnose(failed.value.failed, str(failed.value))
    assert found is not None and found.cause == Cause.NO_VENV, str(failed.value)


def test_recipe_with_secrets_is_refused_before_anything_is_created(
    run_id: str, provision: Provision, cart_spec: RecoverySpec, docker_client: docker.DockerClient
) -> None:
    recipe = cart_spec.recipe.model_copy(update={"secrets": {"TOKEN": "env:CART_TOKEN"}})
    spec = cart_spec.model_copy(update={"recipe": recipe})

    with pytest.raises(UnsupportedRecipeError):
        provision(run_id, spec=spec)
    assert containers_of(docker_client, run_id) == []


def test_recipe_without_start_is_refused_before_anything_is_created(
    run_id: str, provision: Provision, cart_spec: RecoverySpec, docker_client: docker.DockerClient
) -> None:
    """No ``start``: no app, so no container to run it in. Refused before an image is built or the run's network
    or container exists (nothing is said on the way)."""
    spec = cart_spec.model_copy(update={"recipe": cart_spec.recipe.model_copy(update={"start": None})})
    states: list[str] = []

    with pytest.raises(NoAppError, match=r"durafix\.yaml declares no `start`"):
        provision(run_id, spec=spec, progress=states.append)
    assert states == [] and containers_of(docker_client, run_id) == []
    assert docker_client.networks.list(filters=run_filter(run_id)) == []


# A fixture that needs the app up: it reads the cart over HTTP, then records that it ran and as whom.
SEED = (
    "python3 -c \"import os, urllib.request; urllib.request.urlopen(os.environ['DURAFIX_APP_URL'] + '/api/cart')\""
    " && echo seeded as $(id -u) >> /tmp/seeded"
)


def with_fixtures(spec: RecoverySpec, *fixtures: str) -> RecoverySpec:
    return spec.model_copy(update={"recipe": spec.recipe.model_copy(update={"fixtures": list(fixtures)})})


def seeded(docker_client: docker.DockerClient, handle: EnvironmentHandle) -> str:
    result = docker_client.containers.get(handle.env_id).exec_run(["cat", "/tmp/seeded"])
    return str(result.output.decode())


def test_fixtures_run_once_inside_the_ready_container_and_adoption_does_not_rerun_them(
    run_id: str, provision: Provision, cart_spec: RecoverySpec, docker_client: docker.DockerClient
) -> None:
    spec = with_fixtures(cart_spec, SEED)
    first: list[str] = []
    handle = provision(run_id, spec=spec, progress=first.append)
    assert seeded(docker_client, handle) == "seeded as 65534\n"

    again: list[str] = []
    assert provision(run_id, spec=spec, progress=again.append) == handle
    assert seeded(docker_client, handle) == "seeded as 65534\n"

    # Image work is reported only when an image is missing (other tests may have built them already).
    *images, starting, waiting, seeding = first
    assert all(text.startswith(IMAGE_PROGRESS) for text in images), images
    ready_at = f"waiting for readiness at {handle.base_url}{spec.recipe.readiness.path}"
    assert len(SEED) > 80 and "  " not in SEED
    assert [starting, waiting, seeding] == [f"starting container {handle.env_id}", ready_at, f"fixtures: {SEED[:79]}…"]
    assert again == [f"adopting {handle.env_id}", ready_at]


def test_a_failing_fixture_removes_the_container(
    run_id: str, provision: Provision, cart_spec: RecoverySpec, docker_client: docker.DockerClient
) -> None:
    with pytest.raises(FixtureError, match="exited 4") as info:
        provision(run_id, spec=with_fixtures(cart_spec, SEED, "echo no seed data; exit 4"))
    assert "no seed data" in str(info.value)
    assert containers_of(docker_client, run_id) == []


def test_a_half_seeded_container_is_replaced_not_adopted(
    run_id: str, provision: Provision, cart_spec: RecoverySpec, docker_client: docker.DockerClient
) -> None:
    spec = with_fixtures(cart_spec, SEED)
    first = provision(run_id, spec=spec)
    first_id = docker_client.containers.get(first.env_id).id
    # As if the worker died while the fixtures ran: seeding began and never ended.
    docker_client.containers.get(first.env_id).exec_run(["rm", "/tmp/.durafix-seeded"])

    second = provision(run_id, spec=spec)
    [container] = containers_of(docker_client, run_id)
    assert container.id != first_id and container.name == second.env_id
    assert seeded(docker_client, second) == "seeded as 65534\n"


def test_checks_run_in_a_container_a_failing_setup_step_is_a_setup_error_and_a_hung_test_is_killed(
    run_id: str,
    provider: DockerProvider,
    cart_spec: RecoverySpec,
    cart_workspace: Path,
    docker_client: docker.DockerClient,
    tmp_path: Path,
) -> None:
    log = tmp_path / "checks.log"

    def checks(step: int, recipe: AppRecipe, test_timeout_s: float = 120, command: str | None = None) -> TestRunResult:
        """The checks of ``recipe`` in the cart workspace, as verify step ``step`` of the run."""
        return provider.run_checks(
            cart_spec.model_copy(update={"recipe": recipe}),
            str(cart_workspace),
            run_id=run_id,
            op_id=f"{run_id}:verify:{step}",
            log_path=log,
            setup_timeout_s=60,
            test_timeout_s=test_timeout_s,
            command=command,
        )

    result = checks(1, cart_spec.recipe)
    assert result.passed and result.exit_code == 0 and "OK" in log.read_text()

    # Another command than the recipe's test (the regression proof's subset), whose JUnit report is copied out of
    # the container into the workspace, where per-test judging reads it.
    reporting = cart_spec.recipe.model_copy(update={"test_report": "out/report.xml"})
    (cart_workspace / "out").mkdir(exist_ok=True)
    (cart_workspace / "out" / "report.xml").symlink_to("/etc/hostname")  # left by the repository: not followed
    result = checks(
        4,
        reporting,
        command="""mkdir -p out && rm -f out/report.xml && printf '<testsuite><testcase classname="c" name="t"/>"""
        """</testsuite>' > out/report.xml""",
    )
    assert result.passed
    assert not (cart_workspace / "out" / "report.xml").is_symlink()
    assert read_workspace_report(cart_workspace, "out/report.xml").cases == {"c::t": CaseOutcome.PASSED}

    broken = cart_spec.recipe.model_copy(update={"setup": ["echo about to fail; exit 3"]})
    with pytest.raises(SetupError, match="setup command 'echo about to fail; exit 3' failed") as failed:
        checks(2, broken, test_timeout_s=60)
    # The command it failed on is named, as the local provider names it, for the run's triage and its hint.
    assert failed.value.failed == FailedCommand(Stage.SETUP, "echo about to fail; exit 3", 3)

    hung = cart_spec.recipe.model_copy(update={"test": "echo started; sleep 300"})
    result = checks(3, hung, test_timeout_s=3)
    # Killed at its timeout (the command would sleep 300 s): the result says so.
    assert result.timed_out and not result.passed
    assert "started" in log.read_text()
    # Every check container is gone once its check ended.
    assert containers_of(docker_client, run_id) == []
