"""The one table from capability exceptions to failure classes, used by every adapter.

An adapter wraps its work in :func:`classified`: an exception listed here leaves the activity as the
``ApplicationError`` of its :class:`~pipeline.failures.FailureClass`, with the message the table gives it.
Rules are tried in order, so a subclass comes before its base. An exception no rule names propagates as it
is (Temporal retries it under its own type name): an unknown error is not guessed to be permanent.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from browser.results import BrowserInfraError
from environments.checks import SetupError
from environments.git import GitError, GitInterrupted, GitProtocolError
from environments.interface import NoAppError, NotReadyError, ResourceConflictError, RunFencedError
from environments.mirror import RevisionNotFoundError
from environments.spec import RecipeError
from environments.workspace import PatchError, TreeMismatchError
from evidence.interface import ArtifactMissingError, IntegrityError
from pipeline.failures import FailureClass
from repair.interface import ModelTransientError, NoPatchError, RepairBudgetError, RepairError
from repair.procedure_draft import ProcedureDraftError
from reviews.errors import (
    ForgeAmbiguousError,
    ForgeConflictError,
    ForgeError,
    ForgeTransientError,
)


@dataclass(frozen=True)
class Rule:
    """``errors`` become ``failure``; ``message`` is formatted with ``{err}`` and ``{type}`` (the class name);
    ``retry_after`` names the exception's attribute holding the wait the remote asked for, if any."""

    errors: tuple[type[Exception], ...]
    failure: FailureClass
    message: str
    retry_after: str | None = None


F = FailureClass
RULES: tuple[Rule, ...] = (
    # forge (reviews)
    Rule((ForgeTransientError,), F.TRANSIENT, "forge: {err}", retry_after="retry_after_s"),
    Rule((ForgeAmbiguousError,), F.AMBIGUOUS, "forge: {err}"),
    Rule((ForgeConflictError,), F.POLICY, "forge conflict: {err}"),
    Rule((ForgeError,), F.PERMANENT, "forge: {err}"),
    # environments
    Rule((RunFencedError,), F.POLICY, "run fenced: {err}"),
    Rule((ResourceConflictError,), F.POLICY, "resource conflict: {err}"),
    Rule((NotReadyError,), F.NOT_READY, "{err}"),
    # A recipe without `start` asked for its app: a finding about the recipe, which retrying cannot change.
    Rule((NoAppError,), F.NOT_READY, "{err}"),
    # A setup that fails is a finding about the revision's recipe (the app cannot be built), like NotReady.
    Rule((SetupError,), F.NOT_READY, "setup failed: {err}"),
    Rule((RecipeError, PatchError, TreeMismatchError, RevisionNotFoundError), F.PERMANENT, "{type}: {err}"),
    # A refusal the remote will give again (401/403/404, "not our ref", a protocol error) is not retried; a
    # transport failure (connection, timeout, 5xx) is.
    Rule((GitProtocolError,), F.PERMANENT, "git: {err}"),
    # A git killed by a signal says nothing about the repository either: tried again.
    Rule((GitError, GitInterrupted), F.TRANSIENT, "git: {err}"),
    # browser
    Rule((BrowserInfraError,), F.INFRASTRUCTURE, "browser failed: {err}"),
    # model (repair)
    Rule((ModelTransientError,), F.TRANSIENT, "model: {err}", retry_after="retry_after"),
    Rule((ProcedureDraftError,), F.PROCEDURE_INVALID, "no valid procedure drafted: {err}"),
    Rule((RepairBudgetError,), F.BUDGET, "model budget: {err}"),
    Rule((NoPatchError,), F.NO_PATCH, "no patch: {err}"),
    Rule((RepairError,), F.PERMANENT, "model: {err}"),
    # evidence
    Rule((ArtifactMissingError, IntegrityError), F.PERMANENT, "{err}"),
)


def rule_for(err: BaseException) -> Rule | None:
    return next((rule for rule in RULES if isinstance(err, rule.errors)), None)


def as_failure(err: Exception, *details: object) -> Exception:
    """``err`` as its failure class's ``ApplicationError`` (with ``details``), or ``err`` itself when no rule
    names it."""
    rule = rule_for(err)
    if rule is None:
        return err
    wait = getattr(err, rule.retry_after, None) if rule.retry_after else None
    text = rule.message.format(err=err, type=type(err).__name__)
    return rule.failure.error(text, *details, retry_after_s=wait)


@contextmanager
def classified() -> Iterator[None]:
    """Re-raise what the block raises as its failure class (see :data:`RULES`)."""
    try:
        yield
    except Exception as err:
        failure = as_failure(err)
        if failure is err:
            raise
        raise failure from err
