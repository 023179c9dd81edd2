from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from browser.procedure import parse_procedure
from browser.results import BrowserInfraError, ReproductionStatus
from browser.runner import BrowserRunner
from tests.support.browser_apps import CART_DIR
from tests.support.proctree import descendant_pids, is_chromium_browser, is_playwright_driver, wait_dead

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CART = parse_procedure((CART_DIR / "repro.yaml").read_text()).model_copy(update={"runs": 1})
# Waits long on a selector the cart never shows, so the browser dies while the step is in flight.
HANGING = parse_procedure(
    "version: 1\nname: hang\nsteps:\n"
    "  - {action: goto}\n"
    "  - {action: wait_for, selector: '#never', timeout_ms: 30000}\n"
    "bug_present:\n"
    "  - {action: expect_visible, selector: '#total'}\n"
)


PROCESS_KINDS: dict[str, Callable[[list[str]], bool]] = {
    "browser": is_chromium_browser,
    "driver": is_playwright_driver,
}


def our_processes(kind: str) -> set[int]:
    """Processes of ``kind`` descended from this test process (never another process's browser)."""
    return descendant_pids(PROCESS_KINDS[kind])


def spawned_by_us() -> set[int]:
    return our_processes("browser") | our_processes("driver")


@pytest.mark.parametrize("kind", ["browser", "driver"])
def test_killed_mid_run_raises_infra_error_and_next_run_relaunches(
    kind: str, chromium: str, cart_url: str, tmp_path: Path
) -> None:
    before = our_processes(kind)
    with BrowserRunner(executable_path=chromium) as runner:
        assert runner.run(CART, cart_url, tmp_path / "warm").status == ReproductionStatus.REPRODUCED
        ours = our_processes(kind) - before
        assert len(ours) == 1
        victim = ours.pop()
        orphan_candidates = spawned_by_us()

        def kill_during_step_2(index: int, _description: str) -> None:
            if index == 1:
                threading.Timer(0.5, os.kill, args=(victim, signal.SIGKILL)).start()

        with pytest.raises(BrowserInfraError) as raised:
            runner.run(HANGING, cart_url, tmp_path / "killed", on_step=kill_during_step_2)

        partial = raised.value.result
        assert partial is not None and partial.status == ReproductionStatus.INFRA_FAILURE
        assert "Timeout" not in str(raised.value)
        log = json.loads(partial.log_path.read_text())
        assert log["status"] == "infra_failure"
        assert any(e["kind"] == "browser_failed" for e in log["runs"][0]["events"])

        again = runner.run(CART, cart_url, tmp_path / "again")
        assert again.status == ReproductionStatus.REPRODUCED
        assert runner.launches == 2
        assert our_processes(kind) - before - {victim}
        spawned = spawned_by_us()
    # Nothing outlives the runner: not the relaunched browser, nor the one orphaned by a killed driver.
    for pid in spawned | orphan_candidates:
        wait_dead(pid)


@pytest.mark.parametrize("kind", ["browser", "driver"])
def test_killed_between_runs_costs_no_failed_run(kind: str, chromium: str, cart_url: str, tmp_path: Path) -> None:
    before = our_processes(kind)
    with BrowserRunner(executable_path=chromium) as runner:
        assert runner.run(CART, cart_url, tmp_path / "warm").status == ReproductionStatus.REPRODUCED
        (victim,) = our_processes(kind) - before
        orphan_candidates = spawned_by_us()
        os.kill(victim, signal.SIGKILL)
        wait_dead(victim)

        assert runner.run(CART, cart_url, tmp_path / "after").status == ReproductionStatus.REPRODUCED
        assert runner.launches == 2
        spawned = spawned_by_us() | orphan_candidates
    for pid in spawned:
        wait_dead(pid)
