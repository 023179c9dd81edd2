"""When a signed webhook delivery is a replay: older than the age window, or older than the run it would act on.

A delivery's HMAC proves GitHub signed its body once, not when, and its GUID (``X-GitHub-Delivery``) is a header
outside the signature: whoever kept a delivery (a log, a proxy in front of the receiver) can post it again,
with its GUID or any other. So a delivery that starts or cancels a run is judged by the time its signed payload
says it happened (:func:`event_time`), besides its GUID:

- too old (:func:`too_old`): more than ``delivery_max_age_s`` (``DURAFIX_DELIVERY_MAX_AGE_S``, 3 days by
  default) before now. A run's records in Temporal (its trigger memo, its ``RunState.deliveries``) recognise a
  GUID only while the namespace keeps the run, so the window must not exceed the namespace's retention;
- older than the run it would act on (:func:`before_run`): an ``issues`` ``closed``/``unlabeled`` or a
  ``/durafix cancel`` from before the live run started is about an earlier run (runs of an issue never
  overlap), and so is a trigger from before the start of the issue's newest, ended run: it cannot be the
  request for a run after it.

GitHub's timestamps are whole seconds: an event stamped ``t`` happened in ``[t, t + 1 s)``, so it counts as
before a run only when ``t + 1 s`` is not after the run's start. A legitimate event is never refused by that; a
replay of one within the same second as the next run's start is left to the GUID records.

A payload without its timestamp is not judged by age (GitHub's own always carry it, so a replay of one does);
one whose timestamp is not ISO 8601 is malformed (``ValueError``, answered 400 by the dispatcher).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

FORGE_TICK = timedelta(seconds=1)

# Where each event's payload says when it happened. For ``issues`` the issue's ``updated_at``: labelling,
# unlabelling, closing and reopening each set it to the event's time.
STAMPS: dict[str, tuple[str, str]] = {
    "issues": ("issue", "updated_at"),
    "issue_comment": ("comment", "created_at"),
    "pull_request_review": ("review", "submitted_at"),
    "pull_request": ("pull_request", "updated_at"),
}


def event_time(event: str, payload: dict[str, Any]) -> datetime | None:
    """When the delivery's event happened, by its payload; None when the payload does not say."""
    where = STAMPS.get(event)
    if where is None:
        return None
    holder = payload.get(where[0])
    value = holder.get(where[1]) if isinstance(holder, dict) else None
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{where[0]}.{where[1]} is not a timestamp: {value!r}")
    at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if at.tzinfo is None:
        raise ValueError(f"{where[0]}.{where[1]} has no time zone: {value!r}")
    return at


def too_old(at: datetime | None, now: datetime, max_age_s: float) -> bool:
    """Whether an event at ``at`` is more than ``max_age_s`` before ``now``."""
    return at is not None and at + timedelta(seconds=max_age_s) < now


def before_run(at: datetime | None, run_started_at: datetime | None) -> bool:
    """Whether an event stamped ``at`` certainly happened before a run that started at ``run_started_at``."""
    return at is not None and run_started_at is not None and at + FORGE_TICK <= run_started_at


def stale_answer(what: str, at: datetime, why: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    """The answer to a delivery refused as a replay: 409, ``stale``, saying when it happened and why it counts
    as stale; nothing was started or cancelled."""
    return 409, {
        "stale": True,
        "event_at": at.isoformat(),
        **extra,
        "message": f"{what} of {at.isoformat()} is {why}: a replay, nothing was started or cancelled",
    }
