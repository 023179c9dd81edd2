"""Running a recipe's shell commands: environment, own session, output to a log file.

A command's environment is built, not inherited: only a few neutral worker variables pass through
(``PATH``, ``HOME``, locale, ``TZ``, ``TMPDIR``), so a worker's own credentials never reach the application
under repair; the recipe's ``env`` and resolved secrets are added on top. Setup commands alone also get the
variables the operator lets through and the package-manager cache locations (``worker``, see
:mod:`environments.passthrough` and :class:`environments.checks.SetupSettings`). Each command runs under
``/bin/sh -c`` in its own session (``start_new_session=True``), so its whole process group can be signalled
without touching the worker. Spawned long-running children are reaped by a daemon thread, so a dead one
never lingers as a zombie that looks alive.

Given a :class:`~environments.sandbox.Sandbox`, the shell runs inside it (:meth:`Sandbox.wrap`): only the
working directory and ``writable`` are writable, the network is the step's (:class:`~environments.sandbox.Network`),
and when the shell ends every process it left behind dies with the sandbox's PID namespace.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from environments.interface import AppRecipe
from environments.processes import MARKER_VAR, start_time, stop_owned
from environments.sandbox import Egress, Network, Sandbox
from environments.secrets import resolve_secrets

_PASSED_THROUGH = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
TAIL_BYTES = 4096


def command_env(
    recipe: AppRecipe,
    *,
    marker: str,
    extra: Mapping[str, str] | None = None,
    worker: Mapping[str, str] | None = None,
    allowed_secrets: Collection[str] = (),
) -> dict[str, str]:
    """Environment for one of ``recipe``'s commands; secrets resolved now from the worker's environment.

    Layers, each over the one before: the neutral worker variables, ``worker`` (what the worker adds for this
    kind of command: setup's package caches and passed-through variables, see :mod:`environments.checks`),
    the recipe's ``env``, its secrets (only worker variables the operator's ``allowed_secrets`` names, see
    :func:`environments.secrets.resolve_secrets`), ``extra``, the ownership marker.
    """
    env = {name: os.environ[name] for name in _PASSED_THROUGH if name in os.environ}
    if worker:
        env.update(worker)
    env.update(recipe.env)
    env.update(resolve_secrets(recipe.secrets, os.environ, allowed=allowed_secrets))
    if extra:
        env.update(extra)
    env[MARKER_VAR] = marker
    return env


def spawn(
    command: str,
    *,
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    sandbox: Sandbox | None = None,
    writable: Sequence[Path] = (),
    network: Network | Egress = Network.NONE,
    launcher: Sequence[str] = (),
) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``command`` in its own session, appending its output to ``log_path``; reap it when it exits.

    With ``sandbox`` the shell runs inside it, ``cwd`` and ``writable`` writable, on ``network``; ``launcher``
    (an argv prefix such as the app forwarder's, which must start its interpreter isolated: ``python -I``, by
    file) runs outside the sandbox, from ``/``, and is given the sandboxed argv.
    Returns the process and its start time, read before the reaper may collect it: a command that dies at
    once is still identified exactly, rather than confused with a later process reusing its pid.
    """
    argv = ["/bin/sh", "-c", command]
    host_cwd = cwd
    if sandbox is not None and sandbox.sandboxed:
        argv = sandbox.wrap(argv, workspace=cwd, writable=writable, network=network)
        # bwrap's --chdir puts the command in ``cwd``; what runs on the worker (bwrap, a launcher such as the app
        # forwarder) starts in a directory of the worker's, so nothing of the workspace is on its import path.
        host_cwd = Path("/")
    argv = [*launcher, *argv]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        log.write(f"$ {command}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            argv,
            cwd=host_cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    started_at = start_time(proc.pid)
    threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
    return proc, started_at


def exit_text(code: int | None) -> str:
    """How a command ended, as a message says it: ``timed out`` for ``None`` (the convention of
    :func:`run_to_completion`), else ``exited <code>``."""
    return "timed out" if code is None else f"exited {code}"


def run_to_completion(
    command: str,
    *,
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    timeout_s: float,
    sandbox: Sandbox | None = None,
    writable: Sequence[Path] = (),
    network: Network | Egress = Network.NONE,
    launcher: Sequence[str] = (),
) -> tuple[int | None, float]:
    """Run ``command`` to its end; return (exit code, or ``None`` if it timed out and was killed; seconds).

    On timeout, and when the wait is interrupted by an exception (a cancellation raised in the calling
    thread), the command's whole process group (and anything carrying its marker) is stopped before this
    returns or re-raises: a caller that gives up never leaves the command running. In a sandbox
    (see :func:`spawn`) nothing the command started outlives it: the sandbox's PID namespace ends with it.
    """
    started = time.monotonic()
    proc, _ = spawn(
        command,
        cwd=cwd,
        env=env,
        log_path=log_path,
        sandbox=sandbox,
        writable=writable,
        network=network,
        launcher=launcher,
    )
    try:
        code: int | None = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_owned(env[MARKER_VAR], pgid=proc.pid, grace_s=2.0)
        code = None
    except BaseException:
        # The caller gave up while the command ran (a cancelled activity's CancelledError is raised in this
        # thread while it waits): the command is in its own session, so nothing else would ever stop it.
        stop_owned(env[MARKER_VAR], pgid=proc.pid, grace_s=2.0)
        raise
    return code, time.monotonic() - started


def log_note(log_path: Path, text: str) -> None:
    """Append ``text`` to the command log at ``log_path`` as a ``# `` line (its folder made if missing), so
    durafix's own remarks stand apart from the commands' output and their ``$ command`` lines."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"# {text}\n")


def tail(path: Path, limit: int = TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``path`` as text (empty if the file does not exist)."""
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - limit))
            return fh.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
