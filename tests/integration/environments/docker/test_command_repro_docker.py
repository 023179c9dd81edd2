"""A command reproduction in the Docker provider: its script runs in a test container from the app image, and
what it wrote (each command's outputs, a file a check reads) comes back into the workspace, where the judging
reads it as it does on the local provider."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from browser.results import ReproductionStatus
from environments.command_repro import collected_paths, reproduce_in_sandbox
from environments.docker.provider import DockerProvider
from environments.interface import RecoverySpec, TestRunResult
from environments.reproduction import CommandProcedure, parse_reproduction

PROCEDURE = """
version: 1
kind: command
name: the cart prints its total
files:
  repro/total.py: |
    import sys
    print(2 + 2)
    print("warned", file=sys.stderr)
steps:
  - run: mkdir -p out && echo written > out/result.txt
  - run: python3 repro/total.py
bug_present:
  - {check: stdout, equals: "4"}
  - {check: stderr, contains: warned}
  - {check: file, path: out/result.txt, equals: written}
"""


def test_a_command_reproduction_runs_in_a_container_and_its_outputs_come_back(
    provider: DockerProvider, cart_spec: RecoverySpec, cart_workspace: Path, new_run: Callable[[], str], tmp_path: Path
) -> None:
    ws = tmp_path / "workspace"
    shutil.copytree(cart_workspace, ws)
    procedure = parse_reproduction(PROCEDURE)
    assert isinstance(procedure, CommandProcedure)
    run_id = new_run()

    def sandboxed(command: str, log: Path, setup: bool, timeout_s: float) -> TestRunResult:
        return provider.run_checks(
            cart_spec,
            str(ws),
            run_id=run_id,
            op_id=f"{run_id}:reproduce",
            log_path=log,
            setup_timeout_s=120,
            test_timeout_s=timeout_s,
            command=command,
            setup=setup,
            collect=collected_paths(procedure),
        )

    found = reproduce_in_sandbox(ws, cart_spec.recipe, procedure, sandboxed, tmp_path / "logs")
    assert found.status == ReproductionStatus.REPRODUCED, found.detail
    last = found.runs[0].steps[-1]
    assert (last.exit_code, last.stdout, last.stderr) == (0, "4\n", "warned\n")
    assert [c.holds for c in found.runs[0].checks] == [True, True, True]
