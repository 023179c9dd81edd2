"""The one way into a sandboxed app: a TCP forwarder from the worker's loopback into the app's network namespace.

Run as a script (standard library only, so it needs nothing from the worker's environment)::

    python app_forwarder.py LISTEN_PORT TARGET_PORT -- bwrap ... /bin/sh -c START

It listens on ``127.0.0.1:LISTEN_PORT`` on the worker (the browser, the readiness probe and fixtures' URL go
there), starts the sandboxed command (bubblewrap with its own network namespace, see
:mod:`environments.sandbox`), finds that namespace (``/proc/<bwrap's child>/ns/net``) and, for each accepted
connection, opens a socket *inside* it to ``127.0.0.1:TARGET_PORT``: the socket is created by a thread that has
entered the namespace with ``setns(2)`` and left it again, and a socket stays in the namespace it was created
in. The app therefore reaches nothing but its own loopback: not Temporal, not the forge, not the evidence
server, not the internet; only the forwarded port reaches it. Entering the namespace needs ``CAP_SYS_ADMIN``
over its user namespace, which the worker's user has for the namespaces its own bwrap created.

The forwarder is the process the provider records (its group holds bwrap): it exits with the sandboxed
command's exit code when that ends, and stops the command on SIGTERM; bwrap's ``--die-with-parent`` kills the
sandbox if the forwarder is killed outright. It is the children's subreaper, so the sandbox's init, orphaned for
a moment when one group signal kills bwrap first, is reaped here rather than left as a zombie.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

CLONE_NEWNET = 0x40000000
PR_SET_CHILD_SUBREAPER = 36
_BUFFER = 65536
_libc = ctypes.CDLL(None, use_errno=True)
_setns_lock = threading.Lock()


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


def sandbox_netns(bwrap_pid: int, deadline_s: float = 30.0) -> int | None:
    """An open descriptor of the network namespace of ``bwrap_pid``'s child, once it has one of its own."""
    own = os.stat("/proc/self/ns/net").st_ino
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for child in _children(bwrap_pid):
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{child}/ns/net").st_ino != own:
                    return os.open(f"/proc/{child}/ns/net", os.O_RDONLY)
        if not os.path.exists(f"/proc/{bwrap_pid}"):
            return None
        time.sleep(0.01)
    return None


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry}/stat") as fh:
                    raw = fh.read()
                if int(raw[raw.rindex(")") + 2 :].split()[1]) == pid:
                    found.append(int(entry))
    return found


def socket_in(netns: int, home: int) -> socket.socket:
    """A new TCP socket created inside the namespace ``netns``; the calling thread returns to ``home``."""
    with _setns_lock:
        _setns(netns)
        try:
            return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            _setns(home)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(_BUFFER):
            dst.sendall(data)
    except OSError:
        # Either side closed or reset the connection: that ends this direction (the peer hears it below).
        return
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def splice(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways between ``a`` and ``b`` until both directions have ended."""
    back = threading.Thread(target=_pump, args=(b, a), daemon=True)
    back.start()
    _pump(a, b)
    back.join()


def _serve(client: socket.socket, netns: int, home: int, target_port: int) -> None:
    with client:
        try:
            upstream = socket_in(netns, home)
        except OSError:
            return
        with upstream:
            try:
                upstream.settimeout(10)
                upstream.connect(("127.0.0.1", target_port))
                upstream.settimeout(None)
            except OSError:
                return  # not listening yet: the caller sees a closed connection and probes again
            splice(client, upstream)


def ports_and_command(argv: list[str], usage: str) -> tuple[int, int, list[str]]:
    """A forwarder's arguments, ``PORT PORT -- COMMAND...``, as (first port, second port, command); anything else
    prints ``usage`` and exits with status 2."""
    if len(argv) < 4 or argv[2] != "--":
        print(f"usage: {usage}", file=sys.stderr)
        raise SystemExit(2)
    return int(argv[0]), int(argv[1]), argv[3:]


def main(argv: list[str]) -> int:
    listen_port, target_port, command = ports_and_command(
        argv, "app_forwarder.py LISTEN_PORT TARGET_PORT -- COMMAND..."
    )
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", listen_port))
    listener.listen(64)
    # bwrap's inner init outlives its outer process by a moment when a group signal kills both; as the
    # subreaper the forwarder inherits and reaps it instead of leaving a zombie in the group.
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    child = subprocess.Popen(command)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    netns = sandbox_netns(child.pid)
    if netns is None:
        print("app_forwarder: the sandbox's network namespace was not found", file=sys.stderr)
        child.kill()
        return reaped_exit_code(child)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)

    serve_in_background(listener, lambda client: _serve(client, netns, home, target_port))
    return reaped_exit_code(child)


def serve_in_background(listener: socket.socket, handle: Callable[[socket.socket], None]) -> threading.Thread:
    """Hand every connection ``listener`` accepts to ``handle``, each on a thread of its own; the accepting thread
    (returned) runs in the background until ``accept`` fails.

    Closing the listener alone does not end it: a thread blocked in ``accept`` keeps the socket, which goes on
    listening (and accepting) on its port. Whoever stops serving while the process goes on shuts the listener
    down first (``shutdown`` wakes the ``accept``, which fails), joins the thread, then closes the listener.
    """

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    accepting = threading.Thread(target=accept, daemon=True)
    accepting.start()
    return accepting


def reaped_exit_code(child: subprocess.Popen[bytes]) -> int:
    """``child``'s exit code, once it has ended and every orphan this subreaper inherited is reaped too."""
    code = child.wait()
    _reap_all()
    return code


def _reap_all() -> None:
    """Wait for every remaining child (orphans this subreaper inherited) until there is none."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
