"""Primary rate-limit bookkeeping behind the ``x-ratelimit-*`` headers on every API answer.

Counts are per caller (user, or client IP when anonymous) and resource, in fixed hourly windows, in memory.
The forge reports them as GitHub does but never refuses a request for them: refusals come from faults.
"""

from __future__ import annotations

import threading
import time

LIMITS = {"core": 5000, "graphql": 5000}
ANONYMOUS_LIMIT = 60
WINDOW_S = 3600


class RateCounter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, str], tuple[int, int]] = {}

    def count(self, caller: str, resource: str, authenticated: bool, *, charge: bool = True) -> dict[str, str]:
        """The ``x-ratelimit-*`` headers for one answer; ``charge=False`` reports without counting the request
        (a conditional GET answered 304, which GitHub does not count)."""
        now = int(time.time())
        with self._lock:
            start, used = self._windows.get((caller, resource), (now, 0))
            if now >= start + WINDOW_S:
                start, used = now, 0
            if charge:
                used += 1
            self._windows[(caller, resource)] = (start, used)
        limit = LIMITS.get(resource, 5000) if authenticated else ANONYMOUS_LIMIT
        return {
            "x-ratelimit-limit": str(limit),
            "x-ratelimit-remaining": str(max(limit - used, 0)),
            "x-ratelimit-reset": str(start + WINDOW_S),
            "x-ratelimit-used": str(used),
            "x-ratelimit-resource": resource,
        }
