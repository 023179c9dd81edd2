"""The sample cart's bug as a command reproduction against its running app (``app: true``): its API's total,
read from ``$DURAFIX_APP_URL``, is not the one that counts quantities (4000 cents; the buggy cart says 2375).
Also what every provider's ``run_in`` test runs such a reproduction with, and what it checks the commands can
reach."""

from __future__ import annotations

from pathlib import Path

from environments.command_repro import SandboxReproduction, collected_paths, reproduce_in_sandbox
from environments.interface import EnvironmentHandle, EnvironmentProvider, RecoverySpec, TestRunResult
from environments.reproduction import CommandProcedure, parse_reproduction
from tests.support.listeners import listen

CART_API_TOTAL = """version: 1
kind: command
name: the cart API's total ignores quantities
app: true
files:
  repro/total.py: |
    import json, os, urllib.request
    with urllib.request.urlopen(os.environ["DURAFIX_APP_URL"] + "/api/cart", timeout=10) as answer:
        print(json.load(answer)["total_cents"])
steps:
  - run: python3 repro/total.py
    timeout_s: 30
bug_present:
  - {check: stdout, not_equals: "4000"}
"""


def reported(procedure: str, intro: str = "") -> str:
    """``procedure`` as a report's ``durafix-repro`` block, after ``intro``."""
    return f"{intro}\n```durafix-repro\n{procedure}```\n"


def cart_app_reach(ports: str, timeout_s: int) -> str:
    """A command reproduction beside the app that tries to connect to each of ``ports`` (space-separated) on
    its loopback, with a short timeout, printing ``<port> reached`` or ``<port> refused <error>`` a line each."""
    return f"""version: 1
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
    timeout_s: {timeout_s}
bug_present:
  - {{check: stdout, contains: reached}}
"""


def reproduce_beside_app(
    provider: EnvironmentProvider, handle: EnvironmentHandle, spec: RecoverySpec, ws: Path, text: str
) -> SandboxReproduction:
    """The ``app: true`` command reproduction ``text`` judged in ``ws``, each run's script run by
    ``provider.run_in`` against the provisioned environment ``handle`` (whose provisioning ran the setup: none
    runs again); the logs beside ``ws``."""
    procedure = parse_reproduction(text)
    assert isinstance(procedure, CommandProcedure) and procedure.app

    def run(command: str, log: Path, setup_first: bool, timeout_s: float) -> TestRunResult:
        assert not setup_first, "provisioning ran the setup"
        return provider.run_in(
            handle, spec, str(ws), command, log_path=log, timeout_s=timeout_s, collect=collected_paths(procedure)
        )

    return reproduce_in_sandbox(ws, spec.recipe, procedure, run, ws.parent / f"{ws.name}-logs", setup=False)


def assert_only_the_app_is_reached(
    provider: EnvironmentProvider,
    handle: EnvironmentHandle,
    spec: RecoverySpec,
    ws: Path,
    app_port: int,
    timeout_s: int,
) -> None:
    """Commands run beside the app of ``handle`` reach the app on ``app_port`` of their loopback, and not a service
    listening on the worker's loopback, which hears nothing from them."""
    listener = listen("127.0.0.1")
    port = listener.port
    try:
        found = reproduce_beside_app(provider, handle, spec, ws, cart_app_reach(f"{port} {app_port}", timeout_s))
    finally:
        listener.sock.close()
    said = found.runs[0].steps[0].stdout.splitlines()
    assert said[0].startswith(f"{port} refused"), said
    assert said[1] == f"{app_port} reached", said
    assert listener.seen == []
