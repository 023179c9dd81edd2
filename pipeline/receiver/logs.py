"""One JSON line per webhook delivery on stderr, through :mod:`logging`.

Contract: each answered request to ``/webhook`` is logged once by :func:`log_delivery` with its delivery ID,
event, action, status, duration in milliseconds and the answer's ``message``. Never the payload, a header
other than those, or a secret. Values a client chose (delivery ID, event) are cut to a bounded length and
JSON-escaped, so a line cannot be forged or split by what was sent.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

LOGGER_NAME = "durafix.webhooks"
_FIELDS = ("delivery", "event", "action", "status", "duration_ms", "message")
_MAX_FIELD = 200


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: time, level, logger, the delivery fields it carries, and ``msg`` for other
    records; for an exception its type and the last frames' file, line and function, never its message."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "delivery_fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        else:
            line["msg"] = record.getMessage()
        if record.exc_info and record.exc_info[0] is not None:
            # The type and where it was raised, not the message: an exception's text may quote the payload.
            line["error"] = record.exc_info[0].__name__
            frames = traceback.extract_tb(record.exc_info[2])[-6:]
            line["where"] = [f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in frames]
        return json.dumps(line, ensure_ascii=True, default=str)


def delivery_logger() -> logging.Logger:
    """The receiver's logger, writing JSON lines to stderr; its handler is installed once per process, and it
    does not propagate (a root handler of the host would print each delivery twice). uvicorn's own warnings
    and errors go through the same handler, so stderr holds JSON lines only."""
    logger = logging.getLogger(LOGGER_NAME)
    _json_to_stderr(logger, logging.INFO)
    _json_to_stderr(logging.getLogger("uvicorn.error"), logging.WARNING)
    return logger


def _json_to_stderr(logger: logging.Logger, level: int) -> None:
    if not any(getattr(h, "_durafix_json", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        handler._durafix_json = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False


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
