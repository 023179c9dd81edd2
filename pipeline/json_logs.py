"""Log records as JSON lines: the formatter the receiver's and the worker's logs share.

Contract: one record is one JSON object on one line (``ensure_ascii``, so a value cannot split or forge a
line): ``time`` (UTC, milliseconds), ``level``, ``logger``, what :meth:`JsonFormatter.fields` adds, and for an
exception its type and the last frames' file, line and function, never its message (an exception's text may
quote a payload or a repository's output).
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


class JsonFormatter(logging.Formatter):
    """A record as one JSON object (see the module's contract); subclasses say what else a line carries."""

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        """What the line carries besides time, level, logger and error: the record's message here."""
        return {"msg": record.getMessage()}

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        line.update(self.fields(record))
        if record.exc_info and record.exc_info[0] is not None:
            # The type and where it was raised, not the message: an exception's text may quote the payload.
            line["error"] = record.exc_info[0].__name__
            frames = traceback.extract_tb(record.exc_info[2])[-6:]
            line["where"] = [f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in frames]
        return json.dumps(line, ensure_ascii=True, default=str)


def to_stderr(logger: logging.Logger, formatter: logging.Formatter, level: int, *, propagate: bool = False) -> None:
    """Give ``logger`` one stderr handler with ``formatter`` at ``level`` (once per process: a second call
    changes nothing), not propagating unless asked (a root handler of the host would print each line twice)."""
    if any(getattr(h, "_durafix_stderr", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    handler._durafix_stderr = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = propagate
