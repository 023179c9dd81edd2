"""Heartbeating around blocking work in synchronous activities.

A long activity heartbeats so that (a) a dead worker is noticed after the heartbeat timeout instead of the
whole start-to-close timeout, and (b) cancellation reaches it: a heartbeat is how a sync activity learns it
was cancelled. :class:`Heartbeat` beats from a helper thread while the activity thread blocks in a call that
cannot beat itself (a setup command, a readiness wait, a model call), carrying the sub-state of the work in
its details, with the seconds spent in it: ``setup: npm ci (41 s)``. ``durafix status`` shows it.

Details are the sub-state text, or ``{"detail": text, **carry}`` when the activity carries facts to its next
attempt: Temporal hands the last heartbeat's details of a failed attempt to the retry
(``activity.info().heartbeat_details``), also when that heartbeat was sent just before the failure.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Mapping
from types import TracebackType

from temporalio import activity


class Heartbeat:
    """Context manager: heartbeat the current sub-state every ``every_s`` seconds until the block ends."""

    def __init__(self, detail: str, every_s: float = 2.0, carry: Mapping[str, object] | None = None) -> None:
        self.detail = detail
        self.every_s = every_s
        self.carry = dict(carry or {})
        self._since = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def set(self, detail: str) -> None:
        """Enter a new sub-state (its clock starts now) and beat at once. Safe to call from any thread."""
        self.detail = detail
        self._since = time.monotonic()
        self.beat()

    def text(self) -> str:
        return f"{self.detail} ({time.monotonic() - self._since:.0f} s)"

    def beat(self) -> None:
        text = self.text()
        activity.heartbeat({"detail": text, **self.carry} if self.carry else text)

    def __enter__(self) -> Heartbeat:
        self._since = time.monotonic()
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
