"""Counting the requests a client sends to the emulator, as the emulator saw them.

The emulator's fault rules match every API and git request and count each match down, so rules whose action
is a zero-second `delay` (the request is then handled normally) are counters kept by the server itself:
nothing in the client is hooked, and git's own HTTP requests are counted with PyGithub's. A "write" is a
mutating HTTP request: POST, PATCH, PUT or DELETE (a push is one POST to `git-receive-pack`; the
`info/refs` advertisement before it is a GET).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

# Enough that no rule runs out during a measurement (a rule at zero is removed and would stop counting).
_BUDGET = 1_000_000
# First matching rule wins, so the push rule comes before the catch-all POST rule.
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("push", "POST", r"/git-receive-pack$"),
    ("POST", "POST", r"."),
    ("PATCH", "PATCH", r"."),
    ("PUT", "PUT", r"."),
    ("DELETE", "DELETE", r"."),
    ("GET", "GET", r"."),
)
WRITES = ("push", "POST", "PATCH", "PUT", "DELETE")
# The same, with git's fetches apart: a clone or fetch negotiates its pack in a POST to `git-upload-pack`, a read
# that no write spacing applies to (the worker's mirror fetches go through git, never through the API client).
COUNTERS_FETCH_APART: tuple[tuple[str, str, str], ...] = (("fetch", "POST", r"/git-upload-pack$"), *COUNTERS)


class FaultRules(Protocol):
    """A forge's fault rules, as its admin API serves them (:class:`infra.forge.testing.ForgeHandle`, or
    :class:`ForgeAdmin` for a forge running in a process of its own)."""

    def set_faults(self, *faults: dict[str, Any]) -> list[dict[str, Any]]: ...

    def faults(self) -> list[dict[str, Any]]: ...

    def clear_faults(self) -> None: ...


@dataclass(frozen=True)
class ForgeAdmin:
    """The fault rules of the emulator serving ``api_url`` (its API root, ``.../api/v3``), through its admin API
    with ``admin_token``: for a forge another process started (the embedded stack's)."""

    api_url: str
    admin_token: str

    def _call(self, method: str, body: Any = None) -> Any:
        headers = {"Authorization": f"token {self.admin_token}", "Accept": "application/vnd.github+json"}
        resp = httpx.request(method, f"{self.api_url}/admin/faults", json=body, headers=headers, timeout=30)
        resp.raise_for_status()
        return resp.json() if resp.content else None

    def set_faults(self, *faults: dict[str, Any]) -> list[dict[str, Any]]:
        return [self._call("POST", fault) for fault in faults]

    def faults(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._call("GET")
        return found

    def clear_faults(self) -> None:
        self._call("DELETE")


@dataclass
class RequestCounts:
    """Requests by kind (`push` apart from other POSTs), filled in when the `counting` block ends."""

    by_kind: dict[str, int] = field(default_factory=dict)

    @property
    def writes(self) -> int:
        return sum(self.by_kind.get(kind, 0) for kind in WRITES)

    @property
    def reads(self) -> int:
        return self.by_kind.get("GET", 0)


@contextmanager
def counting(handle: FaultRules, counters: Sequence[tuple[str, str, str]] = COUNTERS) -> Iterator[RequestCounts]:
    """Count what reaches `handle`'s forge inside the block, by the kinds of ``counters`` (kind, method, path
    regex; the first that matches counts a request). Clears the forge's fault rules before and after: do not
    combine with other faults."""
    handle.clear_faults()
    rules = handle.set_faults(
        *(
            {"method": method, "path_regex": regex, "action": "delay", "seconds": 0, "count": _BUDGET}
            for _, method, regex in counters
        )
    )
    kinds = {rule["id"]: kind for rule, (kind, _, _) in zip(rules, counters, strict=True)}
    counts = RequestCounts()
    try:
        yield counts
    finally:
        left = {rule["id"]: rule["count"] for rule in handle.faults()}
        handle.clear_faults()
        counts.by_kind = {kind: _BUDGET - left.get(rule_id, 0) for rule_id, kind in kinds.items()}
