"""A process that runs one workspace's setup through a dependency cache, to be SIGKILLed half-way.

``python -m tests.support.workers.setup_child WORKSPACE CACHE_ROOT LOG MARKER REPOSITORY``
"""

from __future__ import annotations

import sys
from pathlib import Path

from environments.checks import SetupSettings, run_setup
from environments.depcache import DependencyCache
from environments.spec import load_recipe


def main(argv: list[str]) -> None:
    workspace, cache_root, log, marker, repository = argv
    ws = Path(workspace)
    run_setup(
        ws,
        load_recipe(ws),
        marker=marker,
        log_path=Path(log),
        timeout_s=300,
        settings=SetupSettings(cache=DependencyCache(Path(cache_root))),
        repository=repository,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
