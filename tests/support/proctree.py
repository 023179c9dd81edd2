"""The live process tree from ``/proc``, for tests that kill real processes and then look for survivors.

Only descendants of a given process count, so a test never mistakes another test's (or the host's) Chromium
for its own. Zombies are left out: an exited process its parent has yet to reap holds no port or file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from browser.executable import CHROMIUM_EXECUTABLES
from environments.processes import is_running, read_stat


@dataclass(frozen=True)
class Proc:
    """A process as seen once: pid plus start time, so a recycled pid is never taken for it."""

    pid: int
    start_time: int
    argv: tuple[str, ...]

    def alive(self) -> bool:
        return is_running(self.pid, self.start_time)


def live_processes() -> dict[int, tuple[int, Proc]]:
    """Every live process: pid -> (parent pid, the process)."""
    table: dict[int, tuple[int, Proc]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = read_stat(int(entry.name))
        if stat is None or not stat.live:
            continue
        try:
            argv = tuple(a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a)
        except OSError:
            continue
        table[stat.pid] = (stat.ppid, Proc(pid=stat.pid, start_time=stat.start_time, argv=argv))
    return table


def descendants(root: int | None = None, matches: Callable[[list[str]], bool] | None = None) -> list[Proc]:
    """Live processes below ``root`` (default: this process) whose argv ``matches`` (default: all)."""
    top = os.getpid() if root is None else root
    table = live_processes()

    def below(pid: int) -> bool:
        while pid > 1 and pid in table:
            pid = table[pid][0]
            if pid == top:
                return True
        return False

    return [
        proc
        for pid, (_, proc) in table.items()
        if proc.argv and below(pid) and (matches is None or matches(list(proc.argv)))
    ]


def descendant_pids(matches: Callable[[list[str]], bool]) -> set[int]:
    """Pids of this process's live descendants whose argv ``matches``."""
    return {proc.pid for proc in descendants(matches=matches)}


def is_chromium(executable: str) -> bool:
    """Whether ``executable`` (a command line's first word) is one of the Chromium builds a worker launches."""
    return Path(executable).name in CHROMIUM_EXECUTABLES


def is_chromium_browser(argv: list[str]) -> bool:
    """The browser process itself, not one of its renderer, GPU or zygote helpers."""
    return is_chromium(argv[0]) and not any(a.startswith("--type=") for a in argv)


def is_playwright_driver(argv: list[str]) -> bool:
    return "run-driver" in argv


def wait_dead(pid: int, deadline_s: float = 10.0) -> None:
    """Until ``pid`` is gone or a zombie (it holds no port or file any more)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        stat = read_stat(pid)
        if stat is None or not stat.live:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still alive after SIGKILL")


def environ_pids(matches: Callable[[bytes], bool]) -> list[int]:
    """PIDs of the processes whose environment (``/proc/<pid>/environ``, NUL-separated) ``matches``; those that
    end or cannot be read while looked at are left out, zombies are not."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if matches(environ):
            found.append(int(entry.name))
    return found
