"""Retry policies, timeouts and budgets.

Which failures are retried is the failure classes' own property (:class:`pipeline.failures.FailureClass`);
the retry policy's non-retryable list is derived from it.

Timeouts say what stopped: schedule-to-start (no worker on the queue), start-to-close (one attempt hung),
heartbeat (an attempt's worker died or stalled where nothing saw it), schedule-to-close (the step as a whole).

Heartbeat timeouts are long (a minute or two by default) because they are no longer how the death of a worker
process is noticed on its own host: the ``durafix worker`` supervisor fails a dead child's attempts at once
(``docs/recovery.md``, Failover). They are what notices a worker on a host that died or was cut off, and they
must never fire for a live worker on a loaded host: activities beat every second and beats reach the server at
least every second (``pipeline.worker.runner.HEARTBEAT_THROTTLE``), a margin of a minute or more. Every step heartbeats,
the forge's too (``pipeline.activities.heartbeat.heartbeating``), so no dead worker is waited out for a whole
start-to-close timeout.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field
from temporalio.common import RetryPolicy

from pipeline.failures import NON_RETRYABLE
from reviews.approval_policy import ApprovalPolicy


class TimeoutClass(StrEnum):
    """Which of a run policy's :class:`StepTimeouts` a step keeps (the field of :class:`RunPolicy`)."""

    FORGE = "forge"
    ENVIRONMENT = "environment"
    BROWSER = "browser"
    MODEL = "model"


class StepTimeouts(BaseModel):
    """Timeouts of one activity, in seconds."""

    schedule_to_start: float
    start_to_close: float
    schedule_to_close: float
    heartbeat: float | None = None
    max_attempts: int = 8
    # The retry policy's backoff: the first wait, doubled after every try up to the last.
    initial_interval: float = 1.0
    maximum_interval: float = 30.0

    def retry_policy(self) -> RetryPolicy:
        """Exponential backoff for the retryable classes; the others fail at once."""
        return RetryPolicy(
            initial_interval=timedelta(seconds=self.initial_interval),
            backoff_coefficient=2.0,
            maximum_interval=timedelta(seconds=self.maximum_interval),
            maximum_attempts=self.max_attempts,
            non_retryable_error_types=NON_RETRYABLE,
        )


class RunPolicy(BaseModel):
    """Budgets and timeouts of one run; part of the workflow input so a run keeps the policy it started with."""

    max_repair_attempts: int = 3
    # Revisions on review: how many times a reviewer's requested changes are attempted on top of the candidate
    # under review (budgeted apart from the repair attempts). Once spent, the next request for changes rejects.
    revisions_max: int = 2
    model_token_budget: int = 200_000
    reproduction_runs: int = 1
    # The keyword that makes the PR close the report's issue when it merges; empty: the issue stays open.
    closing_keyword: str = "Fixes"
    # A candidate passes only if its patch adds or changes a test that fails on the base and passes with the fix
    # (the regression proof). Off by default: the browser replay on the candidate is a proof too.
    require_regression_test: bool = False
    # A repair attempt's transcript longer than this (characters of JSON, about a quarter as many tokens) is
    # compacted from durable facts before the next model turn (repair.compaction).
    agent_compact_chars: int = Field(default=300_000, ge=10_000)
    # A model endpoint that fails a step's every try with a transport error (429, 5xx, timeout) is waited out
    # with durable timers (``outage_backoff_s`` doubled up to ``outage_backoff_max_s``) and the same step sent
    # again, never spending a repair attempt; once one outage has lasted ``model_outage_allowance_s`` the run
    # ends saying the endpoint was unavailable.
    model_outage_allowance_s: float = 6 * 3600.0
    outage_backoff_s: float = 30.0
    outage_backoff_max_s: float = 600.0
    # Who writes the patches: the built-in stepped agent, or the worker's external agent CLI ("command": the
    # model.agent_command activity, the CLI named by the model worker's DURAFIX_ENGINE_COMMAND).
    engine: Literal["builtin", "command"] = "builtin"
    # What the run does when the base branch moved since the head under review was verified: it rebuilds the
    # change on the new base (a three-way merge) and verifies that. "merge": when the rebuilt change is the same
    # change, the approved head merges as approved (the forge's merge commit is what was verified); when it
    # differs, the rebuilt head is pushed and reviewed again. "rebase": the rebuilt head is always pushed (a
    # commit on the new base replacing the head, with a lease on it) and reviewed again.
    base_moved: Literal["merge", "rebase"] = "merge"
    review_timeout_s: float = 7 * 24 * 3600.0
    # The approval policy the run's merge is checked by (who may approve, how many must, for how long), kept
    # from the run's start. None (runs started before policies were carried): the merging worker's own.
    approval_policy: ApprovalPolicy | None = None
    run_deadline_s: float = 14 * 24 * 3600.0
    # How long a step bound to the host holding its environment (pipeline/hosts.py) waits for that host to take it;
    # longer, and the host is taken for gone: the environment is provisioned anew elsewhere.
    host_start_s: float = 60.0
    forge: StepTimeouts = StepTimeouts(schedule_to_start=600, start_to_close=120, schedule_to_close=1800, heartbeat=60)
    environment: StepTimeouts = StepTimeouts(
        schedule_to_start=600, start_to_close=600, schedule_to_close=3600, heartbeat=90
    )
    browser: StepTimeouts = StepTimeouts(
        schedule_to_start=600, start_to_close=300, schedule_to_close=1800, heartbeat=90, max_attempts=4
    )
    model: StepTimeouts = StepTimeouts(
        schedule_to_start=600, start_to_close=600, schedule_to_close=3600, heartbeat=120, max_attempts=6
    )

    def timeouts(self, kind: TimeoutClass) -> StepTimeouts:
        timeouts: StepTimeouts = getattr(self, kind.value)
        return timeouts

    @classmethod
    def fast(cls) -> RunPolicy:
        """Short timeouts for tests: an attempt whose worker died where no supervisor saw it (a test's own worker
        process, a stopped one) times out in seconds, not minutes. The heartbeat timeouts still leave a loaded
        two-core host three beats' worth of margin (beats reach the server every 5 s at most)."""
        return cls(
            host_start_s=20.0,
            forge=StepTimeouts(schedule_to_start=120, start_to_close=30, schedule_to_close=300, heartbeat=15),
            environment=StepTimeouts(schedule_to_start=120, start_to_close=120, schedule_to_close=600, heartbeat=15),
            browser=StepTimeouts(
                schedule_to_start=120, start_to_close=120, schedule_to_close=600, heartbeat=15, max_attempts=4
            ),
            model=StepTimeouts(
                schedule_to_start=120, start_to_close=120, schedule_to_close=600, heartbeat=15, max_attempts=6
            ),
        )
