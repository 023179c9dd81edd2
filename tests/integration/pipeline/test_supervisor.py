"""The worker supervisor with real child processes: spares that cannot start never stop a child that polls, a
crash loop with no child polling stops it (exit 1), and without a spare (``--no-spare``) one child runs at a time
and a killed one is replaced by a cold start."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.config import DurafixConfig
from pipeline.worker import supervisor
from pipeline.worker.supervisor import MAX_QUICK_DEATHS, Supervisor

# The first child comes up and polls until its stdin closes; the ones after it die at once, as a spare does
# that cannot reach Temporal from a host cut off the network. With FAIL_ALL every child dies at once.
CHILD = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    count = Path(sys.argv[1])
    with count.open("a") as f:
        f.write("x")
    if os.environ.get("FAIL_ALL") or len(count.read_text()) > 1:
        sys.exit(1)
    print("ready", flush=True)
    sys.stdin.readline()  # go
    sys.stdin.readline()  # the supervisor is gone or stops us
    """
)


# Every child comes up and polls until its stdin closes.
HEALTHY_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    with Path(sys.argv[1]).open("a") as f:
        f.write("x")
    print("ready", flush=True)
    sys.stdin.readline()  # go
    sys.stdin.readline()  # the supervisor is gone or stops us
    """
)


def supervisor_for(tmp_path: Path, child: str = CHILD, *, spare: bool = True) -> tuple[Supervisor, Path]:
    script = tmp_path / "child.py"
    script.write_text(child)
    count = tmp_path / "children"
    # Nothing listens on port 9: the supervisor's own Temporal client keeps retrying, which it must survive.
    config = DurafixConfig(state_dir=tmp_path / "state", temporal_address="127.0.0.1:9")
    return Supervisor(config, [sys.executable, str(script), str(count)], spare=spare), count


def started(count: Path) -> int:
    return len(count.read_text()) if count.exists() else 0


@pytest.mark.timeout(120)
async def test_spares_that_die_at_once_never_stop_the_child_that_polls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervisor, "MAX_BACKOFF_S", 0.5)  # keep the test short: the cap, not the rule
    sup, count = supervisor_for(tmp_path)
    running = asyncio.create_task(sup.run())
    try:
        async with asyncio.timeout(90):
            while len(count.read_text() if count.exists() else "") < MAX_QUICK_DEATHS + 3:
                assert not running.done(), "the supervisor stopped while a child was polling"
                await asyncio.sleep(0.1)
        assert sup.deaths.quick >= MAX_QUICK_DEATHS
        assert sup.active is not None and sup.active.polling and sup.active.proc.returncode is None
        assert not sup.gave_up
    finally:
        sup.stopping.set()
        assert await asyncio.wait_for(running, 60) == 0


@pytest.mark.timeout(120)
async def test_a_crash_loop_with_no_child_polling_stops_the_supervisor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervisor, "MAX_BACKOFF_S", 0.5)
    monkeypatch.setenv("FAIL_ALL", "1")
    sup, count = supervisor_for(tmp_path)
    assert await asyncio.wait_for(sup.run(), 90) == 1
    assert sup.gave_up
    assert len(count.read_text()) >= MAX_QUICK_DEATHS


@pytest.mark.timeout(120)
async def test_without_a_spare_one_child_runs_and_a_killed_one_is_replaced_by_a_cold_start(tmp_path: Path) -> None:
    sup, count = supervisor_for(tmp_path, HEALTHY_CHILD, spare=False)
    running = asyncio.create_task(sup.run())
    try:
        async with asyncio.timeout(60):
            while not (sup.active is not None and sup.active.polling):
                await asyncio.sleep(0.1)
        first = sup.active
        # With a spare, the second child starts as soon as the first is ready; without, none does.
        await asyncio.sleep(3)
        assert started(count) == 1 and sup.spare is None
        os.kill(first.pid, signal.SIGKILL)
        async with asyncio.timeout(60):
            while not (sup.active is not None and sup.active is not first and sup.active.polling):
                await asyncio.sleep(0.1)
        assert started(count) == 2 and sup.spare is None
        assert sup.active.proc.returncode is None and first.proc.returncode == -signal.SIGKILL
    finally:
        sup.stopping.set()
        assert await asyncio.wait_for(running, 60) == 0
