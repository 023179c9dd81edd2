"""The pinned mini-swe-agent, installed from PyPI once into a cache shared by every test that runs it.

The cache is ``~/.cache/durafix/tools`` (``DURAFIX_TEST_TOOLS_CACHE`` overrides it): building the environment
downloads a few hundred megabytes the first time, so it outlives one test session, as the Docker image cache
does. :func:`repair.mini_swe_agent.install` is idempotent, so a fresh machine builds it on the first test.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from repair.mini_swe_agent import InstallError, install
from tests.conftest import require


def tools_cache() -> Path:
    default = Path.home() / ".cache" / "durafix" / "tools"
    return Path(os.environ.get("DURAFIX_TEST_TOOLS_CACHE", default)).absolute()


@pytest.fixture(scope="session")
def mini_swe_agent() -> Path:
    """The virtual environment of mini-swe-agent (see :mod:`repair.mini_swe_agent`)."""
    require(shutil.which("bwrap") is not None, "bubblewrap is not installed (apt-get install bubblewrap)")
    try:
        return install(tools_cache())
    except InstallError as err:
        require(False, f"mini-swe-agent could not be installed: {err}")
        raise
