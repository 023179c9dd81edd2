"""One JSON line per webhook delivery on stderr, through :mod:`logging`.

Contract: each answered request to ``/webhook`` is logged once by :func:`log_delivery` with its delivery ID,
event, action, status, duration in milliseconds and the answer's ``message``. Never the payload, a header
other than those, or a secret. Values a client chose (delivery ID, event) are cut to a bounded length and
JSON-escaped, so a line cannot be forged or split by what was sent.
"""

from __future__ import annotations

import logging
from typing import Any

from pipeline.json_logs import JsonFormatter, to_stderr

LOGGER_NAME = "durafix.webhooks"
_FIELDS = ("delivery", "event", "action", "status", "duration_ms", "message")
_MAX_FIELD = 200


class DeliveryFormatter(JsonFormatter):
    """A delivery's line carries the delivery fields it was logged with; any other record its ``msg``."""

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        fields = getattr(record, "delivery_fields", None)
        return dict(fields) if isinstance(fields, dict) else super().fields(record)


def delivery_logger() -> logging.Logger:
    """The receiver's logger, writing JSON lines to stderr; its handler is installed once per process, and it
    does not propagate (a root handler of the host would print each delivery twice). uvicorn's own warnings
    and errors go through the same handler, so stderr holds JSON lines only."""
    logger = logging.getLogger(LOGGER_NAME)
    to_stderr(logger, DeliveryFormatter(), logging.INFO)
    to_stderr(logging.getLogger("uvicorn.error"), DeliveryFormatter(), logging.WARNING)
    return logger


def _bounded(value: object) -> object:
    if isinstance(value, str) and len(value) > _MAX_FIELD:
        return value[:_MAX_FIELD] + "…"
    return value


def log_delivery(
    logger: logging.Logger,
    *,
    delivery: str,
    event: str,
    action: str,
    status: int,
    duration_ms: float,
    message: object,
) -> None:
    """Log one answered delivery (see the module's contract)."""
    fields = {
        "delivery": _bounded(delivery),
        "event": _bounded(event),
        "action": _bounded(action),
        "status": status,
        "duration_ms": round(duration_ms, 1),
        "message": _bounded(message if isinstance(message, str) else ""),
    }
    logger.info("webhook delivery", extra={"delivery_fields": fields})
