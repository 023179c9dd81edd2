"""The soak's kill target and its stray-process check, on real process trees (no durafix worker needed: the
rule reads command lines, so processes named like ``python -m pipeline worker`` stand in for workers)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from environments.processes import is_live
from infra import processes
from infra.chaos.faults import Fault, WorkerPool, activity_process, strays_of
from infra.chaos.report import summary_lines
from infra.chaos.soak import Soak, SoakPlan, SoakResult
from tests.support.proctree import wait_dead

SLEEP = "import time; time.sleep(60)"


def _spawn(tmp_path: Path, code: str, *args: str) -> processes.ServiceRecord:
    # `-c CODE pipeline worker`: the trailing words are the command line the rule looks for.
    return processes.spawn("w", [sys.executable, "-c", code, *args], log=tmp_path / "w.log", port=0, url="")


def _children_of(pid: int, count: int = 1) -> list[int]:
    """The children of ``pid``, once there are ``count`` of them (or after 10 s)."""
    found: list[int] = []
    deadline = time.monotonic() + 10
    while len(found) < count and time.monotonic() < deadline:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[1]) == pid:
                    found.append(int(entry.name))
        time.sleep(0.05)
    return found


def test_a_worker_that_runs_its_own_activities_is_the_target(tmp_path: Path) -> None:
    worker = _spawn(tmp_path, SLEEP, "pipeline", "worker")
    try:
        assert activity_process(worker) == worker.pid
    finally:
        processes.stop(worker)
    assert activity_process(worker) is None


def test_a_supervised_worker_child_is_the_target_not_the_supervisor_or_an_app(tmp_path: Path) -> None:
    # The supervisor starts an app process (no worker command line) and then the worker child.
    supervisor_code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {SLEEP!r}, 'app'])\n"
        "time.sleep(0.3)\n"
        f"subprocess.Popen([sys.executable, '-c', {SLEEP!r}, 'pipeline', 'worker'])\n"
        "time.sleep(60)\n"
    )
    supervisor = _spawn(tmp_path, supervisor_code, "pipeline", "worker")
    try:
        _children_of(supervisor.pid, 2)
        target = activity_process(supervisor)
        assert target != supervisor.pid
        assert target is not None
        argv = Path(f"/proc/{target}/cmdline").read_bytes().split(b"\0")
        assert argv[-3:] == [b"pipeline", b"worker", b""]
    finally:
        os.killpg(supervisor.pid, signal.SIGKILL)


def test_the_polling_child_the_supervisor_named_is_the_target_not_its_spare_or_a_forked_subprocess(
    tmp_path: Path,
) -> None:
    """A supervisor with two worker children (the polling one and a warm spare, started after it) names the
    polling one in its log. The polling child has a subprocess still carrying the worker's command line (as
    between a fork and its exec): the target is the named child, never the spare nor that subprocess. Once the
    log names the spare (promoted), it is the target."""
    child_code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {SLEEP!r}, 'pipeline', 'worker'])\n"
        "time.sleep(60)\n"
    )
    supervisor_code = (
        "import subprocess, sys, time\n"
        f"polling = subprocess.Popen([sys.executable, '-c', {child_code!r}, 'pipeline', 'worker'])\n"
        "time.sleep(0.3)\n"
        f"spare = subprocess.Popen([sys.executable, '-c', {SLEEP!r}, 'pipeline', 'worker'])\n"
        "print(f'durafix worker: worker process {polling.pid} polls', file=sys.stderr, flush=True)\n"
        "time.sleep(60)\n"
    )
    supervisor = _spawn(tmp_path, supervisor_code, "pipeline", "worker")
    try:
        polling, spare = sorted(_children_of(supervisor.pid, 2))
        forked = _children_of(polling)
        assert len(forked) == 1
        deadline = time.monotonic() + 10
        while "polls" not in Path(supervisor.log).read_text() and time.monotonic() < deadline:
            time.sleep(0.05)

        assert activity_process(supervisor) == polling
        with Path(supervisor.log).open("a") as log:
            log.write(f"durafix worker: polling worker process {polling} died (killed by SIGKILL)\n")
            log.write(f"durafix worker: worker process {spare} polls\n")
        assert activity_process(supervisor) == spare
    finally:
        os.killpg(supervisor.pid, signal.SIGKILL)


def test_what_a_killed_worker_left_in_its_group_is_a_stray_until_it_ends(tmp_path: Path) -> None:
    worker = _spawn(
        tmp_path, f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {SLEEP!r}])\ntime.sleep(60)\n"
    )
    children = _children_of(worker.pid)
    assert len(children) == 1
    os.kill(worker.pid, signal.SIGKILL)
    wait_dead(worker.pid)  # SIGKILL is delivered, not done: on a busy host the worker is live a moment longer
    try:
        assert strays_of([worker]) == children
    finally:
        os.kill(children[0], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while is_live(children[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert strays_of([worker]) == []


class _CountingPool(WorkerPool):
    """A pool whose one worker is always polling and whose kills are only recorded (the window is under test)."""

    def eligible(self, polled_for_s: float) -> list[processes.ServiceRecord]:
        return [processes.ServiceRecord(name="worker-0", pid=os.getpid(), start_ticks=0, port=0, url="", log="")]

    def kill(self, victim: processes.ServiceRecord, elapsed_s: float) -> Fault | None:
        return Fault("worker", datetime.now(UTC), elapsed_s, victim.pid, victim.name)


async def test_faults_stop_when_the_window_closes_and_the_stop_is_recorded(tmp_path: Path) -> None:
    plan = SoakPlan(
        runs=1,
        workers=1,
        kill_every=(0.02, 0.05),
        server_kills=0,
        seed=7,
        state_dir=tmp_path,
        deadline_s=60,
        concurrency=1,
        faults_for_s=0.5,
    )
    soak = Soak(plan, lambda _msg: None)
    # The fault loop returns on its own once the window has closed: a loop that never stops fails here.
    await asyncio.wait_for(soak._chaos(_CountingPool(tmp_path, 1)), 10)
    stopped = soak.faults_stopped_s
    assert stopped is not None and stopped >= 0.5
    assert len(soak.faults) >= 5, soak.faults
    assert all(f.elapsed_s <= stopped for f in soak.faults)
    assert "for the first 0.5s" in summary_lines(SoakResult(plan, [], soak.faults, [], stopped, [], 0, stopped))[0]
