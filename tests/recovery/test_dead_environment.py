"""An app killed behind the environment's back: ``browser.reproduce`` says ``EnvironmentGone``.

Never "not reproduced" and never "inconclusive": a dead app is no finding about the bug, so the workflow
must provision anew rather than record a verdict.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from environments.interface import EnvironmentHandle
from tests.support.proctree import wait_dead
from tests.support.recovery_workers import Remote, Worker, app_pid


def kill_app(handle: EnvironmentHandle) -> None:
    """SIGKILL the app's whole process group, as an OOM killer or an operator would, and wait for it."""
    os.killpg(int(handle.resources[0].detail["pgid"]), signal.SIGKILL)
    wait_dead(app_pid(handle))


def test_reproducing_on_an_app_killed_before_the_run_is_environment_gone(
    remote: Remote, new_worker: Callable[[str], Worker]
) -> None:
    worker = new_worker("host")
    handle, inp = worker.provision_for_reproduction(remote)
    kill_app(handle)

    with pytest.raises(ApplicationError) as raised:
        worker.run(worker.browser.reproduce, inp)
    assert raised.value.type == "EnvironmentGone" and raised.value.non_retryable
    assert handle.env_id in str(raised.value)
    assert worker.services.browser.launches == 0, "a dead app must not cost a browser run"


@pytest.mark.browser
@pytest.mark.slow
def test_an_app_killed_during_the_reproduction_is_environment_gone_not_a_verdict(
    chromium: str, remote: Remote, new_worker: Callable[[str], Worker]
) -> None:
    worker = new_worker("host")
    handle, inp = worker.provision_for_reproduction(remote)
    beats: list[object] = []

    def kill_before_second_step(*details: object) -> None:
        if not str(details[0]).startswith("step "):
            return  # a beat while a step runs, not a step's announcement
        beats.append(details)
        if len(beats) == 2:
            kill_app(handle)

    env = ActivityEnvironment()
    env.on_heartbeat = kill_before_second_step
    with pytest.raises(ApplicationError) as raised:
        env.run(worker.browser.reproduce, inp)
    assert raised.value.type == "EnvironmentGone" and raised.value.non_retryable
    assert "died during the reproduction" in str(raised.value)
    assert len(beats) >= 2
