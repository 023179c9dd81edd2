"""Fault injection: the next N chat-completion requests fail or stall, then the script answers again.

A fault is posted as JSON to ``/_admin/faults``: ``{"status": 429, "count": 2, "retry_after": 3}`` answers
the next two requests with HTTP 429 and ``Retry-After: 3``; ``{"status": 500}`` one request with a 500;
``{"delay_s": 5, "count": 1}`` holds the next request for five seconds before answering it normally, so a
client with a shorter timeout sees a timeout. ``"after": N`` lets N requests through first (a failure in the
middle of a conversation). Faults queue up in the order posted.
"""

from __future__ import annotations

import threading

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Fault(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: int | None = Field(default=None, ge=400, le=599)
    retry_after: float | None = Field(default=None, ge=0)
    delay_s: float | None = Field(default=None, gt=0)
    count: int = Field(default=1, ge=1)
    after: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _one_kind(self) -> Fault:
        if (self.status is None) == (self.delay_s is None):
            raise ValueError("a fault is either {status, retry_after?} or {delay_s}, with an optional count")
        if self.retry_after is not None and self.status is None:
            raise ValueError("retry_after goes with a status")
        return self


class FaultQueue:
    """Thread-safe queue of pending faults; each request takes at most one unit of the head fault."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[Fault] = []

    def add(self, fault: Fault) -> None:
        with self._lock:
            self._pending.append(fault.model_copy())

    def take(self) -> Fault | None:
        with self._lock:
            if not self._pending:
                return None
            head = self._pending[0]
            if head.after:
                head.after -= 1
                return None
            head.count -= 1
            if head.count == 0:
                self._pending.pop(0)
            return head.model_copy(update={"count": 1, "after": None})

    def pending(self) -> list[Fault]:
        with self._lock:
            return [f.model_copy() for f in self._pending]
