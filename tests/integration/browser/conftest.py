from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from browser.runner import BrowserRunner
from tests.conftest import unavailable
from tests.support.browser_apps import PagesServer, fixed_cart_copy, serve_cart, serve_pages


@pytest.fixture(scope="session")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        unavailable("chromium is not installed: the browser tests need it (apt-get install chromium)")
    return path


@pytest.fixture(scope="module")
def runner(chromium: str) -> Iterator[BrowserRunner]:
    """One kept browser for the module, as a worker process keeps one."""
    with BrowserRunner(executable_path=chromium) as kept:
        yield kept


@pytest.fixture(scope="module")
def cart_url() -> Iterator[str]:
    with serve_cart() as url:
        yield url


@pytest.fixture(scope="module")
def fixed_cart_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    app_dir = fixed_cart_copy(tmp_path_factory.mktemp("fixed") / "cart")
    with serve_cart(app_dir) as url:
        yield url


@pytest.fixture(scope="module")
def pages() -> Iterator[PagesServer]:
    with serve_pages() as server:
        yield server


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    return tmp_path / "reproduction"
