"""When a heartbeat block beats (pipeline/activities/heartbeat.py): a block without a carry first beats once it
has lasted its period, so a short step sends none; a block with a carry beats at its entry; a new sub-state is
beaten at once."""

from __future__ import annotations

import threading
import time
from typing import Any

from temporalio import activity
from temporalio.testing import ActivityEnvironment

from pipeline.activities.heartbeat import Heartbeat, heartbeating


def beats_of(fn: Any, *args: Any) -> list[Any]:
    """The heartbeat details ``fn`` sent, run as an activity (beats arrive from the block's helper thread)."""
    env = ActivityEnvironment()
    sent: list[Any] = []
    lock = threading.Lock()

    def on_heartbeat(*details: Any) -> None:
        with lock:
            sent.append(details[0] if details else None)

    env.on_heartbeat = on_heartbeat
    env.run(fn, *args)
    return sent


@activity.defn(name="test.short")
def short_step() -> str:
    return "done"


def test_a_short_step_wrapped_to_heartbeat_sends_no_beat() -> None:
    assert beats_of(heartbeating(short_step)) == []


def test_a_block_without_a_carry_first_beats_after_its_period() -> None:
    def step() -> None:
        with Heartbeat("working", every_s=0.2):
            time.sleep(0.5)

    sent = beats_of(step)
    assert 1 <= len(sent) <= 3
    assert all(isinstance(d, str) and d.startswith("working (") for d in sent)


def test_a_block_with_a_carry_beats_at_its_entry() -> None:
    def step() -> None:
        with Heartbeat("calling model", every_s=60, carry={"spent": {"total": 3}}):
            pass

    assert beats_of(step) == [{"detail": "calling model (0 s)", "spent": {"total": 3}}]


def test_a_new_sub_state_is_beaten_at_once() -> None:
    def step() -> None:
        with Heartbeat("starting", every_s=60) as beat:
            beat.set("setup: npm ci")

    assert beats_of(step) == ["setup: npm ci (0 s)"]
