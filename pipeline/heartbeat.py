"""Heartbeating around blocking work in synchronous activities.

A long activity heartbeats so that (a) a dead worker is noticed after the heartbeat timeout instead of the
whole start-to-close timeout, and (b) cancellation reaches it: a heartbeat is how a sync activity learns it
was cancelled. ``Heartbeat`` beats from a helper thread while the activity thread blocks in a call that cannot
beat itself (a readiness wait, a model call), carrying a resumable sub-state in its details.
"""

from __future__ import annotations

import contextvars
import threading
from types import TracebackType

from temporalio import activity


class Heartbeat:
    """Context manager: heartbeat ``detail`` every ``every_s`` seconds until the block ends."""

    def __init__(self, detail: str, every_s: float = 2.0) -> None:
        self.detail = detail
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def set(self, detail: str) -> None:
        """Change the sub-state reported with the next beat (and beat now)."""
        self.detail = detail
        activity.heartbeat(detail)

    def __enter__(self) -> Heartbeat:
        activity.heartbeat(self.detail)
        ctx = contextvars.copy_context()
        self._thread = threading.Thread(target=ctx.run, args=(self._beat,), daemon=True, name="heartbeat")
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            activity.heartbeat(self.detail)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
