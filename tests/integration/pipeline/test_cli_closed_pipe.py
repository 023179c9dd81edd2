"""The console script when its reader has gone (``durafix status ... | head``): no traceback, the exit code a
shell reports for a process its pipe's reader left, and what the command did is done."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_command_whose_reader_left_ends_quietly_with_sigpipes_code(tmp_path: Path) -> None:
    repo = tmp_path / "lib"
    repo.mkdir()
    (repo / "pyproject.toml").write_text('[project]\nname = "lib"\nversion = "0.1.0"\n')
    (repo / "lib.py").write_text("X = 1\n")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line is written
    try:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "durafix"), "--state-dir", str(tmp_path / "state"), "init", str(repo)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)

    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    # The command's work is not undone by having no one to tell: the recipe was written.
    assert (repo / "durafix.yaml").is_file()
