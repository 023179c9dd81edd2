"""A worker process that stalls in ``env.verify_candidate`` with the patch half applied, to be SIGKILLed.

Usage: ``python -m tests.support.workers.interrupted_verify CONFIG_JSON INPUT_JSON READY_FILE``

Test-only: it wraps the workspace's ``git apply --index`` so that the real ``git apply`` stages only the
patch's last file, then writes the half-built tree's path to ``READY_FILE`` and sleeps until it is killed.
The tree on disk is then exactly what a worker dying part-way through applying the patch leaves behind.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from temporalio.testing import ActivityEnvironment

from environments import workspace
from environments.git import run_git as real_run_git
from pipeline.config import DurafixConfig
from pipeline.services import Services
from pipeline.steps import VerifyInput


def last_file_of(patch: str) -> str:
    """The last per-file section of a ``git diff``."""
    sections = [s for s in re.split(r"(?m)^(?=diff --git )", patch) if s.startswith("diff --git ")]
    if len(sections) < 2:
        raise SystemExit("the patch must touch at least two files to be applied half-way")
    return sections[-1]


def stall_half_way(ready_file: Path) -> None:
    def run_git(args: Sequence[str], **kwargs: Any) -> str:
        if list(args[:2]) == ["apply", "--index"] and "--check" not in args:
            real_run_git(args, cwd=kwargs["cwd"], stdin=last_file_of(kwargs["stdin"]))
            # Renamed into place, so the test never reads a half-written path.
            pending = ready_file.with_suffix(".tmp")
            pending.write_text(str(kwargs["cwd"]))
            pending.replace(ready_file)
            while True:
                time.sleep(60)
        return real_run_git(args, **kwargs)

    setattr(workspace, "run_git", run_git)  # noqa: B010 - replaces the module's binding, as a patch would


def main(argv: list[str]) -> None:
    config_json, input_json, ready_file = argv
    config = DurafixConfig.model_validate_json(Path(config_json).read_text())
    inp = VerifyInput.model_validate_json(Path(input_json).read_text())
    stall_half_way(Path(ready_file))
    ActivityEnvironment().run(Services(config).environment_activities().verify_candidate, inp)
    raise SystemExit("the activity finished although it should have stalled while applying the patch")


if __name__ == "__main__":
    main(sys.argv[1:])
