"""A ``durafix worker`` that SIGKILLs itself right after the forge accepted a mutation.

Test-only: it wraps the named ``GitHubForge`` methods so that, the first time each returns (the forge has
applied the mutation, the activity has not completed), the process dies with SIGKILL. One marker file per
operation in ``DURAFIX_TEST_KILL_DIR`` makes each kill happen once across successive worker processes.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reviews.adapter import GitHubForge


def _dying_after(name: str, original: Callable[..., Any], marker_dir: Path) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: GitHubForge, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        marker = marker_dir / name
        if not marker.exists():
            marker.write_text(repr(result))
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    return wrapper


def install() -> None:
    marker_dir = Path(os.environ["DURAFIX_TEST_KILL_DIR"])
    marker_dir.mkdir(parents=True, exist_ok=True)
    for name in os.environ["DURAFIX_TEST_KILL_AFTER"].split(","):
        setattr(GitHubForge, name, _dying_after(name, getattr(GitHubForge, name), marker_dir))


if __name__ == "__main__":
    install()
    from pipeline.cli import main

    main()
