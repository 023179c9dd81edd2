"""Failure classes: what an activity's failure means to the run, and whether Temporal retries it.

An activity raises ``FailureClass.X.error(message)``, an ``ApplicationError`` whose ``type`` is the class's
value; the workflow reads it back with :func:`failure_class` and matches on the enum. The retry policy's
non-retryable list is derived from :attr:`FailureClass.retryable` (:data:`NON_RETRYABLE`), so the two never
disagree. Which capability exception becomes which class is one table, in ``pipeline/activities/classify.py``.

The class values are the ``type`` strings recorded in workflow histories: never rename one.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum

from temporalio.exceptions import ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError


class FailureClass(StrEnum):
    TRANSIENT = "Transient"
    """Retried with exponential backoff (5xx, 429, connection refused); a wait the remote named
    (``retry-after``) becomes the next attempt's delay."""
    AMBIGUOUS = "Ambiguous"
    """A mutation whose outcome is unknown. Retried, but every activity that can end ambiguous is an
    ensure/conditional operation whose next attempt starts by reading external truth, so the retry is a
    reconciliation, never a blind re-send. When attempts run out the run ends ``ambiguous-needs-human``."""
    PERMANENT = "Permanent"
    """Never retried: 401, 403, 404, invalid input, a patch that does not apply, missing evidence."""
    POLICY = "Policy"
    """Never retried; a human must decide (a foreign PR on our branch, a fenced run, a moved remote ref)."""
    ENVIRONMENT_GONE = "EnvironmentGone"
    """The environment died behind our back; not retried as such, the workflow provisions a new one."""
    INFRASTRUCTURE = "Infrastructure"
    """Our own machinery failed (a browser crash): retried, never reported as a finding about the bug."""
    NOT_READY = "NotReady"
    """The app did not become ready: a finding about this revision (or its patch), not retried blindly."""
    NO_PATCH = "NoPatch"
    """The model produced no usable patch: the attempt is spent, the repair loop goes on."""
    BUDGET = "Budget"
    """A budget (tokens, turns) ran out: the repair loop ends."""
    PROCEDURE_INVALID = "ProcedureInvalid"
    """No usable reproduction procedure: the report needs a human, retrying cannot help."""

    @property
    def retryable(self) -> bool:
        return self in _RETRYABLE

    def error(self, message: str, *details: object, retry_after_s: float | None = None) -> ApplicationError:
        """The ``ApplicationError`` an activity raises for this class (``details`` ride along to the workflow)."""
        return ApplicationError(
            message,
            *details,
            type=self.value,
            non_retryable=not self.retryable,
            next_retry_delay=timedelta(seconds=retry_after_s) if retry_after_s else None,
        )


# A ``NoPatch`` failure's details name its kind under this key: the model's edits cancel out (``no-op``), or it
# declined to change anything or the patch policy refused its patch (``refused``). Failures recorded before it
# name none.
NO_PATCH_KIND = "no_patch"
NO_OP = "no-op"
REFUSED = "refused"

WORKER_LOST = "WorkerLost"
"""The ``ApplicationError`` type of an attempt failed because its worker process died (retryable): the failure
is said by the dead worker's supervisor (``pipeline.worker.supervisor``), so the host it ran on was alive to say it."""

_RETRYABLE = frozenset({FailureClass.TRANSIENT, FailureClass.AMBIGUOUS, FailureClass.INFRASTRUCTURE})

NON_RETRYABLE: list[str] = [c.value for c in FailureClass if not c.retryable]


def causes(err: BaseException) -> list[BaseException]:
    """``err`` and its causes (``__cause__``), outermost first."""
    chain: list[BaseException] = []
    cause: BaseException | None = err
    while cause is not None:
        chain.append(cause)
        cause = cause.__cause__
    return chain


def failure_class(err: BaseException) -> FailureClass | None:
    """The class an activity failed with, or None (a timeout, a cancellation, an unclassified error)."""
    for cause in causes(err):
        if isinstance(cause, ApplicationError) and cause.type:
            try:
                return FailureClass(cause.type)
            except ValueError:
                return None
        if isinstance(cause, TemporalTimeoutError):
            return None
    return None


def failure_kind(err: BaseException) -> str:
    """What stopped a step, for a person: the failure class, which timeout (schedule-to-start,
    start-to-close, heartbeat, schedule-to-close), or the error's own type."""
    for cause in causes(err):
        if isinstance(cause, ApplicationError) and cause.type:
            return cause.type
        if isinstance(cause, TemporalTimeoutError) and cause.type is not None:
            return f"Timeout:{cause.type.name.lower().replace('_', '-')}"
    return type(err).__name__


def failure_message(err: BaseException) -> str:
    """The innermost non-empty message of the error's cause chain (the activity's own words)."""
    last = str(err)
    for cause in causes(err):
        last = str(cause) or last
    return last


def failure_details(err: BaseException) -> tuple[object, ...]:
    """The details the activity attached to its ``ApplicationError`` (empty when none)."""
    for cause in causes(err):
        if isinstance(cause, ApplicationError) and cause.details:
            return tuple(cause.details)
    return ()


def worker_lost(err: BaseException) -> bool:
    """The last attempt behind ``err`` (an activity's failure) failed because its worker process died
    (:data:`WORKER_LOST`). Only the direct cause counts: a timeout's own cause names the attempt before it, so
    a step whose last attempt timed out after an earlier one was lost is a timeout, not a loss."""
    cause = err.__cause__
    return isinstance(cause, ApplicationError) and cause.type == WORKER_LOST
