"""A command reproduction with ``app: true`` on the local provider, for real: the sample cart app provisioned in
bubblewrap, each run's script run by ``LocalProcessProvider.run_in`` in the app's own network namespace. It reads
what the app answers (the buggy total, then the fixed one); it reaches nothing else (a service the test listens
on at the worker's loopback gets no connection); its processes are stopped at the timeout and none outlives the
call; an environment that no longer runs is said to be gone, with nothing run."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from browser.results import ReproductionStatus
from environments.interface import EnvironmentGoneError, EnvironmentHandle, RecoverySpec
from environments.local import LocalProcessProvider
from environments.processes import is_live
from environments.sandbox import Sandbox
from environments.spec import load_recipe
from tests.support.cart_reproductions import CART_API_TOTAL, assert_only_the_app_is_reached, reproduce_beside_app
from tests.support.gitrepo import CART_APP
from tests.support.proctree import environ_pids
from tests.support.sandbox import sandbox

__all__ = ["sandbox"]

RUN = "repair:acme/cart#24"

# The cart's three lines: the right total counts quantities (4000 cents), the buggy one does not (2375).
TOTAL = CART_API_TOTAL


def tagged_pids(tag: str) -> set[int]:
    needle = f"DURAFIX_TEST_TAG={tag}".encode()
    return {pid for pid in environ_pids(lambda environ: needle in environ.split(b"\0")) if is_live(pid)}


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def provider(tmp_path: Path, tag: str, sandbox: Sandbox) -> Iterator[LocalProcessProvider]:
    prov = LocalProcessProvider(tmp_path / "state", stop_grace_s=2.0, sandbox=sandbox)
    yield prov
    assert prov.cleanup_run(RUN).complete
    assert tagged_pids(tag) == set(), "a test left processes behind"


def cart(tmp_path: Path, name: str, *, fixed: bool = False) -> Path:
    ws = tmp_path / name
    shutil.copytree(CART_APP, ws, ignore=shutil.ignore_patterns("__pycache__"))
    if fixed:
        source = (ws / "cart.py").read_text()
        (ws / "cart.py").write_text(
            source.replace("sum(item.unit_price_cents for item in items)", "sum(line_total(i) for i in items)")
        )
    return ws


def spec_for(tag: str) -> RecoverySpec:
    recipe = load_recipe(CART_APP).model_copy(update={"env": {"DURAFIX_TEST_TAG": tag}})
    return RecoverySpec(
        repository="acme/cart", clone_url="https://example.com/acme/cart.git", base_revision="3f" * 20, recipe=recipe
    )


def provisioned(
    provider: LocalProcessProvider, tag: str, ws: Path, op: str = "env-base"
) -> tuple[RecoverySpec, EnvironmentHandle]:
    """The cart in ``ws`` provisioned by ``provider`` for ``op``, and its spec."""
    spec = spec_for(tag)
    return spec, provider.provision(run_id=RUN, op_id=f"{RUN}:{op}:1", spec=spec, workspace=str(ws))


def test_the_commands_read_what_the_running_app_answers_buggy_then_fixed(
    provider: LocalProcessProvider, tmp_path: Path, tag: str
) -> None:
    buggy = cart(tmp_path, "buggy")
    spec, handle = provisioned(provider, tag, buggy)
    found = reproduce_beside_app(provider, handle, spec, buggy, TOTAL)
    assert found.status == ReproductionStatus.REPRODUCED, found.detail
    [check] = found.runs[0].checks
    assert check.holds and check.actual == "2375\n"
    assert found.runs[0].steps[0].exit_code == 0

    fixed = cart(tmp_path, "fixed", fixed=True)
    _, other = provisioned(provider, tag, fixed, "env-candidate")
    again = reproduce_beside_app(provider, other, spec, fixed, TOTAL)
    assert again.status == ReproductionStatus.NOT_REPRODUCED, again.detail
    assert again.runs[0].steps[0].stdout == "4000\n"
    # Each ran in its own environment's workspace, where its outputs are; the app kept running meanwhile.
    assert (buggy / ".durafix-repro" / "run-1" / "1.out").read_text() == "2375\n"
    assert (fixed / ".durafix-repro" / "run-1" / "1.out").read_text() == "4000\n"
    assert provider.check(handle).value == "ready"


def test_the_commands_reach_the_app_and_nothing_of_the_worker(
    provider: LocalProcessProvider, tmp_path: Path, tag: str
) -> None:
    ws = cart(tmp_path, "ws")
    spec, handle = provisioned(provider, tag, ws)
    # The app's own port answers in its namespace (the app is there); a service on the worker's loopback does not
    # exist there.
    assert_only_the_app_is_reached(provider, handle, spec, ws, int(handle.base_url.rsplit(":", 1)[1]), 30)


def test_a_command_is_stopped_at_its_timeout_and_nothing_of_it_outlives_the_call(
    provider: LocalProcessProvider, tmp_path: Path, tag: str
) -> None:
    ws = cart(tmp_path, "ws")
    spec, handle = provisioned(provider, tag, ws)
    app = tagged_pids(tag)
    result = provider.run_in(
        handle,
        spec,
        str(ws),
        "sleep 300 & (trap '' TERM; sleep 300) & sleep 300",
        log_path=tmp_path / "run.log",
        timeout_s=2,
    )
    assert result.timed_out and result.exit_code is None
    assert tagged_pids(tag) == app, "the command's processes outlived the call"
    assert all(is_live(pid) for pid in app)


def test_an_environment_that_no_longer_runs_is_gone_and_nothing_runs(
    provider: LocalProcessProvider, tmp_path: Path, tag: str
) -> None:
    ws = cart(tmp_path, "ws")
    spec, handle = provisioned(provider, tag, ws)
    elsewhere = cart(tmp_path, "elsewhere")
    with pytest.raises(EnvironmentGoneError, match="runs from"):
        provider.run_in(handle, spec, str(elsewhere), "touch ran", log_path=tmp_path / "a.log", timeout_s=10)
    provider.teardown(handle)
    with pytest.raises(EnvironmentGoneError, match="no longer runs"):
        provider.run_in(handle, spec, str(ws), "touch ran", log_path=tmp_path / "b.log", timeout_s=10)
    assert not (ws / "ran").exists() and not (elsewhere / "ran").exists()
