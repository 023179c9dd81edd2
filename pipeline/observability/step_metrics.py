"""Counting from the worker side: an activity interceptor feeding :class:`~.worker_metrics.WorkerMetrics`.

Workflow code is never instrumented: a replay would count again. Activities run once per attempt and are
never replayed, so every count here is made around an attempt this process ran:

- every attempt: its duration by activity type and result, and when it failed its failure class;
- ``forge.ensure_ticket`` succeeding: the run started (once per run in this process);
- ``evidence.record_run`` succeeding when its record was not stored before the attempt: the run ended. The
  record is stored by content, so the same ending (a retried attempt, on any host) finds it stored and is not
  counted again; that is what makes a run's outcome counted once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import CancelledError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from evidence.interface import ArtifactError, ArtifactStore
from pipeline import steps
from pipeline.activities.run_record import record_stored
from pipeline.failures import causes, failure_class
from pipeline.observability.worker_metrics import WorkerMetrics
from pipeline.steps import RecordRunInput


def evidence_store_error(err: BaseException) -> bool:
    """The failure came from the evidence store: one of its errors, or the S3 client's, among its causes."""
    return any(isinstance(c, ArtifactError) or type(c).__module__.startswith("botocore") for c in causes(err))


def failure_label(err: BaseException) -> str:
    """The failure's class for a label: a :class:`~pipeline.failures.FailureClass` value, ``cancelled``, or
    ``other`` for an error no rule classified (a bounded set either way)."""
    if isinstance(err, CancelledError | asyncio.CancelledError):
        return "cancelled"
    found = failure_class(err)
    return found.value if found is not None else "other"


class MetricsInterceptor(Interceptor):
    """Counts each activity attempt into ``metrics``; ``store`` (called once, lazily) is the evidence store the
    run records are in."""

    def __init__(self, metrics: WorkerMetrics, store: Callable[[], ArtifactStore]) -> None:
        self.metrics = metrics
        self._store = store
        self._opened: ArtifactStore | None = None

    def store(self) -> ArtifactStore:
        if self._opened is None:
            self._opened = self._store()
        return self._opened

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Counting(next, self)


class _Counting(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, owner: MetricsInterceptor) -> None:
        super().__init__(next)
        self.owner = owner

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        metrics = self.owner.metrics
        ended = await self._first_record(info.activity_type, input)
        began = time.monotonic()
        try:
            result = await super().execute_activity(input)
        except BaseException as err:
            label = failure_label(err)
            metrics.step_finished(
                info.activity_type, "cancelled" if label == "cancelled" else "failed", time.monotonic() - began
            )
            metrics.step_failed(info.activity_type, label, evidence_store=evidence_store_error(err))
            raise
        metrics.step_finished(info.activity_type, "ok", time.monotonic() - began)
        if info.activity_type == steps.ENSURE_TICKET.name and info.workflow_id:
            metrics.run_started(info.workflow_id)
        if ended is not None:
            metrics.run_ended(ended.state)
        return result

    async def _first_record(self, activity_type: str, input: ExecuteActivityInput) -> RecordRunInput | None:
        """``record_run``'s input when its record is not stored yet (this attempt's success ends the run)."""
        if activity_type != steps.RECORD_RUN.name or not input.args or not isinstance(input.args[0], RecordRunInput):
            return None
        inp = input.args[0]
        try:
            stored = await asyncio.to_thread(record_stored, self.owner.store(), inp.state)
        except Exception:  # the store's own failure fails the attempt itself, and is counted there
            return None
        return None if stored else inp
