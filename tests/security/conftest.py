"""Fixtures of the security tests that need Chromium."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from browser.runner import BrowserRunner
from tests.conftest import unavailable


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        unavailable("chromium is not installed: the browser security tests need it (apt-get install chromium)")
    return path


@pytest.fixture(scope="module")
def runner(chromium: str) -> Iterator[BrowserRunner]:
    """One kept browser for the module, as a worker process keeps one."""
    with BrowserRunner(executable_path=chromium) as kept:
        yield kept
