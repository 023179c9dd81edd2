"""Temporary folders the browser's user can pass through."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def passable_tmp(prefix: str) -> Iterator[Path]:
    """A fresh folder in the system's temporary directory, mode 0711, removed after the block: a worker's
    ``TMPDIR``, or where Playwright's drivers keep their folders, which Chromium's user (``nobody`` when the
    tests run as root) must pass through to reach its profile. Beside pytest's folders, not under them:
    pytest's base is 0700."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
