"""Fault injection: rules that make matching requests fail the way GitHub and networks fail.

Rules live in memory (a restart clears them) and are consumed: each match decrements ``count`` and a rule at
zero is gone. Matching is on the method and ``re.search`` of ``path_regex`` against the URL path, for API and
git requests alike; the fault admin endpoint itself is never matched, so faults can always be cleared.

Actions:

- ``status``: answer ``status`` (500, 502 or 503) before the request is applied.
- ``delay``: sleep ``seconds``, then handle the request normally.
- ``drop_after_apply``: apply and commit the request, then close the socket without any response.
- ``secondary_rate_limit``: 403 with ``retry-after`` and GitHub's secondary rate-limit message.
- ``rate_limit_429``: 429 with ``retry-after``.
- ``primary_rate_limit``: 403 with ``x-ratelimit-remaining: 0`` and ``x-ratelimit-reset``.
- ``error``: answer ``status`` (400-599) with GitHub's error body carrying ``message``, before the request is
  applied: for answers GitHub gives at moments a test cannot arrange, such as 405 "Base branch was modified.
  Review and try the merge again." when the base moves during a merge.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from .wire import ApiError, invalid_field

ACTIONS = (
    "status",
    "delay",
    "drop_after_apply",
    "secondary_rate_limit",
    "rate_limit_429",
    "primary_rate_limit",
    "error",
)
SECONDARY_MESSAGE = (
    "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If you reach "
    "out to GitHub Support for help, please include the request ID {request_id}."
)
SECONDARY_DOCS = "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"
PRIMARY_MESSAGE = (
    "API rate limit exceeded for user ID {user_id}. If you reach out to GitHub Support for help, please "
    "include the request ID {request_id}."
)
PRIMARY_DOCS = "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-primary-rate-limits"


@dataclass
class Fault:
    id: int
    method: str
    path_regex: str
    count: int
    action: str
    status: int = 503
    seconds: float = 0.0
    retry_after: int = 1
    reset_in: int = 60
    message: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_fault(fault_id: int, data: dict[str, Any]) -> Fault:
    """A rule from its JSON form; invalid fields are GitHub-style 422s."""
    method = data.get("method", "*")
    path_regex = data.get("path_regex")
    action = data.get("action")
    count = data.get("count", 1)
    if not isinstance(method, str):
        raise invalid_field("Fault", "method")
    if not isinstance(path_regex, str):
        raise invalid_field("Fault", "path_regex", "missing_field")
    try:
        re.compile(path_regex)
    except re.error as exc:
        raise invalid_field("Fault", "path_regex") from exc
    if action not in ACTIONS:
        raise invalid_field("Fault", "action")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise invalid_field("Fault", "count")
    fault = Fault(fault_id, method.upper(), path_regex, count, str(action))
    for name, kind in (("status", int), ("seconds", (int, float)), ("retry_after", int), ("reset_in", int)):
        if name in data:
            value = data[name]
            if not isinstance(value, kind) or isinstance(value, bool) or value < 0:
                raise invalid_field("Fault", name)
            setattr(fault, name, value)
    if action == "status" and fault.status not in (500, 502, 503):
        raise invalid_field("Fault", "status")
    if action == "error":
        if not 400 <= fault.status <= 599:
            raise invalid_field("Fault", "status")
        message = data.get("message")
        if not isinstance(message, str) or not message:
            raise invalid_field("Fault", "message", "missing_field")
        fault.message = message
    return fault


class FaultRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._next_id = 1

    def add(self, data: dict[str, Any]) -> Fault:
        with self._lock:
            fault = parse_fault(self._next_id, data)
            self._next_id += 1
            self._faults.append(fault)
            return fault

    def list(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def take(self, method: str, path: str) -> Fault | None:
        """Consume one firing of the first rule matching the request, if any."""
        with self._lock:
            for fault in self._faults:
                if fault.method in ("*", method) and re.search(fault.path_regex, path):
                    fault.count -= 1
                    if fault.count <= 0:
                        self._faults.remove(fault)
                    return fault
        return None


def error_before_apply(fault: Fault, request_id: str, user_id: int | None) -> ApiError | None:
    """The answer a fault gives instead of handling the request; None when the request proceeds."""
    if fault.action == "delay":
        time.sleep(fault.seconds)
        return None
    if fault.action == "status":
        message = {500: "Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}[fault.status]
        return ApiError(fault.status, message)
    if fault.action in ("secondary_rate_limit", "rate_limit_429"):
        return ApiError(
            403 if fault.action == "secondary_rate_limit" else 429,
            SECONDARY_MESSAGE.format(request_id=request_id),
            headers={"retry-after": str(fault.retry_after)},
            documentation_url=SECONDARY_DOCS,
        )
    if fault.action == "error":
        return ApiError(fault.status, fault.message)
    if fault.action == "primary_rate_limit":
        headers = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(time.time()) + fault.reset_in)}
        return ApiError(
            403,
            PRIMARY_MESSAGE.format(user_id=user_id or 0, request_id=request_id),
            headers=headers,
            documentation_url=PRIMARY_DOCS,
        )
    return None
