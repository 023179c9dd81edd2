"""The faults a soak injects: SIGKILL of a worker's activity process (a replacement started at once), and
SIGKILL of the Temporal dev server followed by a restart on the same SQLite file and port.

Both act only on processes this tool started or the stack recorded, identified by pid *and* start time
(:mod:`infra.processes`), so a recycled pid is never signalled. Every fault is recorded with its monotonic
and wall-clock time: the audit matches activity retries in the workflow histories against them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from environments.processes import live_processes, read_stat
from infra import processes, stack
from infra.processes import ServiceRecord

FaultKind = Literal["worker", "server"]
READY_LINE = "durafix worker polling"
"""What ``durafix worker`` prints once its pollers run (:func:`pipeline.worker.runner.run_worker`)."""
_POLLS = re.compile(r"worker process (\d+) polls")
"""What the supervisor logs when a child becomes the polling one (:mod:`pipeline.worker.supervisor`), in
a JSON line or a text one."""


@dataclass(frozen=True)
class Fault:
    """One injected fault: ``kind`` ``worker`` (``pid`` the killed activity process, ``replacement`` the worker
    started in its place, or None when a supervisor that survived replaces it) or ``server`` (``pid`` the
    killed dev server; ``down_s`` how long until the restarted one answered)."""

    kind: FaultKind
    at: datetime
    elapsed_s: float
    pid: int
    target: str
    replacement: int | None = None
    down_s: float | None = None


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _is_worker_command(argv: list[str]) -> bool:
    """``python -m pipeline ... worker ...`` or ``durafix ... worker ...``: a process of ``durafix worker``."""
    if "worker" not in argv:
        return False
    return any(part in ("pipeline", "durafix") or part.endswith("/durafix") for part in argv[: argv.index("worker")])


def activity_process(root: ServiceRecord) -> int | None:
    """The pid of the process that runs ``root``'s activities, None when ``root`` is gone.

    A supervised ``durafix worker`` runs its activities in a polling child and keeps a warm spare beside it,
    both ``durafix worker`` commands below the supervisor. The target is the child the supervisor last named as
    polling in its log (``worker process N polls``), when that child is alive below ``root``: killing the spare
    tests nothing. Without such a line, the oldest worker-command child of ``root``; without one, ``root``
    itself (an unsupervised worker runs its activities in its own process). Deeper descendants are never the
    target: a subprocess of the child (git, Chromium, a build) still carries the worker's command line between
    its fork and its exec, and killing it would fake a failure of the step instead of the death of a worker.
    """
    if not processes.is_alive(root):
        return None
    children = {stat.pid: stat for stat in live_processes() if stat.ppid == root.pid}
    named = _POLLS.findall(processes.log_tail(Path(root.log), 400))
    if named and int(named[-1]) in children:
        return int(named[-1])
    workers = sorted(
        (stat for stat in children.values() if _is_worker_command(_cmdline(stat.pid))), key=lambda s: s.start_time
    )
    return workers[0].pid if workers else root.pid


@dataclass
class WorkerPool:
    """The soak's ``durafix worker`` processes (all queues each), under one state directory.

    ``killed`` keeps every worker whose activity process was killed, so the audit can look for processes
    their sessions left behind.
    """

    state_dir: Path
    size: int
    env: dict[str, str] = field(default_factory=dict)
    live: list[ServiceRecord] = field(default_factory=list)
    killed: list[ServiceRecord] = field(default_factory=list)
    _spawned: int = 0
    _polling_since: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        while len(self.live) < self.size:
            self.spawn()

    def spawn(self) -> ServiceRecord:
        n = self._spawned
        self._spawned += 1
        rec = processes.spawn(
            f"worker-{n}",
            [sys.executable, "-m", "pipeline", "--state-dir", str(self.state_dir), "worker", "--queues", "all"],
            log=self.state_dir / "logs" / f"chaos-worker-{n}.log",
            port=0,
            url="",
            env=self.env,
        )
        self.live.append(rec)
        return rec

    def eligible(self, polled_for_s: float) -> list[ServiceRecord]:
        """The live workers that have been polling (their log says so) for at least ``polled_for_s``. A worker
        still importing and connecting runs no activity, so killing it would test nothing; and on a busy host,
        where starting a worker takes longer than the time between kills, workers killed as soon as they poll
        would never run an activity at all."""
        now = time.monotonic()
        for rec in self.live:
            if rec.name not in self._polling_since and READY_LINE in processes.log_tail(Path(rec.log), 200):
                self._polling_since[rec.name] = now
        since = self._polling_since
        return [rec for rec in self.live if rec.name in since and now - since[rec.name] >= polled_for_s]

    def kill(self, victim: ServiceRecord, elapsed_s: float) -> Fault | None:
        """SIGKILL ``victim``'s activity process; start a replacement at once unless a supervisor survives
        (then it is the supervisor's to replace). None when ``victim`` had already died."""
        pid = activity_process(victim)
        if pid is None:
            self.live.remove(victim)
            self.spawn()
            return None
        at = datetime.now(UTC)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        replacement: int | None = None
        if pid == victim.pid or not processes.is_alive(victim):
            self.live.remove(victim)
            self.killed.append(victim)
            replacement = self.spawn().pid
        return Fault("worker", at, elapsed_s, pid, victim.name, replacement=replacement)

    def stop(self) -> list[str]:
        """Stop every live worker (SIGTERM, then SIGKILL); the names that would not stop."""
        stuck = [rec.name for rec in self.live if not processes.stop(rec, grace_s=15)]
        self.live.clear()
        return stuck


def _write_stack(state_dir: Path, state: stack.StackState) -> None:
    """Replace ``stack.json`` atomically, as the stack writes it (mode 0600: it holds the admin token)."""
    path = state_dir / "stack.json"
    tmp = path.with_suffix(".chaos.tmp")
    tmp.write_text(state.model_dump_json(indent=2))
    tmp.chmod(0o600)
    tmp.replace(path)


async def _temporal_answers(address: str) -> bool:
    try:
        client = await Client.connect(address)
        await client.workflow_service.get_system_info(GetSystemInfoRequest(), timeout=timedelta(seconds=2))
    except Exception:  # not up yet: the caller polls again
        return False
    return True


async def restart_server(state_dir: Path, elapsed: Callable[[], float], ready_timeout_s: float = 60.0) -> Fault:
    """SIGKILL the stack's Temporal dev server and start it again with the same command line (same SQLite
    file, same ports); ``stack.json`` is updated to the new process so ``durafix dev down`` still stops it.
    Returns once the new server answers; :class:`infra.processes.ServiceError` if it does not within
    ``ready_timeout_s``."""
    state = stack.read_stack(state_dir)
    rec = state.services["temporal"]
    argv = _cmdline(rec.pid)
    if not argv or not processes.is_alive(rec):
        raise processes.ServiceError(f"the Temporal dev server (pid {rec.pid}) is not running")
    at, began = datetime.now(UTC), time.monotonic()
    elapsed_s = elapsed()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(rec.pid, signal.SIGKILL)
    # The dev server cannot open its SQLite file again while the old process lives.
    while processes.is_alive(rec):
        await asyncio.sleep(0.05)
    new = processes.spawn("temporal", argv, log=Path(rec.log), port=rec.port, url=rec.url, env={})
    new.extra = dict(rec.extra)
    state.services["temporal"] = new
    _write_stack(state_dir, state)
    deadline = time.monotonic() + ready_timeout_s
    while not await _temporal_answers(rec.url):
        if not processes.is_alive(new):
            raise processes.ServiceError(f"the restarted Temporal dev server died; log {rec.log}")
        if time.monotonic() > deadline:
            raise processes.ServiceError(f"the restarted Temporal dev server did not answer in {ready_timeout_s:.0f}s")
        await asyncio.sleep(0.2)
    return Fault("server", at, elapsed_s, rec.pid, "temporal", down_s=time.monotonic() - began)


def strays_of(killed: list[ServiceRecord]) -> list[int]:
    """Live processes left in the process groups of killed workers (each worker leads its own session):
    what a killed worker started and nobody stopped. A member must have started after its worker did, so a
    group ID the kernel has since reused for another process is not counted."""
    strays = []
    by_group = {rec.pid: rec.start_ticks for rec in killed}
    for stat in live_processes():
        started = by_group.get(stat.pgid)
        if started is not None and stat.start_time >= started and read_stat(stat.pid) is not None:
            strays.append(stat.pid)
    return sorted(strays)
