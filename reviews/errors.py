"""The forge adapter's failure classes and how GitHub's answers map onto them.

Every failure leaving the adapter is one of four classes, so callers (Temporal retry policies) decide
without parsing messages:

- `ForgeTransientError`: nothing changed, or the operation is safe to run again as a whole; retry after
  `retry_after_s` when given (rate limits), with backoff otherwise. Includes 405 "Base branch was modified",
  GitHub's answer when a push to the base lands during a merge.
- `ForgePermanentError`: retrying cannot help (bad credentials, no permission, not found, invalid input);
  subclasses name the cases a caller may act on: `ForgeNotFoundError` (404), `ForgeEmptyRepositoryError`
  (409 on a repository nothing was pushed to), `ForgeMergeMethodError` (405, the repository refuses the method).
- `ForgeConflictError`: a precondition on GitHub's state failed (ref exists, not a fast forward, head
  moved, someone else's object in the way); escalate or re-plan, never blind-retry.
- `ForgeAmbiguousError`: a mutation was sent and its outcome is unknown; the operation could not settle it
  by reading GitHub's state. A later call of the same operation reconciles before writing again.
"""

from __future__ import annotations

import re
import time
from typing import Any, ClassVar

import requests
import urllib3.exceptions
from github import GithubException

# GitHub documents waiting at least a minute when a secondary limit carries no retry-after.
SECONDARY_LIMIT_DEFAULT_WAIT_S = 60.0

EMPTY_REPOSITORY = "git repository is empty"
BASE_MODIFIED = "base branch was modified"
# "Merge commits are not allowed on this repository." / "Squash merges ..." / "Rebase merges ..."
METHOD_REFUSED = re.compile(r"\b(merge commits|squash merges|rebase merges) are not allowed on this repository", re.I)

_CONFLICT_MESSAGES = (
    "reference already exists",
    "update is not a fast forward",
    "a pull request already exists",
    "head branch was modified",
)


class ForgeError(Exception):
    """Base class: `status` is GitHub's HTTP status (None without a response), `github_message` its text."""

    kind: ClassVar[str] = "forge"

    def __init__(
        self,
        description: str,
        *,
        status: int | None = None,
        github_message: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(description)
        self.description = description
        self.status = status
        self.github_message = github_message
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.description, self.status, self.github_message, self.retry_after_s))


def _rebuild(
    cls: type[ForgeError],
    description: str,
    status: int | None,
    github_message: str | None,
    retry_after_s: float | None,
) -> ForgeError:
    return cls(description, status=status, github_message=github_message, retry_after_s=retry_after_s)


class ForgeTransientError(ForgeError):
    kind = "transient"


class ForgePermanentError(ForgeError):
    kind = "permanent"


class ForgeNotFoundError(ForgePermanentError):
    """404: the object does not exist or the token cannot see it (GitHub hides private repos as 404)."""


class ForgeEmptyRepositoryError(ForgePermanentError):
    """409 "Git Repository is empty.": nothing was ever pushed, so no ref, commit or tree exists and none can be
    written through the API; the first commit has to arrive by a push. Reads of refs treat it as "not there"."""


class ForgeMergeMethodError(ForgePermanentError):
    """405 "... merges are not allowed on this repository.": the repository's settings refuse the merge method
    asked for. A setting, not the pull request's state: retrying with the same method cannot help."""


class ForgeConflictError(ForgeError):
    kind = "conflict"


class ForgeAmbiguousError(ForgeError):
    kind = "ambiguous"


def github_message_of(exc: GithubException) -> str | None:
    """GitHub's message, including the first custom `errors[].message` of a 422 when present."""
    data = exc.data if isinstance(exc.data, dict) else {}
    message = data.get("message")
    details = [e.get("message") for e in data.get("errors") or [] if isinstance(e, dict) and e.get("message")]
    parts = [str(p) for p in (message, *details) if p]
    return ": ".join(parts) if parts else None


def _header(headers: dict[str, Any] | None, name: str) -> str | None:
    for key, value in (headers or {}).items():
        if key.lower() == name:
            return str(value)
    return None


def rate_limit_wait_s(status: int, headers: dict[str, Any] | None, message: str) -> float | None:
    """Seconds to wait if this answer is a rate limit, else None.

    Secondary limits: `retry-after` seconds (a minute when absent). Primary limits:
    `x-ratelimit-remaining: 0` with `x-ratelimit-reset` epoch seconds.
    """
    if status not in (403, 429):
        return None
    retry_after = _header(headers, "retry-after")
    if retry_after is not None:
        try:
            return max(0.0, float(retry_after))
        except ValueError:
            return SECONDARY_LIMIT_DEFAULT_WAIT_S
    if _header(headers, "x-ratelimit-remaining") == "0":
        reset = _header(headers, "x-ratelimit-reset")
        try:
            return max(0.0, float(reset) - time.time()) if reset is not None else SECONDARY_LIMIT_DEFAULT_WAIT_S
        except ValueError:
            return SECONDARY_LIMIT_DEFAULT_WAIT_S
    lowered = message.lower()
    if status == 429 or "rate limit" in lowered:
        return SECONDARY_LIMIT_DEFAULT_WAIT_S
    return None


def from_github_exception(exc: GithubException, what: str) -> ForgeError:
    """Classify an HTTP error answer. An answer means GitHub finished the request: never ambiguous."""
    status = exc.status
    message = github_message_of(exc) or ""
    lowered = message.lower()
    description = f"{what}: HTTP {status} {message}".rstrip()
    wait = rate_limit_wait_s(status, exc.headers, message)
    if wait is not None:
        return ForgeTransientError(description, status=status, github_message=message, retry_after_s=wait)
    if status >= 500:
        return ForgeTransientError(description, status=status, github_message=message)
    if status == 404:
        return ForgeNotFoundError(description, status=status, github_message=message)
    if status == 409 and EMPTY_REPOSITORY in lowered:
        return ForgeEmptyRepositoryError(description, status=status, github_message=message)
    if status == 405 and BASE_MODIFIED in lowered:
        # GitHub lost a race with a push to the base while merging: nothing changed, and trying again can work.
        return ForgeTransientError(description, status=status, github_message=message)
    if status == 405 and METHOD_REFUSED.search(message):
        return ForgeMergeMethodError(description, status=status, github_message=message)
    if status == 409 or (status == 422 and any(m in lowered for m in _CONFLICT_MESSAGES)):
        return ForgeConflictError(description, status=status, github_message=message)
    return ForgePermanentError(description, status=status, github_message=message)


_NOT_SENT = (
    urllib3.exceptions.NewConnectionError,
    urllib3.exceptions.ConnectTimeoutError,
    urllib3.exceptions.NameResolutionError,
    ConnectionRefusedError,
)


def _never_sent(exc: BaseException) -> bool:
    """True when the failure happened while connecting, before any byte of the request left."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return True
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, _NOT_SENT):
            return True
        if isinstance(current, urllib3.exceptions.MaxRetryError):
            stack.append(current.reason)
        stack.extend(
            [current.__cause__, current.__context__, *(a for a in current.args if isinstance(a, BaseException))]
        )
    return False


def from_transport_exception(exc: requests.exceptions.RequestException, what: str, *, mutation: bool) -> ForgeError:
    """Classify a failure without an HTTP answer.

    A read, or a request that never left (connection refused, connect timeout), is transient. A mutation
    that was sent and got no answer (reset, read timeout) may or may not have been applied: ambiguous.
    """
    description = f"{what}: {type(exc).__name__}: {exc}"
    if not mutation or _never_sent(exc):
        return ForgeTransientError(description)
    return ForgeAmbiguousError(description)
