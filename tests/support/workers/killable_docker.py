"""A ``durafix worker`` that SIGKILLs itself right after the Docker engine created an operation's container.

Test-only: it wraps ``DockerProvider._create`` so that, the first time it returns for an operation, the
process dies before the provider starts the container, probes it or reports anything back: the engine holds
a created container nobody recorded, and ``env.provision`` never completed. One marker file per operation in
``DURAFIX_TEST_KILL_DIR`` (holding the op ID) makes each kill happen once across successive worker processes.
"""

from __future__ import annotations

import functools
import os
import signal
from pathlib import Path
from typing import Any

from environments.docker.provider import DockerProvider
from environments.files import path_key
from environments.interface import AppRecipe


def install(marker_dir: Path) -> None:
    marker_dir.mkdir(parents=True, exist_ok=True)
    create = DockerProvider._create

    @functools.wraps(create)
    def create_then_die(
        self: DockerProvider, name: str, image: str, network: str, run_id: str, op_id: str, recipe: AppRecipe
    ) -> Any:
        container = create(self, name, image, network, run_id, op_id, recipe)
        marker = marker_dir / path_key(op_id)
        if not marker.exists():
            marker.write_text(op_id)
            os.kill(os.getpid(), signal.SIGKILL)
        return container

    DockerProvider._create = create_then_die  # type: ignore[method-assign]


if __name__ == "__main__":
    install(Path(os.environ["DURAFIX_TEST_KILL_DIR"]))
    from pipeline.cli import main

    main()
