"""Raising classified activity failures (see :mod:`pipeline.policies` for what each class means)."""

from __future__ import annotations

from datetime import timedelta

from temporalio.exceptions import ApplicationError


def transient(message: str, retry_after_s: float | None = None) -> ApplicationError:
    """Retried with backoff; when the remote named a wait, the next attempt waits at least that long."""
    delay = timedelta(seconds=retry_after_s) if retry_after_s else None
    return ApplicationError(message, type="Transient", next_retry_delay=delay)


def ambiguous(message: str) -> ApplicationError:
    """Retried, and the next attempt starts by reconciling against external truth."""
    return ApplicationError(message, type="Ambiguous")


def permanent(message: str) -> ApplicationError:
    return ApplicationError(message, type="Permanent", non_retryable=True)


def policy(message: str) -> ApplicationError:
    """A human must decide; never retried."""
    return ApplicationError(message, type="Policy", non_retryable=True)


def environment_gone(message: str) -> ApplicationError:
    """The environment died behind our back; the workflow provisions a new one."""
    return ApplicationError(message, type="EnvironmentGone", non_retryable=True)


def infrastructure(message: str) -> ApplicationError:
    """Our own machinery failed (a browser crash); retried, never reported as a finding about the bug."""
    return ApplicationError(message, type="Infrastructure")


def no_patch(message: str) -> ApplicationError:
    return ApplicationError(message, type="NoPatch", non_retryable=True)


def not_ready(message: str) -> ApplicationError:
    """The app did not become ready: a finding about this revision (or its patch), not retried blindly."""
    return ApplicationError(message, type="NotReady", non_retryable=True)


def budget(message: str) -> ApplicationError:
    """A budget (tokens, turns) ran out: the repair loop ends, it is not retried."""
    return ApplicationError(message, type="Budget", non_retryable=True)


def procedure_invalid(message: str) -> ApplicationError:
    """No usable reproduction procedure: the report needs a human, retrying cannot help."""
    return ApplicationError(message, type="ProcedureInvalid", non_retryable=True)
