"""Serving until the process is asked to stop: the evidence server's and the dev stack's model server's command."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType


def serve_until_signalled(url: str, start: Callable[[], None], stop: Callable[[], None]) -> None:
    """``start`` the server, print ``url`` on stdout (where whoever started the process reads it from), and block
    until SIGINT or SIGTERM; then restore the previous handlers of both and ``stop`` the server, whatever happened.

    The handlers are in place before ``start``, so a signal never ends the process half-started."""
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    start()
    try:
        print(url, flush=True)
        stopping.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        stop()
