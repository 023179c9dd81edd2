"""repair_bug end to end with the app under repair in Docker containers on the stack's own Docker engine.

The same real parts as ``test_pipeline.py`` (Temporal dev server, GitHub emulator with webhooks, scripted
model server, Debian Chromium, worker and receiver subprocesses), with ``environments="docker"``: every
``env.provision`` creates or adopts one labelled container on a private ``dockerd`` the stack started.

What the engine holds is read back from the engine itself through the Docker SDK: containers, networks and
volumes selected by the run's ``durafix.run`` label, and the engine's own ``create`` events, which count every
container ever created for the run even after cleanup removed it.

The module starts one stack (engine included) and stops it at the end. The Debian base image is imported into
the fresh engine before any run starts, from the root filesystem tarball cached in
``$DURAFIX_DOCKER_IMAGE_CACHE`` (default ``~/.cache/durafix/docker-images``, shared with the provider tests;
bootstrapped there once if absent), so no activity's timeout is spent on debootstrap.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
import yaml
from temporalio.client import WorkflowExecutionStatus

from environments.docker.naming import OP_LABEL, RUN_LABEL, container_name
from environments.interface import AppRecipe
from infra import processes
from pipeline import client as runs
from pipeline.ids import op_id
from pipeline.services import Services
from pipeline.state import Outcome, Phase, RunState, TriageReason
from tests.e2e.test_pipeline import RUN_TIMEOUT_S, awaiting_review, finished, run_with_recipe, state_when
from tests.support.docker import docker_e2e_stack
from tests.support.e2e_stack import REPO_ROOT, E2EStack, combined_model_script, kill, owned_processes
from tests.support.run_history import activity_attempts

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.browser]

NOTHING_LEFT: dict[str, list[str]] = {"containers": [], "networks": [], "volumes": []}


@pytest.fixture(scope="module")
def docker_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EStack]:
    recipe = AppRecipe.model_validate(yaml.safe_load((REPO_ROOT / "examples" / "cart" / "durafix.yaml").read_text()))
    with docker_e2e_stack(tmp_path_factory, combined_model_script, [recipe.image]) as e2e:
        yield e2e


@pytest.fixture(scope="module")
def engine(docker_stack: E2EStack) -> Iterator[docker.DockerClient]:
    client = docker.DockerClient(base_url=docker_stack.config.docker_host, timeout=60)
    yield client
    client.close()


def labelled(engine: docker.DockerClient, run_id: str) -> dict[str, list[str]]:
    """Names of the containers, networks and volumes carrying the run's label, whatever else they carry."""
    filters = {"label": [f"{RUN_LABEL}={run_id}"]}
    return {
        "containers": sorted(c.name for c in engine.containers.list(all=True, filters=filters, ignore_removed=True)),
        "networks": sorted(n.name for n in engine.networks.list(filters=filters)),
        "volumes": sorted(v.name for v in engine.volumes.list(filters=filters)),
    }


def containers_per_op(engine: docker.DockerClient, run_id: str) -> Counter[str]:
    """How many containers of the run exist right now, by their op label."""
    found = engine.containers.list(all=True, filters={"label": [f"{RUN_LABEL}={run_id}"]}, ignore_removed=True)
    return Counter(c.labels.get(OP_LABEL, "") for c in found)


def running_container(engine: docker.DockerClient, run_id: str) -> bool:
    filters = {"label": [f"{RUN_LABEL}={run_id}"], "status": ["running"]}
    return bool(engine.containers.list(filters=filters, ignore_removed=True))


def containers_created(engine: docker.DockerClient, run_id: str, since: int) -> Counter[str]:
    """Every container the engine ever created for the run since ``since`` (epoch seconds), by op label.

    Read from the engine's event log, which outlives the containers; every create's name is checked to be
    the one derived from its op ID.
    """
    events = engine.events(
        since=since,
        until=int(time.time()) + 1,
        filters={"type": "container", "event": "create", "label": [f"{RUN_LABEL}={run_id}"]},
        decode=True,
    )
    created: Counter[str] = Counter()
    for event in events:
        attributes = event["Actor"]["Attributes"]
        assert attributes["name"] == container_name(attributes[OP_LABEL]), attributes
        created[attributes[OP_LABEL]] += 1
    return created


