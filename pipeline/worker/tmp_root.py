"""A worker process's temporary root: every temporary file and directory the process makes, in one directory
that is removed when the process ends, by the process itself or by whoever outlives it.

A ``durafix worker`` process (the supervisor, each of its children, an unsupervised worker) makes its root
first thing, ``BASE/durafix-worker-<pid namespace>-<pid>-<start time>-<random>`` (:func:`start`), where ``BASE``
is the temporary directory the process was started with (``TMPDIR``, else ``/tmp``), and points Python's
:mod:`tempfile` at it (``tempfile.tempdir``): Chromium's home (:class:`browser.sandbox.BrowserHome`), git's empty
home, the sandbox's ``/etc`` stubs, the claim scratch repository and every per-call directory (a reproduction's,
a verification's, ...) are made in there, and so are the folders Playwright's driver makes for each browser launch
(:mod:`browser.driver_temp`: a driver killed with its worker would leave them). The environment's ``TMPDIR`` is
left as it was: git and recipe commands get the operator's, because a sandboxed command sees a private ``/tmp``
in which a path of the worker's would not exist.

Who removes a root:

- the process itself, on a clean stop (SIGTERM/SIGINT, or its supervisor gone): :meth:`TmpRoot.remove` as the
  command returns (``durafix`` commands end with ``os._exit``, so ``atexit`` handlers never run);
- for a supervised child that died (SIGKILL included), its supervisor, once ``waitpid`` reported the death
  (:func:`remove_of`);
- for anything else (a supervisor killed together with its children, an unsupervised worker killed), the next
  worker process that starts with the same ``BASE``, and every supervisor's periodic sweep (:func:`sweep`).

Contracts:

- A root is removed by another process only when its owner is not running: the pid *and* the start time in its
  name (a recycled pid is never taken for it), in this process's PID namespace (a worker in another container
  that shares ``BASE`` is never judged by pids that are not its own). A live worker's root is never touched.
- Only real directories owned by this process's user are considered (a link or another user's directory named
  like a root is left alone), and removal never follows a symbolic link out of the tree
  (:func:`environments.files.discard_tree`).
- Mode 0711: Chromium runs as an unprivileged user when the worker is root and must pass through the root to
  reach its home (which :class:`~browser.sandbox.BrowserHome` makes 0711 and 0700 inside); it cannot list it.
- Names stay short: a unix socket path is limited to 108 bytes, and the egress proxy's socket lives two levels
  below the root.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from browser.driver_temp import keep_driver_temporaries_in, release_driver_temporaries
from environments.files import discard_tree
from environments.processes import is_running, start_time

PREFIX = "durafix-worker-"
_NAME = re.compile(r"^durafix-worker-(\d+)-(\d+)-(\d+)-[A-Za-z0-9_]+$")


def pid_namespace() -> int:
    """This process's PID namespace (the inode of ``/proc/self/ns/pid``); 0 when it cannot be read."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


@dataclass(frozen=True)
class TmpRoot:
    """One worker process's temporary root (see the module); ``base`` is the directory it lies in."""

    path: Path

    @property
    def base(self) -> Path:
        return self.path.parent

    @property
    def owner(self) -> tuple[int, int, int] | None:
        """(PID namespace, pid, start time) of the process the name says made it; None if not a root's name."""
        found = _NAME.match(self.path.name)
        return None if found is None else (int(found[1]), int(found[2]), int(found[3]))

    def owner_running(self) -> bool:
        """Whether the owner may still run: True for a name of another PID namespace (not ours to judge)."""
        owner = self.owner
        if owner is None:
            return True
        namespace, pid, started = owner
        return namespace != pid_namespace() or is_running(pid, started)

    def adopt(self) -> None:
        """Make this the process's temporary directory for :mod:`tempfile` and for the Playwright drivers it
        starts (:func:`browser.driver_temp.keep_driver_temporaries_in`; its ``TMPDIR`` is unchanged)."""
        tempfile.tempdir = str(self.path)
        keep_driver_temporaries_in(self.path)

    def remove(self) -> None:
        """Remove the root and everything in it (its owner, stopping; or anyone, once the owner is dead).
        If it is still this process's temporary directory, :mod:`tempfile` and Playwright's drivers go back to
        ``base``."""
        if tempfile.tempdir == str(self.path):
            tempfile.tempdir = str(self.base)
        release_driver_temporaries(self.path)
        discard_tree(self.path)


def start(base: Path | None = None) -> TmpRoot:
    """Sweep ``base`` (default: the temporary directory this process was started with) of dead workers' roots,
    make this process's root there and adopt it. Call once, before anything makes a temporary file."""
    base = Path(base or tempfile.gettempdir())
    sweep(base)
    pid = os.getpid()
    made = tempfile.mkdtemp(prefix=f"{PREFIX}{pid_namespace()}-{pid}-{start_time(pid)}-", dir=base)
    # mkdtemp made it 0700; see the module for why the browser's user may pass through.
    os.chmod(made, 0o711)
    root = TmpRoot(Path(made))
    root.adopt()
    return root


def roots(base: Path) -> list[TmpRoot]:
    """The worker roots in ``base``: real directories (not links) owned by this process's user, named as roots."""
    found: list[TmpRoot] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return found
    for entry in entries:
        if not entry.name.startswith(PREFIX) or _NAME.match(entry.name) is None:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
            found.append(TmpRoot(Path(entry.path)))
    return found


def sweep(base: Path) -> list[Path]:
    """Remove the roots in ``base`` whose owner is not running; the paths removed."""
    removed: list[Path] = []
    for root in roots(base):
        if not root.owner_running():
            root.remove()
            removed.append(root.path)
    return removed


def remove_of(base: Path, pid: int, started: int) -> list[Path]:
    """Remove the roots in ``base`` of the process ``pid`` that started at ``started`` (a child its supervisor
    saw die), if it is not running; the paths removed."""
    prefix = f"{PREFIX}{pid_namespace()}-{pid}-{started}-"
    if is_running(pid, started):
        return []
    removed: list[Path] = []
    for root in roots(base):
        if root.path.name.startswith(prefix):
            root.remove()
            removed.append(root.path)
    return removed
