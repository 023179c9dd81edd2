"""Tokens a model activity spent across its tries, carried from one try to the next in heartbeat details.

The same carry counts the tries that failed on the transport (a ``Transient`` failure: 429, 5xx, a timeout),
so a result or a final failure also says how many of its requests were retries of that kind.

Temporal hands the last heartbeat's details of a failed try to the retry; every model activity heartbeats
``{"detail": ..., "spent": {...}}`` (also right before it fails), so a result or a final failure reports the
tokens of all its tries, and a retry is given only the budget left. Tokens of a try whose worker was killed
mid-call are unknown and not counted.
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import ApplicationError

from pipeline.activities.classify import as_failure
from pipeline.activities.heartbeat import Heartbeat
from pipeline.failures import FailureClass
from repair.interface import RepairError


class Spend(BaseModel):
    """Tokens a model activity spent, summed over its attempts so far, and how many of those attempts failed
    on the transport."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    transport_failures: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def plus(self, prompt_tokens: int, completion_tokens: int) -> Spend:
        return Spend(
            prompt_tokens=self.prompt_tokens + prompt_tokens,
            completion_tokens=self.completion_tokens + completion_tokens,
            transport_failures=self.transport_failures,
        )


def earlier_attempts_spend() -> Spend:
    """What this activity's earlier attempts spent, from the heartbeat details Temporal handed to this one."""
    for detail in reversed(activity.info().heartbeat_details):
        if isinstance(detail, dict) and isinstance(detail.get("spent"), dict):
            return Spend.model_validate(detail["spent"])
    return Spend()


def budgeted(detail: str, token_budget: int, tries: str) -> tuple[Spend, Heartbeat]:
    """What the earlier tries of this activity spent, and the heartbeat (saying ``detail``) that carries it on;
    fails as the budget's failure once they spent ``token_budget``. ``tries``: what is tried (a turn, an
    attempt), as the failure says it."""
    earlier = earlier_attempts_spend()
    beat = Heartbeat(detail, carry={"spent": earlier.model_dump()})
    if earlier.total >= token_budget:
        spent_all = FailureClass.BUDGET.error(
            f"model budget: earlier tries of this {tries} spent {earlier.total} tokens of the {token_budget} left"
        )
        raise failing(spent_all, earlier, beat)
    return earlier, beat


def failing(err: RepairError | ApplicationError, spent: Spend, beat: Heartbeat, *details: object) -> ApplicationError:
    """``err`` as its failure class, carrying every attempt's tokens so far (the workflow counts a final
    failure's), which the last heartbeat also hands to the next attempt; a transport failure is counted in
    them. ``details`` ride along after the spend (the workflow reads them, e.g. what kind of no-patch)."""
    failure = err if isinstance(err, ApplicationError) else as_failure(err)
    # Every RepairError has a rule in the table (RepairError itself is permanent).
    assert isinstance(failure, ApplicationError)
    if failure.type == FailureClass.TRANSIENT.value:
        spent = spent.model_copy(update={"transport_failures": spent.transport_failures + 1})
    beat.carry["spent"] = spent.model_dump()
    beat.set(f"failed ({failure.type}); {spent.total} tokens spent so far")
    return ApplicationError(
        failure.message,
        spent.model_dump(),
        *details,
        type=failure.type,
        non_retryable=failure.non_retryable,
        next_retry_delay=failure.next_retry_delay,
    )
