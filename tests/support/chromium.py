"""Chromium for the tests: the machine's Debian build, the kept :class:`BrowserRunner` a worker holds, and a
Playwright browser launched with the runner's arguments.

A folder whose tests need Chromium re-exports the fixtures in its ``conftest.py``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from playwright.sync_api import Browser, sync_playwright

from browser.runner import CHROMIUM_ARGS, BrowserRunner
from tests.conftest import unavailable


def chromium_path() -> str:
    """The Debian Chromium's executable: skipped locally, failed under CI, when it is not installed."""
    path = shutil.which("chromium")
    if path is None:
        unavailable("chromium is not installed: the browser tests need it (apt-get install chromium)")
    return path


@contextmanager
def launched() -> Iterator[Browser]:
    """A Playwright browser on the Debian Chromium with the runner's arguments, closed on exit."""
    executable = chromium_path()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="session")
def chromium() -> str:
    return chromium_path()


@pytest.fixture(scope="module")
def runner(chromium: str) -> Iterator[BrowserRunner]:
    """One kept browser for the module, as a worker process keeps one."""
    with BrowserRunner(executable_path=chromium) as kept:
        yield kept
