"""A socket server of a test, serving from a thread for the length of a block."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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
