"""Finding and stopping the processes a run owns, from ``/proc`` (Linux).

Identity: a pid alone can be reused, so a process is "the one we started" only when its start time (field 22
of ``/proc/<pid>/stat``, clock ticks since boot) equals the recorded one. Every process a provider starts
also carries an ownership marker in its environment (``DURAFIX_OWNER=<run-key>/<op-key>``), inherited by
all its descendants; that finds processes that left the process group or were started in the instant
before their record was written, and it is how a reused group ID is told apart from ours.

Stopping: SIGTERM to the owned group and every marked process, a grace period, then SIGKILL, then a check
that none is left. Zombies count as gone (they hold no resources and their parent reaps them).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

MARKER_VAR = "DURAFIX_OWNER"

_PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    pgid: int
    start_time: int

    @property
    def live(self) -> bool:
        return self.state not in ("Z", "X")


def read_stat(pid: int) -> ProcStat | None:
    """The process's state, parent, group and start time; ``None`` if there is no such process."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses; fields resume after the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    return ProcStat(pid=pid, state=fields[0], ppid=int(fields[1]), pgid=int(fields[2]), start_time=int(fields[19]))


def start_time(pid: int) -> int:
    """Start time of a process known to exist (a child just spawned)."""
    stat = read_stat(pid)
    if stat is None:
        raise ProcessLookupError(pid)
    return stat.start_time


def is_live(pid: int) -> bool:
    """Whether some live process (not a zombie) has ``pid`` now, whichever process that is."""
    stat = read_stat(pid)
    return stat is not None and stat.live


def is_running(pid: int, recorded_start_time: int) -> bool:
    """Whether ``pid`` is still the live process that started at ``recorded_start_time``."""
    stat = read_stat(pid)
    return stat is not None and stat.live and stat.start_time == recorded_start_time


def marker_of(pid: int) -> str | None:
    """The ownership marker in the process's (initial) environment, if readable and present."""
    try:
        environ = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    prefix = f"{MARKER_VAR}=".encode()
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


def live_processes() -> list[ProcStat]:
    stats = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            stat = read_stat(int(entry.name))
            if stat is not None and stat.live:
                stats.append(stat)
    return stats


def owned_pids(
    marker: str, *, prefix: bool = False, pgid: int | None = None, leader_start: int | None = None
) -> set[int]:
    """Live processes owned under ``marker`` (or any marker starting with it when ``prefix``).

    With ``pgid``, the whole group also counts as owned when its leader is the recorded process
    (``leader_start``) or any member carries the marker: members that scrubbed their environment are still
    ours, while a group ID the kernel reused for someone else's process is not.
    """

    def matches(pid: int) -> bool:
        found = marker_of(pid)
        return found is not None and (found.startswith(marker) if prefix else found == marker)

    stats = live_processes()
    owned = {s.pid for s in stats if matches(s.pid)}
    if pgid is not None:
        members = [s for s in stats if s.pgid == pgid]
        leader_ours = leader_start is not None and any(s.pid == pgid and s.start_time == leader_start for s in members)
        if leader_ours or any(s.pid in owned for s in members):
            owned.update(s.pid for s in members)
    return owned


@dataclass(frozen=True)
class StopOutcome:
    """What :func:`stop_owned` found owned (``stopped``) and what was still alive at the end (``survivors``)."""

    stopped: frozenset[int]
    survivors: frozenset[int]


def stop_owned(
    marker: str,
    *,
    prefix: bool = False,
    pgid: int | None = None,
    leader_start: int | None = None,
    grace_s: float = 5.0,
    kill_wait_s: float = 5.0,
) -> StopOutcome:
    """SIGTERM the owned processes, SIGKILL what outlives ``grace_s``, then list what is still alive."""
    seen: set[int] = set()
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        targets = owned_pids(marker, prefix=prefix, pgid=pgid, leader_start=leader_start)
        if not targets:
            break
        seen |= targets
        if pgid is not None and any(_group_of(pid) == pgid for pid in targets):
            # One signal to the group reaches members forked after the listing above.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(is_live(pid) for pid in targets):
            time.sleep(0.05)
    survivors = owned_pids(marker, prefix=prefix, pgid=pgid, leader_start=leader_start)
    return StopOutcome(stopped=frozenset(seen - survivors), survivors=frozenset(survivors))


def _group_of(pid: int) -> int | None:
    stat = read_stat(pid)
    return stat.pgid if stat is not None else None
