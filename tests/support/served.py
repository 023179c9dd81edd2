"""A socket server of a test, serving from a thread for the length of a block; a server started as a child
process."""

from __future__ import annotations

import socketserver
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

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


def started_printing_url(argv: list[str], cwd: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    """A server run as a child process (``argv``, its output piped), and the first line it prints: the URL it
    serves at."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()
