"""A private Docker engine (``dockerd``) owned by one state directory.

Everything the engine keeps lives under ``STATE``: the API socket ``STATE/docker.sock``, the data root
``STATE/data`` (images, containers), the exec root ``STATE/exec`` (its managed containerd and runtime state),
the pid file ``STATE/dockerd.pid`` and the log ``STATE/dockerd.log``. So several engines can run side by side
on one host, and removing the state directory removes the engine's data.

The host firewall is never touched: the engine runs with ``--iptables=false --ip6tables=false`` and without the
default ``docker0`` bridge (``--bridge=none``). Containers therefore get no NAT to the outside and no published
ports; the environment provider reaches them on their own network addresses instead (see
``environments/docker/provider.py`` for what that isolates and what it does not).

Contracts:

- :meth:`DockerEngine.ensure_running` is idempotent: an engine already answering on the socket is reused,
  whoever started it; otherwise one is started and waited for. A start that fails raises
  :class:`EngineError` carrying the tail of ``dockerd``'s log.
- :meth:`DockerEngine.stop` signals only the process named in the pid file, and only after checking that its
  command line is a ``dockerd`` serving this state directory's socket, so a recycled pid is never signalled.
  ``dockerd`` stops its running containers and its containerd on the way down.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import docker
from docker.errors import DockerException
from requests.exceptions import RequestException

from environments.processes import is_live
from infra import processes

# containerd refuses socket paths longer than this (the portable sun_path size), dockerd the kernel's 107.
_MAX_SOCKET_PATH = 104
# The longest socket path the managed containerd creates under dockerd's exec root.
_CONTAINERD_SOCKET = "containerd/containerd-debug.sock"


class EngineError(RuntimeError):
    """The engine could not be started or stopped; the message carries the reason (and log tail)."""


def storage_driver(filesystems: Path = Path("/proc/filesystems")) -> str:
    """``overlay2`` when the kernel offers overlayfs, else ``vfs`` (a full copy per layer: slow, but works)."""
    try:
        names = {line.split()[-1] for line in filesystems.read_text().splitlines() if line.strip()}
    except OSError:
        return "vfs"
    return "overlay2" if "overlay" in names else "vfs"


class DockerEngine:
    """The ``dockerd`` serving ``unix://STATE/docker.sock``."""

    def __init__(self, state_dir: Path, *, start_timeout_s: float = 60.0) -> None:
        self.state_dir = state_dir.absolute()
        self.start_timeout_s = start_timeout_s
        self.started_here = False

    @property
    def socket_path(self) -> Path:
        return self.state_dir / "docker.sock"

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def pid_file(self) -> Path:
        return self.state_dir / "dockerd.pid"

    @property
    def log_file(self) -> Path:
        return self.state_dir / "dockerd.log"

    def is_running(self) -> bool:
        """True when an engine answers a ping on this state directory's socket."""
        if not self.socket_path.exists():
            return False
        try:
            client = docker.DockerClient(base_url=self.docker_host, timeout=5)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except (DockerException, RequestException, OSError):
            return False

    def ensure_running(self) -> str:
        """Reuse or start the engine; return its ``DOCKER_HOST``. Sets :attr:`started_here` when started."""
        if self.is_running():
            return self.docker_host
        self._check_paths()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        driver = storage_driver()
        argv = [
            "dockerd",
            f"--host={self.docker_host}",
            f"--data-root={self.state_dir / 'data'}",
            f"--exec-root={self.state_dir / 'exec'}",
            f"--pidfile={self.pid_file}",
            f"--storage-driver={driver}",
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
        ]
        try:
            record = processes.spawn("dockerd", argv, log=self.log_file, port=0, url=self.docker_host)
        except FileNotFoundError as exc:
            raise EngineError("dockerd is not installed (Debian package docker.io)") from exc
        except processes.ServiceError as exc:
            raise EngineError(str(exc)) from exc
        try:
            processes.wait_ready(record, self.is_running, self.start_timeout_s)
        except processes.ServiceError as exc:
            # The pid file may not be written yet: the spawned process is known to be ours by its start time.
            self._shut_down(grace_s=10.0, engine=record.pid if processes.is_alive(record) else None)
            raise EngineError(f"dockerd (storage driver {driver}) did not start: {exc}") from exc
        self.started_here = True
        return self.docker_host

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop this state directory's engine (SIGTERM, SIGKILL after ``timeout_s``); idempotent.

        Also cleans up after an engine that died without shutting down: its managed containerd (which
        outlives a killed ``dockerd``) is stopped and mounts left under the state directory are released.
        Containers that were running when the engine died are stopped by the next start (the engine runs
        without live-restore), so after a crash ``ensure_running()`` then ``stop()`` leaves nothing running.
        """
        self._shut_down(grace_s=timeout_s)

    def _shut_down(self, *, grace_s: float, engine: int | None = None) -> None:
        """Stop ``engine`` (default: the pid file's dockerd), an orphaned containerd, and release mounts."""
        engine = engine or _owned_pid(self.pid_file, b"dockerd", str(self.socket_path))
        if engine is not None:
            _terminate(engine, grace_s=grace_s)
        exec_root = self.state_dir / "exec"
        config = exec_root / "containerd" / "containerd.toml"
        containerd = _owned_pid(exec_root / "containerd" / "containerd.pid", b"containerd", str(config))
        if containerd is not None:
            _terminate(containerd, grace_s=grace_s)
        if not self.is_running():
            _release_mounts(self.state_dir)

    def _check_paths(self) -> None:
        for path in (self.socket_path, self.state_dir / "exec" / _CONTAINERD_SOCKET):
            if len(str(path)) > _MAX_SOCKET_PATH:
                raise EngineError(f"state directory too deep: socket path {path} exceeds {_MAX_SOCKET_PATH} bytes")


def _owned_pid(pid_file: Path, program: bytes, argument: str) -> int | None:
    """The pid in ``pid_file`` if that live process is ``program`` run with ``argument``; else ``None``.

    The command-line check is what keeps a recycled pid from ever being signalled.
    """
    try:
        pid = int(pid_file.read_text().strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None
    if not is_live(pid) or not argv[0].endswith(program):
        return None
    return pid if any(argument.encode() in arg for arg in argv[1:]) else None


def _terminate(pid: int, *, grace_s: float) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; raise if the process still lives after that."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if _wait_gone(pid, grace_s):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not _wait_gone(pid, 10.0):
        raise EngineError(f"process {pid} survived SIGKILL")


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_live(pid):
            return True
        time.sleep(0.1)
    return not is_live(pid)


def _release_mounts(root: Path, timeout_s: float = 10.0) -> None:
    """Unmount everything at or under ``root``; raise ``EngineError`` if something stays mounted.

    Retries while busy: a process killed a moment ago may still be closing files under the data root.
    """
    deadline = time.monotonic() + timeout_s
    errors: list[str] = []
    while mounts := _mounts_under(root):
        if time.monotonic() >= deadline:
            raise EngineError(f"still mounted under {root}: {[str(m) for m in mounts]}: {'; '.join(errors)}")
        errors = []
        # Deepest first, so that a mount inside another one is released before it.
        for mount_point in sorted(mounts, key=lambda p: len(p.parts), reverse=True):
            result = subprocess.run(["umount", str(mount_point)], capture_output=True, text=True, check=False)
            if result.returncode != 0:
                errors.append(result.stderr.strip())
        if errors:
            time.sleep(0.2)


def _mounts_under(root: Path) -> list[Path]:
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # Field 5 is the mount point, with spaces and backslashes octal-escaped.
        point = Path(line.split()[4].encode().decode("unicode_escape"))
        if point == root or root in point.parents:
            mounts.append(point)
    return mounts


def main(argv: list[str] | None = None) -> None:
    """``python -m infra.docker.engine start|stop STATE``: start prints the ``DOCKER_HOST`` to export."""
    parser = argparse.ArgumentParser(prog="python -m infra.docker.engine")
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("state_dir", type=Path)
    args = parser.parse_args(argv)
    engine = DockerEngine(args.state_dir)
    if args.action == "start":
        print(engine.ensure_running())
    elif args.action == "stop":
        engine.stop()
    else:
        print(f"{engine.docker_host} {'running' if engine.is_running() else 'stopped'}")


if __name__ == "__main__":
    main()
