"""A socket server of a test, serving from a thread for the length of a block; the request handler of a test's
HTTP server; a bare listener handing each connection to a function, stopped for good after its block; a server
started as a child process."""

from __future__ import annotations

import socket
import socketserver
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TypeVar

from environments.app_forwarder import serve_in_background

S = TypeVar("S", bound=socketserver.BaseServer)


@contextmanager
def served(server: S) -> Iterator[S]:
    """``server`` answering from a daemon thread until the block exits; then shut down, closed and joined, so
    nothing of it outlives the test."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class QuietHandler(BaseHTTPRequestHandler):
    """A test server's request handler: it writes no access log (a test reads what its server saw or answered,
    and a line a request would drown the test's output) and answers with :meth:`answer`."""

    def answer(self, status: int, body: bytes = b"", *headers: tuple[str, str]) -> None:
        """``status`` with ``headers`` (name, value) in their order and then ``body``, its length said last (so
        the client reads the body to its end and no further)."""
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Silent (see the class)."""


def started_printing_url(argv: list[str], cwd: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    """A server run as a child process (``argv``, its output piped), and the first line it prints: the URL it
    serves at."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


@contextmanager
def accepting(handle: Callable[[socket.socket], None], backlog: int = 8) -> Iterator[int]:
    """A listener on a free loopback port for the block, handing each connection to ``handle`` on a thread of
    its own (:func:`environments.app_forwarder.serve_in_background`); yields the port.

    At the end the listener is shut down, its accepting thread joined, and only then closed: a listener closed
    under a thread blocked in ``accept`` goes on listening on its port, and a thread about to call ``accept``
    could find the listener's descriptor number reused by a later test's server and take its connections."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(backlog)
    thread = serve_in_background(listener, handle)
    try:
        yield listener.getsockname()[1]
    finally:
        with suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        thread.join(timeout=10)
        listener.close()