def provisioning_ops(run_id: str) -> set[str]:
    """The env ops of a run whose first candidate verifies: the base reproduction and the candidate replay."""
    return {op_id(run_id, "env-base", 1), op_id(run_id, "env-candidate-1", 1)}


def check_ops(run_id: str) -> set[str]:
    """The ops of the containers the baseline's and the first candidate's tests ran in, and the candidate's
    regression proof (the patch's test on the base's code)."""
    verify = op_id(run_id, "verify", 1)
    return {f"{op_id(run_id, 'baseline')}:checks", f"{verify}:checks", f"{verify}:regression:checks"}


async def test_docker_run_merges_and_leaves_no_labelled_container_network_or_volume(
    docker_stack: E2EStack, engine: docker.DockerClient
) -> None:
    stack = docker_stack
    since = int(time.time()) - 1
    stack.spawn_worker()
    try:
        client, repository, _, wf = await stack.open_run()

        state = await state_when(client, wf, awaiting_review)
        assert state.pending_approval is not None, state.outcome_detail
        assert state.reproduction is not None and state.reproduction.status == "reproduced"
        assert state.environment is not None and state.environment.provider == "docker"
        head = state.pending_approval.head_sha
        reviewer = stack.github(stack.reviewer_token).get_repo(repository)
        pr = reviewer.get_pull(state.pending_approval.pr_number)
        pr.create_review(commit=reviewer.get_commit(head), event="APPROVE", body="LGTM")
        final = await state_when(client, wf, finished)
    finally:
        stack.stop_workers()

    assert final.outcome == Outcome.MERGED, final.outcome_detail
    assert final.approval is not None and final.approval.head_sha == head and final.approval.source == "webhook"
    assert stack.github().get_repo(repository).get_pull(pr.number).merged
    assert final.cleanup is not None and final.cleanup.complete, final.cleanup
    # The app ran in the engine, once per provisioning op, and not as a local process; so did the baseline's and
    # the candidate's tests, each in a container of its own.
    assert containers_created(engine, wf, since) == Counter(dict.fromkeys(provisioning_ops(wf) | check_ops(wf), 1))
    assert owned_processes(wf) == []
    assert labelled(engine, wf) == NOTHING_LEFT


async def test_cancelling_while_the_container_is_up_removes_everything_labelled(
    docker_stack: E2EStack, engine: docker.DockerClient
) -> None:
    stack = docker_stack
    stack.spawn_worker()
    try:
        client, _, _, wf = await stack.open_run()

        def container_up(state: RunState, status: WorkflowExecutionStatus | None) -> bool:
            env_ready = state.environment is not None and state.environment.last_status == "ready"
            return (env_ready and running_container(engine, wf)) or finished(state, status)

        await state_when(client, wf, container_up)
        assert await runs.status_of(client, wf) == WorkflowExecutionStatus.RUNNING
        await runs.cancel(client, wf)
        final = await state_when(client, wf, finished)
        status = await runs.status_of(client, wf)
    finally:
        stack.stop_workers()

    assert status == WorkflowExecutionStatus.CANCELED, final
    assert final.outcome == Outcome.CANCELLED, final.outcome_detail
    assert final.phase == Phase.DONE
    assert final.cleanup is not None and final.cleanup.complete and final.cleanup.removed >= 1, final.cleanup
    assert labelled(engine, wf) == NOTHING_LEFT


