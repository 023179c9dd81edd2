from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from browser.procedure import parse_procedure
from browser.results import BrowserInfraError, ReproductionStatus
from browser.runner import BrowserRunner
from tests.browser.apps import CART_DIR

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


def _is_chromium_browser(argv: list[str]) -> bool:
    return Path(argv[0]).name == "chromium" and not any(a.startswith("--type=") for a in argv)


def _is_playwright_driver(argv: list[str]) -> bool:
    return "run-driver" in argv


PROCESS_KINDS: dict[str, Callable[[list[str]], bool]] = {
    "browser": _is_chromium_browser,
    "driver": _is_playwright_driver,
}


def our_processes(kind: str) -> set[int]:
    """Processes of ``kind`` descended from this test process (never another process's browser)."""
    parents: dict[int, int] = {}
    commands: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
        commands[int(entry.name)] = argv

    def descends_from_us(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    matches = PROCESS_KINDS[kind]
    return {pid for pid, argv in commands.items() if argv and matches(argv) and descends_from_us(pid)}


def spawned_by_us() -> set[int]:
    return our_processes("browser") | our_processes("driver")


def wait_dead(pid: int, deadline_s: float = 10.0) -> None:
    """Until ``pid`` has exited (gone, or a zombie its parent has yet to reap)."""
    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still alive after SIGKILL")


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
