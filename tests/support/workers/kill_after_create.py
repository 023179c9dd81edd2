"""Child process for recovery tests: provision, and die by SIGKILL the instant the engine created the container.

``python -m tests.support.workers.kill_after_create STATE IMAGE_CACHE DOCKER_HOST RUN_ID OP_ID WORKSPACE
SPEC_JSON``

The hook lives here, not in the product: the container collection's ``create`` is wrapped so that the
process kills itself after the engine answered and before the provider records anything or starts the
container, the widest window in which a crash can leave an unrecorded resource behind.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from docker.models.containers import ContainerCollection

from environments.docker import DockerProvider
from environments.interface import RecoverySpec


def main(argv: list[str]) -> None:
    state, image_cache, docker_host, run_id, op_id, workspace, spec_json = argv
    create = ContainerCollection.create

    def create_then_die(self: ContainerCollection, *args: Any, **kwargs: Any) -> Any:
        create(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    ContainerCollection.create = create_then_die
    provider = DockerProvider(Path(state), docker_host, image_cache_dir=Path(image_cache))
    spec = RecoverySpec.model_validate_json(spec_json)
    provider.provision(run_id=run_id, op_id=op_id, spec=spec, workspace=workspace)
    raise SystemExit("provision returned although the process should have been killed")


if __name__ == "__main__":
    main(sys.argv[1:])
