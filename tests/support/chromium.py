"""Chromium for the tests: the machine's Debian build, the kept :class:`BrowserRunner` a worker holds, and a
Playwright browser launched with the runner's arguments.

A folder whose tests need Chromium re-exports the fixtures in its ``conftest.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from playwright.sync_api import Browser, sync_playwright

from browser.executable import find_chromium, not_installed
from browser.runner import CHROMIUM_ARGS, BrowserRunner
from tests.conftest import unavailable


def chromium_path() -> str:
    """The Debian Chromium executable a worker launches (:func:`browser.executable.find_chromium`): skipped
    locally, failed under CI, when there is none."""
    path = find_chromium()
    if path is None:
        unavailable(f"{not_installed()}: the browser tests need it (apt-get install chromium-headless-shell)")
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
