"""Detached service processes with pid files: start, readiness wait, liveness, stop.

A service started here runs in its own session (so a Ctrl-C in the starting terminal does not reach it),
logs to a file, and is recorded with its pid and the process start time from ``/proc`` so that a recycled
pid is never mistaken for it (and never signalled). Process identity is :mod:`environments.processes`'s.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from environments.processes import is_running, read_stat


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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


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


def stop(record: ServiceRecord, grace_s: float = 10.0) -> bool:
    """SIGTERM the service's process group, SIGKILL after ``grace_s``; True when it is gone."""
    if not is_alive(record):
        return True
    try:
        os.killpg(record.pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not is_alive(record):
            return True
        time.sleep(0.1)
    try:
        os.killpg(record.pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not is_alive(record):
            return True
        time.sleep(0.05)
    return not is_alive(record)
