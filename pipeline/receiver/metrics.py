"""What the webhook receiver counts, in a Prometheus registry of its own (``GET /metrics``).

Contract:
- ``durafix_webhook_deliveries_total{event, action, status}``: one increment per answered request to
  ``/webhook``, refusals by the connection guard included (their ``event`` is empty: no header was trusted).
- ``durafix_webhook_handling_seconds{event}``: how long each answered request took, from its headers to its
  answer.
- ``durafix_reconciler_lag_seconds``: seconds since the time the reconciler last said it had caught up to
  (:meth:`ReceiverMetrics.reconciled`), computed when scraped, so it grows while the reconciler is stuck;
  ``NaN`` until it has reported once.
- Label values are bounded: an event or action is kept only when the delivery's signature checked (only
  GitHub can make those) and it looks like a GitHub name; otherwise ``unverified`` / ``other``. A client
  without the secret cannot grow the registry.
- The registry is this object's, never ``prometheus_client``'s global one: two receivers in one process (the
  tests) do not share or collide.
"""

from __future__ import annotations

import math
import re
import threading
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

UNVERIFIED = "unverified"
OTHER = "other"
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


def label(value: object, verified: bool) -> str:
    """``value`` as a label when it came from a signed delivery and looks like a GitHub event or action name;
    ``unverified`` when the signature did not check, ``other`` for a signed value of another shape, ``""`` for
    none."""
    if not verified:
        return UNVERIFIED
    if value is None or value == "":
        return ""
    return value if isinstance(value, str) and _NAME.fullmatch(value) else OTHER


class ReceiverMetrics:
    """The receiver's counters, histogram and reconciler-lag gauge. Thread-safe (``prometheus_client`` is)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.deliveries = Counter(
            "durafix_webhook_deliveries",
            "Requests to /webhook answered, by GitHub event, action and HTTP status",
            ["event", "action", "status"],
            registry=self.registry,
        )
        self.handling = Histogram(
            "durafix_webhook_handling_seconds",
            "Time from a request's headers to its answer, by GitHub event",
            ["event"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        )
        self.reconciler_lag = Gauge(
            "durafix_reconciler_lag_seconds",
            "Seconds since the point in time the reconciler last caught up to (NaN before its first report)",
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self._reconciled_at: datetime | None = None
        self.reconciler_lag.set_function(self._lag)

    def delivered(self, event: str, action: str, status: int, seconds: float) -> None:
        """Count one answered request (labels already bounded by :func:`label`)."""
        self.deliveries.labels(event=event, action=action, status=str(status)).inc()
        self.handling.labels(event=event).observe(seconds)

    def reconciled(self, at: datetime) -> None:
        """The reconciler has seen every event up to ``at`` (timezone-aware). Later calls with an earlier
        ``at`` are ignored: the lag reported never goes back in time because of a slow, stale pass."""
        if at.tzinfo is None:
            raise ValueError("reconciled(at): `at` must be timezone-aware")
        with self._lock:
            if self._reconciled_at is None or at > self._reconciled_at:
                self._reconciled_at = at

    def _lag(self) -> float:
        with self._lock:
            at = self._reconciled_at
        if at is None:
            return math.nan
        return max(0.0, (datetime.now(UTC) - at).total_seconds())

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