@pytest.mark.timeout(480)
async def test_worker_killed_between_container_create_and_provision_result_leaves_one_container_per_op(
    docker_stack: E2EStack, engine: docker.DockerClient, tmp_path: Path
) -> None:
    """SIGKILL right after the engine created each provisioning op's container (not yet started, nothing
    recorded); fresh workers adopt it. The engine never holds two containers of one op, creates exactly one
    per op, and holds none of the run's at the end."""
    stack = docker_stack
    since = int(time.time()) - 1
    client, repository, _, wf = await stack.open_run()
    kills = provisioning_ops(wf)
    most_per_op = 0
    worker = stack.spawn_worker(fault="kill-after-docker-create", kill_dir=tmp_path)

    async def drive(until_review: bool) -> RunState | None:
        """Keep one worker alive (replacing killed ones) and sample the engine until the run gets there."""
        nonlocal worker, most_per_op
        deadline = time.monotonic() + RUN_TIMEOUT_S
        state: RunState | None = None
        while time.monotonic() < deadline:
            if not processes.is_alive(worker):
                # Each kill costs one worker; more deaths than kills means workers die for another reason.
                assert len(stack.workers) <= len(kills), processes.log_tail(Path(worker.log))
                kill(worker)  # whatever the dead worker had started (a browser) goes with it
                worker = stack.spawn_worker(fault="kill-after-docker-create", kill_dir=tmp_path)
            most_per_op = max(most_per_op, *containers_per_op(engine, wf).values(), 0)
            try:
                status, state = await runs.status_and_state(client, wf)
            except Exception:  # no worker answers the query yet, or the webhook has not started the run
                await asyncio.sleep(0.3)
                continue
            if finished(state, status) or (until_review and state.pending_approval is not None):
                return state
            await asyncio.sleep(0.3)
        return state

    try:
        state = await drive(until_review=True)
        assert state is not None and state.pending_approval is not None, state
        stack.approve_on_forge(repository, state.pending_approval.pr_number, state.pending_approval.head_sha)
        final = await drive(until_review=False)
    finally:
        stack.stop_workers()

    assert final is not None and final.outcome == Outcome.MERGED, final
    assert {p.read_text() for p in tmp_path.iterdir()} == kills
    assert most_per_op == 1
    assert containers_created(engine, wf, since) == Counter(dict.fromkeys(kills | check_ops(wf), 1))
    assert final.cleanup is not None and final.cleanup.complete, final.cleanup
    assert labelled(engine, wf) == NOTHING_LEFT


# A virtual environment made in setup with the sample app's image, whose packages are `python3` only: Debian's
# python3 without python3-venv has no ensurepip, so the build step fails, every time.
VENV_SETUP = "python3 -m venv .venv"


async def test_a_recipe_without_python3_venv_ends_at_once_naming_the_step_and_the_package(
    docker_stack: E2EStack, engine: docker.DockerClient
) -> None:
    """The acceptance of a recipe failure on Docker: the image build's setup step fails, and the run ends on its
    first attempt with the environment reason, the failing step and the `python3-venv` hint on the ticket (read
    from the forge); no activity was retried (the run's history) and the model was never asked."""
    stack = docker_stack
    recipe = (REPO_ROOT / "examples" / "cart" / "durafix.yaml").read_text()
    with_venv = recipe.replace("setup: []", f"setup:\n  - {VENV_SETUP}")
    assert with_venv != recipe and "python3-venv" not in with_venv
    stack.spawn_worker()
    try:
        run = await run_with_recipe(stack, with_venv, "Make a virtual environment in setup")
    finally:
        stack.stop_workers()
    final, wf = run.final, run.wf

    assert final.outcome == Outcome.NEEDS_HUMAN_TRIAGE, final.outcome_detail
    assert final.triage is not None and final.triage.reason == TriageReason.ENVIRONMENT_NOT_SET_UP, final.triage
    failed = final.triage.environment
    assert failed is not None and (failed.stage, failed.command, failed.exit_code) == ("setup", VENV_SETUP, 1)
    assert failed.cause == "no-venv", failed
    [body] = run.tickets()
    assert "needs human triage" in body and "`environment-not-set-up`" in body, body
    assert f"failed: setup command `{VENV_SETUP}` exited 1" in body, body
    # The image build's log is the run's evidence, linked from the ticket and quoted nowhere on it.
    assert failed.log_ref is not None and f"[environment.log]({failed.log_url})" in body, body
    assert "ensurepip is not" in Services(stack.config).store.read_bytes(failed.log_ref).decode()
    assert "ensurepip is not" not in body, body
    assert "hint: setup makes a Python virtual environment" in body and "`python3-venv` to `image.packages`" in body
    attempts = await activity_attempts(run.client, wf)
    assert ("env.provision", 1) in attempts, attempts
    assert [a for a in attempts if a[1] != 1] == [], attempts
    assert not run.model_asked(), "the model was asked"
    assert final.candidates == [] and final.budgets.repair_attempts_used == 0
    assert labelled(engine, wf) == NOTHING_LEFT
