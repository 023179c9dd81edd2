"""The requests the reproduction browser blocked, read back from a revision's stored ``log.json``.

The runner writes, at the top of its log, ``allowed_origins`` (the app's first), ``blocked_requests`` (each
with ``run``, ``method``, ``url``, ``resource_type``), ``blocked_dropped`` (how many more were blocked than
listed) and ``chromium_sandbox`` (``docs/browser.md``). The log is as untrusted as the page it recorded: an
entry of the wrong shape is skipped, and a log that cannot be read gives nothing, never an exception
(except a failed integrity check).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from evidence.bundle import RevisionEvidence
from evidence.interface import ArtifactStore
from evidence.observations import MAX_LOG_BYTES


@dataclass(frozen=True)
class BlockedRequest:
    run: int
    method: str
    url: str
    resource_type: str


@dataclass
class BlockedRequests:
    """What one revision's reproduction blocked; ``sandbox`` is None when the log does not say."""

    requests: list[BlockedRequest] = field(default_factory=list)
    dropped: int = 0
    allowed_origins: list[str] = field(default_factory=list)
    sandbox: bool | None = None

    @property
    def total(self) -> int:
        return len(self.requests) + self.dropped


def read_blocked_requests(side: RevisionEvidence, store: ArtifactStore) -> BlockedRequests:
    """The blocked requests in the first of ``side``'s logs that is a reproduction log (raises
    :class:`IntegrityError` when a log's bytes do not match its sha256)."""
    for ref in side.logs:
        if ref.size > MAX_LOG_BYTES:
            continue
        try:
            document = json.loads(store.read_bytes(ref))
        except (UnicodeDecodeError, ValueError):
            continue
        if isinstance(document, dict) and isinstance(document.get("runs"), list):
            return _from_log(document)
    return BlockedRequests()


def _from_log(document: dict[str, Any]) -> BlockedRequests:
    found = BlockedRequests()
    for entry in _list(document.get("blocked_requests")):
        if not isinstance(entry, dict):
            continue
        run, method, url, kind = (entry.get(k) for k in ("run", "method", "url", "resource_type"))
        if isinstance(run, int) and all(isinstance(v, str) for v in (method, url, kind)):
            found.requests.append(BlockedRequest(run=run, method=str(method), url=str(url), resource_type=str(kind)))
    dropped = document.get("blocked_dropped")
    found.dropped = dropped if isinstance(dropped, int) and dropped > 0 else 0
    found.allowed_origins = [o for o in _list(document.get("allowed_origins")) if isinstance(o, str)]
    sandbox = document.get("chromium_sandbox")
    found.sandbox = sandbox if isinstance(sandbox, bool) else None
    return found


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
