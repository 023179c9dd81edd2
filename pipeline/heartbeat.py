"""Heartbeating around blocking work in synchronous activities.

A long activity heartbeats so that (a) a dead worker is noticed after the heartbeat timeout instead of the
whole start-to-close timeout, and (b) cancellation reaches it: a heartbeat is how a sync activity learns it
was cancelled. ``Heartbeat`` beats from a helper thread while the activity thread blocks in a call that cannot
beat itself (a readiness wait, a model call), carrying a resumable sub-state in its details.

Details are the sub-state text, or ``{"detail": text, **carry}`` when the activity carries facts to its next
attempt: Temporal hands the last heartbeat's details of a failed attempt to the retry
(``activity.info().heartbeat_details``), also when that heartbeat was sent just before the failure.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Mapping
from types import TracebackType

from temporalio import activity


class Heartbeat:
    """Context manager: heartbeat ``detail`` every ``every_s`` seconds until the block ends."""

    def __init__(self, detail: str, every_s: float = 2.0, carry: Mapping[str, object] | None = None) -> None:
        self.detail = detail
        self.every_s = every_s
        self.carry = dict(carry or {})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def set(self, detail: str) -> None:
        """Change the sub-state reported with the next beat (and beat now)."""
        self.detail = detail
        self.beat()

    def beat(self) -> None:
        activity.heartbeat({"detail": self.detail, **self.carry} if self.carry else self.detail)

    def __enter__(self) -> Heartbeat:
        self.beat()
        ctx = contextvars.copy_context()
        self._thread = threading.Thread(target=ctx.run, args=(self._beat,), daemon=True, name="heartbeat")
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            self.beat()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
