"""The installed ``durafix`` console script, run as an operator runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_durafix(state: Path, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """``durafix --state-dir STATE ARGS...`` in a child process; the state directory comes from the option only
    (``$DURAFIX_STATE_DIR`` is removed from its environment), so the option's handling is what is tested."""
    env = {k: v for k, v in os.environ.items() if k != "DURAFIX_STATE_DIR"}
    durafix = Path(sys.executable).parent / "durafix"
    return subprocess.run(
        [str(durafix), "--state-dir", str(state), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
