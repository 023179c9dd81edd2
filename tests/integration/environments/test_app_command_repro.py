"""A command reproduction with ``app: true`` on the local provider, for real: the sample cart app provisioned in
bubblewrap, each run's script run by ``LocalProcessProvider.run_in`` in the app's own network namespace. It reads
what the app answers (the buggy total, then the fixed one); it reaches nothing else (a service the test listens
on at the worker's loopback gets no connection); its processes are stopped at the timeout and none outlives the
call; an environment that no longer runs is said to be gone, with nothing run."""

from __future__ import annotations

import shutil
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from browser.results import ReproductionStatus
from environments.command_repro import SandboxReproduction, collected_paths, reproduce_in_sandbox
from environments.interface import EnvironmentGoneError, EnvironmentHandle, RecoverySpec, TestRunResult
from environments.local import LocalProcessProvider
from environments.processes import is_live
from environments.reproduction import CommandProcedure, parse_reproduction
from environments.sandbox import Sandbox
from environments.spec import load_recipe
from tests.support.cart_reproductions import CART_API_TOTAL
from tests.support.gitrepo import CART_APP
from tests.support.proctree import environ_pids
from tests.support.sandbox import sandbox

__all__ = ["sandbox"]

RUN = "repair:acme/cart#24"

# The cart's three lines: the right total counts quantities (4000 cents), the buggy one does not (2375).
TOTAL = CART_API_TOTAL

# What the commands can reach besides the app: a port the test listens on at the worker's loopback, and the
# worker's loopback address of the app (its forwarder's port), each tried with a short timeout.
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
    timeout_s: 30
bug_present:
  - {check: stdout, contains: reached}
