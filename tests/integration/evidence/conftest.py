"""Fixtures of this folder: the stores from :mod:`tests.support.evidence_stores`, and a Chromium to open
reports in."""

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser

from tests.support.chromium import launched
from tests.support.evidence_stores import case, moto_s3, s3_case, s3_server

__all__ = ["case", "chromium", "moto_s3", "s3_case", "s3_server"]


@pytest.fixture
def chromium() -> Iterator[Browser]:
    """A Playwright browser for one test, on the Debian Chromium (see :func:`launched`)."""
    with launched() as browser:
        yield browser
