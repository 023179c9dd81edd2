"""Counting the requests a client sends to the emulator, as the emulator saw them.

The emulator's fault rules match every API and git request and count each match down, so rules whose action
is a zero-second `delay` (the request is then handled normally) are counters kept by the server itself:
nothing in the client is hooked, and git's own HTTP requests are counted with PyGithub's. A "write" is a
mutating HTTP request: POST, PATCH, PUT or DELETE (a push is one POST to `git-receive-pack`; the
`info/refs` advertisement before it is a GET).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from infra.forge.testing import ForgeHandle

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
def counting(handle: ForgeHandle) -> Iterator[RequestCounts]:
    """Count what reaches `handle`'s forge inside the block. Clears the forge's fault rules before and after:
    do not combine with other faults."""
    handle.clear_faults()
    rules = handle.set_faults(
        *(
            {"method": method, "path_regex": regex, "action": "delay", "seconds": 0, "count": _BUDGET}
            for _, method, regex in COUNTERS
        )
    )
    kinds = {rule["id"]: kind for rule, (kind, _, _) in zip(rules, COUNTERS, strict=True)}
    counts = RequestCounts()
    try:
        yield counts
    finally:
        left = {rule["id"]: rule["count"] for rule in handle.faults()}
        handle.clear_faults()
        counts.by_kind = {kind: _BUDGET - left.get(rule_id, 0) for rule_id, kind in kinds.items()}
