"""A browser crash during ``browser.reproduce`` is ``Infrastructure``: retryable, never a verdict on the bug."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from tests.support.proctree import descendant_pids, is_chromium_browser, wait_dead
from tests.support.recovery_workers import Remote, Worker

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_a_browser_killed_mid_reproduction_is_infrastructure_and_the_retry_reproduces(
    chromium: str, remote: Remote, new_worker: Callable[[str], Worker]
) -> None:
    worker = new_worker("host")
    _, inp = worker.provision_for_reproduction(remote)
    browsers_before = descendant_pids(is_chromium_browser)
    beats: list[object] = []
    killed: list[int] = []

    def kill_browser_before_second_step(*details: object) -> None:
        if not str(details[0]).startswith("step "):
            return  # a beat while a step runs, not a step's announcement
        beats.append(details)
        if len(beats) != 2:
            return
        ours = descendant_pids(is_chromium_browser) - browsers_before
        assert len(ours) == 1, f"expected the runner's one browser, found {sorted(ours)}"
        victim = ours.pop()
        os.kill(victim, signal.SIGKILL)
        wait_dead(victim)
        killed.append(victim)

    crashing = ActivityEnvironment()
    crashing.on_heartbeat = kill_browser_before_second_step
    with pytest.raises(ApplicationError) as raised:
        crashing.run(worker.browser.reproduce, inp)
    assert killed, "the browser was never killed"
    assert raised.value.type == "Infrastructure" and not raised.value.non_retryable
    assert "browser failed" in str(raised.value)

    retried = worker.run(worker.browser.reproduce, inp)
    assert retried.status == "reproduced" and retried.runs == 2
    assert worker.services.browser.launches == 2
    assert retried.trace_refs and retried.screenshot_refs and retried.log_ref is not None
