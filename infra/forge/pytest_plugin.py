"""pytest fixtures for a forge: enable with ``pytest_plugins = ["infra.forge.pytest_plugin"]`` in a conftest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .testing import ForgeHandle, running_forge


@pytest.fixture
def forge(tmp_path: Path) -> Iterator[ForgeHandle]:
    """A fresh forge per test, its data under the test's tmp dir, stopped at teardown."""
    with running_forge(tmp_path / "forge") as handle:
        yield handle
