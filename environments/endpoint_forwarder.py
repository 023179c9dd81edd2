"""The one way out of a network-less sandbox: one loopback port inside it forwarded to one port on the worker.

Run with the worker's interpreter (the command it starts is the sandbox; nothing of this runs inside), isolated
and by its own file, from a directory of the worker's (:func:`launcher`, :data:`HOST_CWD`)::

    python -I .../environments/endpoint_forwarder.py INNER_PORT HOST_PORT -- bwrap ... COMMAND

Never ``python -m environments.endpoint_forwarder`` with the workspace as the working directory: ``-m`` puts the
working directory first on ``sys.path``, so a repository's top-level ``environments/`` package (this package's
own name), ``sitecustomize.py`` or ``usercustomize.py`` would be imported and run on the worker. ``-I`` keeps the
working directory, the user's site directory and every ``PYTHON*`` variable out; the worker's own packages come
from its installed environment.

The mirror image of :mod:`environments.app_forwarder`: bwrap (``--unshare-net``) is started blocked
(``--block-fd``, added here), the forwarder finds the sandbox's network namespace, creates a listening socket
*inside* it on ``127.0.0.1:INNER_PORT`` (a socket stays in the namespace it was created in), and only then lets
the command run, so the command never finds the port closed. Each connection accepted there is joined to a new
socket on the worker's own loopback, ``127.0.0.1:HOST_PORT``. The command therefore reaches exactly one
service of the worker (the repair engine's model proxy, :mod:`repair.model_proxy`) and nothing else: not the
forge, not Temporal, not the evidence store, not the internet.

Lifetime: the forwarder asks the kernel for ``SIGKILL`` when its parent (the worker's activity thread) dies,
so a SIGKILLed worker takes the forwarder with it, and bwrap's ``--die-with-parent`` and PID namespace take
the sandbox. It exits with the command's exit code, reaping what it inherits as the children's subreaper.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

from environments.app_forwarder import (
    PR_SET_CHILD_SUBREAPER,
    _libc,
    ports_and_command,
    reaped_exit_code,
    sandbox_netns,
    serve_in_background,
    socket_in,
    splice,
)

PR_SET_PDEATHSIG = 1
# The working directory the forwarder is started in: the worker's, never a workspace (bwrap's ``--chdir`` puts
# the command where it works; the forwarder itself needs no directory).
HOST_CWD = "/"


def launcher(inner_port: int, host_port: int) -> list[str]:
    """The argv prefix that starts this forwarder isolated from any workspace; append ``["--", *bwrap_argv]``.
    Start it with ``cwd=HOST_CWD``."""
    return [sys.executable, "-I", os.path.abspath(__file__), str(inner_port), str(host_port)]


def listen_in(netns: int, home: int, port: int, deadline_s: float = 10.0) -> socket.socket:
    """A socket listening on ``127.0.0.1:port`` inside ``netns`` (retried until bwrap has its loopback up)."""
    deadline = time.monotonic() + deadline_s
    while True:
        sock = socket_in(netns, home)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen(64)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _join(inner: socket.socket, host_port: int) -> None:
    with inner:
        try:
            outer = socket.create_connection(("127.0.0.1", host_port), timeout=10)
        except OSError:
            return  # the proxy is gone: the caller sees a closed connection
        with outer:
            outer.settimeout(None)
            splice(inner, outer)


def main(argv: list[str]) -> int:
    inner_port, host_port, command = ports_and_command(argv, "endpoint_forwarder INNER_PORT HOST_PORT -- BWRAP ARGS...")
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    blocked, release = os.pipe()
    child = subprocess.Popen([command[0], "--block-fd", str(blocked), *command[1:]], pass_fds=(blocked,))
    os.close(blocked)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    netns = sandbox_netns(child.pid)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if netns is None:
            raise OSError("the sandbox's network namespace was not found")
        listener = listen_in(netns, home, inner_port)
    except OSError as exc:
        print(f"endpoint_forwarder: {exc}", file=sys.stderr)
        child.kill()
        return reaped_exit_code(child) or 1

    serve_in_background(listener, lambda conn: _join(conn, host_port))
    os.write(release, b"x")
    with contextlib.suppress(OSError):
        os.close(release)
    return reaped_exit_code(child)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
