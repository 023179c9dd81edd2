"""The installed ``durafix`` console script, run as an operator runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

DURAFIX = Path(sys.executable).parent / "durafix"
"""The console script the project's install put next to this interpreter."""


def durafix(args: list[str], env: Mapping[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``durafix ARGS...`` in a child process with exactly ``env``, its output captured as text; a non-zero
    exit is returned, not raised, so a test can assert on it."""
    return subprocess.run(
        [str(DURAFIX), *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def run_durafix(state: Path, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """``durafix --state-dir STATE ARGS...`` in a child process; the state directory comes from the option only
    (``$DURAFIX_STATE_DIR`` is removed from its environment), so the option's handling is what is tested."""
    env = {k: v for k, v in os.environ.items() if k != "DURAFIX_STATE_DIR"}
    return durafix(["--state-dir", str(state), *args], env, timeout_s)
