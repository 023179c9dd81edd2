"""Child process for recovery tests: provision (or run checks), and die by SIGKILL the instant the engine created
(or started) the container.

``python -m tests.support.workers.kill_after_create STATE IMAGE_CACHE DOCKER_HOST RUN_ID OP_ID WORKSPACE
SPEC_JSON [checks-after-create | checks-after-start]``

The hook lives here, not in the product: the container collection's ``create`` (or the container's ``start``) is
wrapped so that the process kills itself after the engine answered and before the provider records anything or
starts (waits for) the container, the widest window in which a crash can leave an unrecorded resource behind.
With ``checks-…`` the call is ``run_checks`` (its log in ``STATE/killed-checks.log``) instead of ``provision``.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from docker.models.containers import Container, ContainerCollection

from environments.docker import DockerProvider
from environments.interface import RecoverySpec


def main(argv: list[str]) -> None:
    state, image_cache, docker_host, run_id, op_id, workspace, spec_json, *mode = argv
    create, start = ContainerCollection.create, Container.start

    def create_then_die(self: ContainerCollection, *args: Any, **kwargs: Any) -> Any:
        create(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    def start_then_die(self: Container, *args: Any, **kwargs: Any) -> Any:
        start(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    if mode == ["checks-after-start"]:
        Container.start = start_then_die
    else:
        ContainerCollection.create = create_then_die
    provider = DockerProvider(Path(state), docker_host, image_cache_dir=Path(image_cache))
    spec = RecoverySpec.model_validate_json(spec_json)
    if mode:
        log = Path(state) / "killed-checks.log"
        provider.run_checks(
            spec, workspace, run_id=run_id, op_id=op_id, log_path=log, setup_timeout_s=60, test_timeout_s=120
        )
        raise SystemExit("run_checks returned although the process should have been killed")
    provider.provision(run_id=run_id, op_id=op_id, spec=spec, workspace=workspace)
    raise SystemExit("provision returned although the process should have been killed")


if __name__ == "__main__":
    main(sys.argv[1:])
