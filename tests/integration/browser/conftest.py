from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.browser_apps import PagesServer, fixed_cart_copy, serve_cart, serve_pages
from tests.support.chromium import chromium, runner

__all__ = ["cart_url", "chromium", "fixed_cart_url", "out_dir", "pages", "runner"]


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
