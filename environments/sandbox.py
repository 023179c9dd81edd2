"""The sandbox every untrusted command of the local provider runs in: bubblewrap (``/usr/bin/bwrap``).

Untrusted means anything a repository or the model wrote: the recipe's setup, start, fixtures and tests, and
whatever they run. Each such command runs as ``bwrap ... /bin/sh -c COMMAND`` with:

- new user, PID, IPC, UTS and cgroup namespaces (``--unshare-user --unshare-pid ...``), and a new network
  namespace with only loopback (:class:`Network`; a setup with the network gets the egress proxy's socket in
  it besides, :class:`Egress`), except where a launcher already entered one; no capabilities (``--cap-drop
  ALL``: bwrap would keep them inside its user namespace for a worker running as root);
- a file system built from nothing: ``/usr`` and the merged-usr links read-only; a curated ``/etc``
  (:mod:`environments.sandbox_etc`): a read-only tmpfs holding only the entries of ``CURATED_ETC`` a
  toolchain reads (resolver files, CA certificates, the dynamic linker's cache, alternatives, the time zone,
  Python's, pip's, npm's and the JDK's settings, ...), each bound read-only from the host where it exists,
  and ``passwd``/``group`` stubs the worker writes (root, nobody and the worker's own ids). The sandbox keeps
  the worker's real uid, so only not mounting protects the rest of the host's ``/etc`` (``shadow-``,
  ``ssl/private``, SSH host keys, an operator's keys under ``/etc/durafix/``). Then a private ``/proc`` of the
  new PID namespace, a minimal ``/dev``, and private tmpfs mounts on ``/tmp``, ``/var/tmp``, ``/run``,
  ``/home`` and ``/root`` (so ``HOME`` is an empty writable directory); the workspace read-write at
  :data:`WORKSPACE` (``/workspace``), the same path for every workspace of every run, and the few directories
  a step must write besides it (setup's package caches, at their own paths). The fixed path is what lets the
  dependency cache (:mod:`environments.depcache`) put what one workspace's setup built into another unchanged:
  the absolute paths setup records (a ``.venv``'s shebangs and ``pyvenv.cfg``, ``.pth`` files and editable
  installs' finders, ``node_modules/.bin`` links) name ``/workspace`` and hold in every workspace, so nothing is
  rewritten and no workspace's files ever name another's. Nothing else of the host exists inside: not the
  state directory (``config.json``, tokens, other runs' workspaces), not the Docker socket, not the worker's
  home or its virtual environment, not ``/sys``. :meth:`Sandbox.visible` lists what every command can read and
  :meth:`Sandbox.exposes` says whether a host path is among it: ``durafix worker`` refuses to start when a
  secret file it is configured with is (``pipeline/worker/sandbox_exposure.py``);
- ``--die-with-parent`` and the PID namespace: when the step's first process ends (or bwrap is killed), the
  namespace's init dies and the kernel kills every process left in it, so nothing a step starts survives it;
- the caller's process group (its own session, without a terminal, so there is none to inject input into) and
  exactly the environment the caller built (:func:`environments.commands.command_env`): bwrap passes its own
  environment to the command.

A machine without a working bubblewrap refuses to build a :class:`Sandbox` (:class:`SandboxUnavailableError`)
unless the operator asked for ``unsandboxed`` explicitly; then commands run as plain host processes, and
:attr:`Sandbox.kind` says ``unsandboxed`` wherever a run reports how it ran.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from environments import egress
from environments.interface import EnvironmentError
from environments.sandbox_etc import REMOUNT_ETC, account_stubs, etc_args, etc_sources

BWRAP = "/usr/bin/bwrap"
# Where every sandboxed command sees its workspace (see the module): never a path of the worker's, so nothing a
# command writes or prints names the workspace's host path, and what setup built is valid in every workspace.
WORKSPACE = "/workspace"
SANDBOXED = "bubblewrap"
UNSANDBOXED = "unsandboxed"

# Read-only system trees: what programs and libraries need. ``/etc`` is curated (environments/sandbox_etc.py).
_SYSTEM_DIRS = ("/usr",)
# Top-level names that are merged-usr links on Debian (``/bin -> usr/bin``); recreated as links, or bound
# read-only where a system keeps them as directories.
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_PRIVATE_TMPFS = ("/tmp", "/var/tmp", "/run", "/home", "/root")
# Mounted inside whatever the host has there: a link in the curated /etc pointing into them is kept as a link.
_PRIVATE_MOUNTS = ("/proc", "/dev")


class SandboxUnavailableError(EnvironmentError):
    """bubblewrap is missing or cannot create namespaces here, and running unsandboxed was not asked for."""


class Network(StrEnum):
    """What a sandboxed step may reach over the network.

    ``NONE``: a network namespace of its own with only loopback (tests, setup unless the recipe asks for the
    network). ``HOST``: the network namespace the sandbox is started in, unchanged: only for a launcher that
    has already entered another namespace (fixtures, which ``nsenter`` the app's own). Setup with
    ``setup_network: true`` gets neither: it gets :class:`Egress`.
    """

    NONE = "none"
    HOST = "host"


@dataclass(frozen=True)
class Egress:
    """A network namespace of its own with only loopback, plus the egress proxy's unix socket ``socket`` (on the
    worker) bound in at :data:`environments.egress.INSIDE_SOCKET`, a bridge to it on the sandbox's
    ``127.0.0.1`` and the proxy variables pointing there (see :mod:`environments.egress`): setup with
    ``setup_network: true`` reaches what that proxy allows, the package registries, and nothing else."""

    socket: Path


@dataclass(frozen=True)
class Sandbox:
    """How this worker runs untrusted commands: inside bubblewrap (``kind == 'bubblewrap'``) or, only when the
    operator asked for it, as plain processes (``'unsandboxed'``). Build one with :meth:`detect`."""

    kind: str = SANDBOXED
    bwrap: str = BWRAP
    # Extra read-only paths (an operator's toolchain outside the system directories, e.g. /usr/local is
    # already under /usr); never the state directory.
    read_only: tuple[Path, ...] = field(default=())

    @classmethod
    def detect(cls, *, unsandboxed: bool = False, bwrap: str = BWRAP) -> Sandbox:
        """A bubblewrap sandbox if ``bwrap`` works here; else an unsandboxed one when ``unsandboxed`` (the
        operator's explicit flag), else :class:`SandboxUnavailableError` saying why."""
        problem = bwrap_problem(bwrap)
        if problem is None:
            return cls(kind=SANDBOXED, bwrap=bwrap)
        if unsandboxed:
            return cls(kind=UNSANDBOXED, bwrap=bwrap)
        raise SandboxUnavailableError(
            f"the local provider runs untrusted commands in bubblewrap, which is unusable here ({problem}); "
            "install the Debian package bubblewrap, or set DURAFIX_UNSANDBOXED=1 to run them as plain host "
            "processes (every run's ticket then says so)"
        )

    @property
    def sandboxed(self) -> bool:
        return self.kind == SANDBOXED

    def visible(self) -> list[Path]:
        """The host paths (resolved) whose content every command in this sandbox can read, whatever its
        workspace: the system directories, the curated ``/etc`` entries' sources and the extra read-only
        paths. Computed from the layout alone, sandboxed or not (an unsandboxed command sees everything)."""
        seen = [Path(directory).resolve() for directory in _SYSTEM_DIRS if Path(directory).exists()]
        seen += [Path(name).resolve() for name in _SYSTEM_LINKS if Path(name).is_dir() and not Path(name).is_symlink()]
        seen += etc_sources(_system_roots())
        seen += [Path(extra).resolve() for extra in self.read_only]
        return list(dict.fromkeys(seen))

    def exposes(self, path: Path) -> str | None:
        """What makes ``path`` readable inside this sandbox: the visible path (:meth:`visible`) its resolved
        form falls under, or ``None``. bwrap binds what a path resolves to, so a link pointing into ``/usr``
        is exposed, and ``/etc/durafix/key.pem`` (not curated) is not."""
        target = Path(path).resolve()
        for root in self.visible():
            if target == root or target.is_relative_to(root):
                return str(root)
        return None

    def inside(self, workspace: Path) -> Path:
        """Where a command run by :meth:`wrap` sees ``workspace``: :data:`WORKSPACE` in bubblewrap, its own
        (absolute) path unsandboxed. Anything that hands the sandboxed command a path of the workspace (an
        argument, a variable) hands it this one."""
        return Path(WORKSPACE) if self.sandboxed else Path(workspace).absolute()

    def wrap(
        self,
        argv: Sequence[str],
        *,
        workspace: Path,
        writable: Sequence[Path] = (),
        network: Network | Egress = Network.NONE,
    ) -> list[str]:
        """``argv`` as it runs in this sandbox with ``workspace`` read-write at :data:`WORKSPACE` (its working
        directory) and ``writable`` read-write at their own paths, on ``network``; unchanged when unsandboxed (then
        ``network`` is the worker's: the operator chose to run without the sandbox). A ``writable`` or read-only
        path at or under :data:`WORKSPACE` would be hidden by the workspace: refused."""
        if not self.sandboxed:
            return list(argv)
        for extra in [*writable, *self.read_only]:
            if Path(extra).absolute().is_relative_to(WORKSPACE):
                raise EnvironmentError(f"{extra} would be hidden by the workspace, bound at {WORKSPACE} in the sandbox")
        args = [
            self.bwrap,
            "--die-with-parent",
            "--unshare-user",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            # bwrap keeps its capabilities inside the user namespace when the worker runs as root: drop them all.
            "--cap-drop",
            "ALL",
        ]
        if network is not Network.HOST:
            args.append("--unshare-net")
        for directory in _SYSTEM_DIRS:
            args += ["--ro-bind-try", directory, directory]
        args += etc_args(account_stubs(), _system_roots())
        for name in _SYSTEM_LINKS:
            path = Path(name)
            if path.is_symlink():
                args += ["--symlink", str(path.readlink()), name]
            elif path.is_dir():
                args += ["--ro-bind", name, name]
        args += ["--proc", "/proc", "--dev", "/dev"]
        for directory in _PRIVATE_TMPFS:
            args += ["--tmpfs", directory]
        # After the private tmpfs mounts, so an extra directory under /tmp or /home is not hidden by them.
        for extra in self.read_only:
            args += ["--ro-bind-try", str(extra), str(extra)]
        args += REMOUNT_ETC
        args += ["--bind", str(Path(workspace).absolute()), WORKSPACE]
        for path in writable:
            resolved = str(Path(path).absolute())
            args += ["--bind", resolved, resolved]
        # Over the writable bind: the workspace's git metadata is the worker's, read-only to what runs inside. A
        # ``.git`` that is not a real directory (a link, a file) was not made by the worker: refused, not bound.
        dot_git = Path(workspace).absolute() / ".git"
        if dot_git.is_symlink() or (dot_git.exists() and not dot_git.is_dir()):
            raise EnvironmentError(f"{dot_git} is not a directory the worker made; refusing to run a command there")
        if dot_git.is_dir():
            args += ["--ro-bind", str(dot_git), f"{WORKSPACE}/.git"]
        if isinstance(network, Egress):
            # After the /run tmpfs, which would hide it; read-only (connecting needs no write access to the mount,
            # and the setup cannot chmod or replace it). bwrap's --setenv wins over the recipe's variables.
            args += ["--ro-bind", str(Path(network.socket).absolute()), egress.INSIDE_SOCKET]
            for name, value in egress.PROXY_ENV.items():
                args += ["--setenv", name, value]
            argv = egress.bridged(argv)
        args += ["--chdir", WORKSPACE, "--", *argv]
        return args


def _system_roots() -> list[Path]:
    """What the sandbox mounts besides /etc, resolved: a link in /etc pointing under one stays a link."""
    return [Path(name).resolve() for name in (*_SYSTEM_DIRS, *_PRIVATE_MOUNTS)]


def bwrap_version(bwrap: str = BWRAP) -> str:
    """``bubblewrap 0.8.0`` (what ``bwrap --version`` says), or ``bubblewrap`` when it says nothing usable."""
    try:
        said = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "bubblewrap"
    return said.strip().splitlines()[0] if said.strip() else "bubblewrap"


def bwrap_problem(bwrap: str = BWRAP) -> str | None:
    """Why ``bwrap`` cannot sandbox commands here (not installed, or namespaces refused), or ``None``."""
    if shutil.which(bwrap) is None:
        return f"{bwrap} is not installed"
    probe = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "--", "/bin/true"]
    try:
        result = subprocess.run(probe, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} did not run: {exc}"
    if result.returncode != 0:
        return f"{bwrap} cannot create namespaces: {result.stderr.decode(errors='replace').strip()[-300:]}"
    return None
