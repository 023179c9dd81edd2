"""The server's record of every API request, one JSON object per line in ``<data_dir>/requests.jsonl``.

The file is the single source of truth: ``GET /_admin/requests`` reads it back, and a server restarted on the
same data dir keeps appending (sequence numbers continue). Header names are recorded in lower case; the
``Authorization`` header is never written.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


class RequestLog:
    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / "requests.jsonl"
        self._lock = threading.Lock()
        self._seq = len(self._load())

    def append(self, record: dict[str, Any]) -> dict[str, Any]:
        """Stamp ``record`` with the next sequence number and the time, and append it."""
        with self._lock:
            self._seq += 1
            stamped = {"seq": self._seq, "at": datetime.now(UTC).isoformat(), **record}
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(stamped, ensure_ascii=False) + "\n")
            return stamped

    def read(self) -> list[dict[str, Any]]:
        # Under the lock so a reader never sees a half-written line.
        with self._lock:
            return self._load()

    def _load(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open(encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
