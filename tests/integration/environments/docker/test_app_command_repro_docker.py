"""A command reproduction with ``app: true`` on the Docker provider, against a real engine: each run's script runs
by ``DockerProvider.run_in`` in a container of its own from the app's image, sharing the app container's network.
It reads what the cart app answers, what it wrote comes back into the workspace, a service on the worker's
loopback is out of its reach, its container is gone after the call (also when it was killed at its timeout), and
an environment that no longer runs is said to be gone."""

from __future__ import annotations

import shutil
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import docker
import pytest

from browser.results import ReproductionStatus
from environments.command_repro import SandboxReproduction, collected_paths, reproduce_in_sandbox
from environments.docker.naming import run_filter
from environments.docker.provider import DockerProvider
from environments.interface import EnvironmentGoneError, EnvironmentHandle, RecoverySpec, TestRunResult
from environments.reproduction import CommandProcedure, parse_reproduction

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

REACH = """
version: 1
kind: command
name: reaches only the app
app: true
files:
  repro/reach.py: |
    import os, socket, sys
    for port in sys.argv[1:]:
        try:
            socket.create_connection(("127.0.0.1", int(port)), timeout=3).close()
            print(port, "reached")
        except OSError as err:
            print(port, "refused", type(err).__name__)
steps:
  - run: python3 repro/reach.py {ports}
    timeout_s: 60
bug_present:
  - {check: stdout, contains: reached}
"""


def reproduce(
    provider: DockerProvider, handle: EnvironmentHandle, spec: RecoverySpec, ws: Path, text: str
) -> SandboxReproduction:
    procedure = parse_reproduction(text)
    assert isinstance(procedure, CommandProcedure) and procedure.app

    def run(command: str, log: Path, setup_first: bool, timeout_s: float) -> TestRunResult:
        return provider.run_in(
            handle, spec, str(ws), command, log_path=log, timeout_s=timeout_s, collect=collected_paths(procedure)
        )

    return reproduce_in_sandbox(ws, spec.recipe, procedure, run, ws.parent / "logs", setup=False)


def containers(client: docker.DockerClient, run_id: str) -> list[str]:
    return sorted(c.name for c in client.containers.list(all=True, filters=run_filter(run_id)))


def test_a_command_reproduction_against_the_app_container_reads_its_answer_and_reaches_nothing_else(
    provider: DockerProvider,
    docker_client: docker.DockerClient,
    cart_spec: RecoverySpec,
    cart_workspace: Path,
    new_run: Callable[[], str],
    tmp_path: Path,
) -> None:
    ws = tmp_path / "workspace"
    shutil.copytree(cart_workspace, ws)
    run_id = new_run()
    handle = provider.provision(run_id=run_id, op_id=f"{run_id}:env-base:1", spec=cart_spec, workspace=str(ws))
    app_only = containers(docker_client, run_id)

    found = reproduce(provider, handle, cart_spec, ws, TOTAL)
    assert found.status == ReproductionStatus.REPRODUCED, found.detail
    assert [(c.holds, c.actual) for c in found.runs[0].checks] == [(True, "2375\n"), (True, "2375")]
    assert (ws / "out" / "total.txt").read_text() == "2375"
    assert containers(docker_client, run_id) == app_only, "the command's container outlived the call"

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    heard: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                heard.append(listener.accept()[0].getpeername())
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    host_port = listener.getsockname()[1]
    try:
        reached = reproduce(provider, handle, cart_spec, ws, REACH.replace("{ports}", f"{host_port} 8000"))
    finally:
        stop.set()
        thread.join()
        listener.close()
    said = reached.runs[0].steps[0].stdout.splitlines()
    assert said[0].startswith(f"{host_port} refused"), said
    assert said[1] == "8000 reached", said  # the app, on the loopback it shares with the command
    assert heard == []


def test_a_command_killed_at_its_timeout_leaves_no_container_and_a_gone_app_is_gone(
    provider: DockerProvider,
    docker_client: docker.DockerClient,
    cart_spec: RecoverySpec,
    cart_workspace: Path,
    new_run: Callable[[], str],
    tmp_path: Path,
) -> None:
    run_id = new_run()
    handle = provider.provision(
        run_id=run_id, op_id=f"{run_id}:env-base:1", spec=cart_spec, workspace=str(cart_workspace)
    )
    app_only = containers(docker_client, run_id)
    result = provider.run_in(
        handle, cart_spec, str(cart_workspace), "sleep 300", log_path=tmp_path / "run.log", timeout_s=3
    )
    assert result.timed_out and result.exit_code is None
    assert containers(docker_client, run_id) == app_only

    provider.teardown(handle)
    with pytest.raises(EnvironmentGoneError):
        provider.run_in(handle, cart_spec, str(cart_workspace), "true", log_path=tmp_path / "gone.log", timeout_s=10)
    assert containers(docker_client, run_id) == []
