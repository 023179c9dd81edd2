"""A command reproduction with ``app: true`` on the Docker provider, against a real engine: each run's script runs
by ``DockerProvider.run_in`` in a container of its own from the app's image, sharing the app container's network.
It reads what the cart app answers, what it wrote comes back into the workspace, a service on the worker's
loopback is out of its reach, its container is gone after the call (also when it was killed at its timeout), and
an environment that no longer runs is said to be gone."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import docker
import pytest

from browser.results import ReproductionStatus
from environments.docker.naming import run_filter
from environments.docker.provider import DockerProvider
from environments.interface import EnvironmentGoneError, EnvironmentHandle, RecoverySpec
from tests.support.cart_reproductions import assert_only_the_app_is_reached, reproduce_beside_app

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TOTAL = """
version: 1
kind: command
name: the cart API's total ignores quantities
app: true
files:
  repro/total.py: |
    import json, os, urllib.request
    with urllib.request.urlopen(os.environ["DURAFIX_APP_URL"] + "/api/cart", timeout=10) as answer:
        total = json.load(answer)["total_cents"]
    os.makedirs("out", exist_ok=True)
    open("out/total.txt", "w").write(str(total))
    print(total)
steps:
  - run: python3 repro/total.py
    timeout_s: 60
bug_present:
  - {check: stdout, not_equals: "4000"}
  - {check: file, path: out/total.txt, equals: "2375"}
"""


def containers(client: docker.DockerClient, run_id: str) -> list[str]:
    return sorted(c.name for c in client.containers.list(all=True, filters=run_filter(run_id)))


class App(NamedTuple):
    run_id: str
    ws: Path
    handle: EnvironmentHandle


@pytest.fixture
def app(
    provider: DockerProvider,
    cart_spec: RecoverySpec,
    cart_workspace: Path,
    new_run: Callable[[], str],
    tmp_path: Path,
) -> App:
    """The cart app provisioned for a new run from a copy of the sample's workspace."""
    ws = tmp_path / "workspace"
    shutil.copytree(cart_workspace, ws)
    run_id = new_run()
    handle = provider.provision(run_id=run_id, op_id=f"{run_id}:env-base:1", spec=cart_spec, workspace=str(ws))
    return App(run_id, ws, handle)


def test_a_command_reproduction_against_the_app_container_reads_its_answer_and_reaches_nothing_else(
    provider: DockerProvider, docker_client: docker.DockerClient, cart_spec: RecoverySpec, app: App
) -> None:
    run_id, ws, handle = app
    app_only = containers(docker_client, run_id)

    found = reproduce_beside_app(provider, handle, cart_spec, ws, TOTAL)
    assert found.status == ReproductionStatus.REPRODUCED, found.detail
    assert [(c.holds, c.actual) for c in found.runs[0].checks] == [(True, "2375\n"), (True, "2375")]
    assert (ws / "out" / "total.txt").read_text() == "2375"
    assert containers(docker_client, run_id) == app_only, "the command's container outlived the call"

    # The app answers on the loopback it shares with the command.
    assert_only_the_app_is_reached(provider, handle, cart_spec, ws, 8000, 60)


def test_a_command_killed_at_its_timeout_leaves_no_container_and_a_gone_app_is_gone(
    provider: DockerProvider, docker_client: docker.DockerClient, cart_spec: RecoverySpec, app: App, tmp_path: Path
) -> None:
    run_id, ws, handle = app
    app_only = containers(docker_client, run_id)
    result = provider.run_in(handle, cart_spec, str(ws), "sleep 300", log_path=tmp_path / "run.log", timeout_s=3)
    assert result.timed_out and result.exit_code is None
    assert containers(docker_client, run_id) == app_only

    provider.teardown(handle)
    with pytest.raises(EnvironmentGoneError):
        provider.run_in(handle, cart_spec, str(ws), "true", log_path=tmp_path / "gone.log", timeout_s=10)
    assert containers(docker_client, run_id) == []