"""


def tagged_pids(tag: str) -> set[int]:
    needle = f"DURAFIX_TEST_TAG={tag}".encode()
    return {pid for pid in environ_pids(lambda environ: needle in environ.split(b"\0")) if is_live(pid)}


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def provider(tmp_path: Path, tag: str, sandbox: Sandbox) -> Iterator[LocalProcessProvider]:
    prov = LocalProcessProvider(tmp_path / "state", stop_grace_s=2.0, sandbox=sandbox)
    yield prov
    assert prov.cleanup_run(RUN).complete
    assert tagged_pids(tag) == set(), "a test left processes behind"


def cart(tmp_path: Path, name: str, *, fixed: bool = False) -> Path:
    ws = tmp_path / name
    shutil.copytree(CART_APP, ws, ignore=shutil.ignore_patterns("__pycache__"))
    if fixed:
        source = (ws / "cart.py").read_text()
        (ws / "cart.py").write_text(
            source.replace("sum(item.unit_price_cents for item in items)", "sum(line_total(i) for i in items)")
        )
    return ws


def spec_for(tag: str) -> RecoverySpec:
    recipe = load_recipe(CART_APP).model_copy(update={"env": {"DURAFIX_TEST_TAG": tag}})
    return RecoverySpec(
        repository="acme/cart", clone_url="https://example.com/acme/cart.git", base_revision="3f" * 20, recipe=recipe
    )


def reproduce(
    provider: LocalProcessProvider, handle: EnvironmentHandle, spec: RecoverySpec, ws: Path, text: str
) -> SandboxReproduction:
    procedure = parse_reproduction(text)
    assert isinstance(procedure, CommandProcedure) and procedure.app

    def run(command: str, log: Path, setup_first: bool, timeout_s: float) -> TestRunResult:
        assert not setup_first, "provisioning ran the setup"
        return provider.run_in(
            handle, spec, str(ws), command, log_path=log, timeout_s=timeout_s, collect=collected_paths(procedure)
        )

    return reproduce_in_sandbox(ws, spec.recipe, procedure, run, ws.parent / f"{ws.name}-logs", setup=False)


def test_the_commands_read_what_the_running_app_answers_buggy_then_fixed(
    provider: LocalProcessProvider, tmp_path: Path, tag: str
) -> None:
    spec = spec_for(tag)
    buggy = cart(tmp_path, "buggy")
    handle = provider.provision(run_id=RUN, op_id=f"{RUN}:env-base:1", spec=spec, workspace=str(buggy))
    found = reproduce(provider, handle, spec, buggy, TOTAL)
    assert found.status == ReproductionStatus.REPRODUCED, found.detail
    [check] = found.runs[0].checks
    assert check.holds and check.actual == "2375\n"
    assert found.runs[0].steps[0].exit_code == 0

    fixed = cart(tmp_path, "fixed", fixed=True)
    other = provider.provision(run_id=RUN, op_id=f"{RUN}:env-candidate:1", spec=spec, workspace=str(fixed))
    again = reproduce(provider, other, spec, fixed, TOTAL)
    assert again.status == ReproductionStatus.NOT_REPRODUCED, again.detail
    assert again.runs[0].steps[0].stdout == "4000\n"
    # Each ran in its own environment's workspace, where its outputs are; the app kept running meanwhile.
    assert (buggy / ".durafix-repro" / "run-1" / "1.out").read_text() == "2375\n"
    assert (fixed / ".durafix-repro" / "run-1" / "1.out").read_text() == "4000\n"
    assert provider.check(handle).value == "ready"


def test_the_commands_reach_the_app_and_nothing_of_the_worker(
    provider: LocalProcessProvider, tmp_path: Path, tag: str
) -> None:
    spec = spec_for(tag)
    ws = cart(tmp_path, "ws")
    handle = provider.provision(run_id=RUN, op_id=f"{RUN}:env-base:1", spec=spec, workspace=str(ws))
    # A service on the worker's loopback that must never hear from the report's commands.
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
    app_port = int(handle.base_url.rsplit(":", 1)[1])
    try:
        text = REACH.replace("{ports}", f"{host_port} {app_port}")
        found = reproduce(provider, handle, spec, ws, text)
    finally:
        stop.set()
        thread.join()
        listener.close()
    said = found.runs[0].steps[0].stdout.splitlines()
    # The app's own port answers in its namespace (the app is there); the worker's service does not exist there.
    assert said[0].startswith(f"{host_port} refused"), said
    assert said[1] == f"{app_port} reached", said
    assert heard == []


def test_a_command_is_stopped_at_its_timeout_and_nothing_of_it_outlives_the_call(
    provider: LocalProcessProvider, tmp_path: Path, tag: str
) -> None:
    spec = spec_for(tag)
    ws = cart(tmp_path, "ws")
    handle = provider.provision(run_id=RUN, op_id=f"{RUN}:env-base:1", spec=spec, workspace=str(ws))
    app = tagged_pids(tag)
    result = provider.run_in(
        handle,
        spec,
        str(ws),
        "sleep 300 & (trap '' TERM; sleep 300) & sleep 300",
        log_path=tmp_path / "run.log",
        timeout_s=2,
    )
    assert result.timed_out and result.exit_code is None
    assert tagged_pids(tag) == app, "the command's processes outlived the call"
    assert all(is_live(pid) for pid in app)


def test_an_environment_that_no_longer_runs_is_gone_and_nothing_runs(
    provider: LocalProcessProvider, tmp_path: Path, tag: str
) -> None:
    spec = spec_for(tag)
    ws = cart(tmp_path, "ws")
    handle = provider.provision(run_id=RUN, op_id=f"{RUN}:env-base:1", spec=spec, workspace=str(ws))
    elsewhere = cart(tmp_path, "elsewhere")
    with pytest.raises(EnvironmentGoneError, match="runs from"):
        provider.run_in(handle, spec, str(elsewhere), "touch ran", log_path=tmp_path / "a.log", timeout_s=10)
    provider.teardown(handle)
    with pytest.raises(EnvironmentGoneError, match="no longer runs"):
        provider.run_in(handle, spec, str(ws), "touch ran", log_path=tmp_path / "b.log", timeout_s=10)
    assert not (ws / "ran").exists() and not (elsewhere / "ran").exists()
