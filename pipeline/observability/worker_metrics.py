"""What a durafix worker process counts, in a Prometheus registry of its own (served by :mod:`.endpoint`).

Contract (every name follows Prometheus conventions: counters end in ``_total``, durations are seconds):

- ``durafix_runs_started_total``: a run's ticket was ensured (``forge.ensure_ticket`` succeeded), once per run
  per worker process (a later try of the same step in this process is not counted again).
- ``durafix_runs_ended_total{outcome}``, ``durafix_run_phase_duration_seconds{phase}``,
  ``durafix_repair_attempts_total{verification}``, ``durafix_model_tokens_total{model, kind}``,
  ``durafix_model_cost_dollars_total{model}``, ``durafix_model_outage_waits_total``,
  ``durafix_model_outage_wait_seconds_total``, ``durafix_cleanup_incomplete_total``: counted from a run's whole
  state when it ended (:meth:`WorkerMetrics.run_ended`), which the caller does exactly once per run: when the
  run's record was stored for the first time (:func:`pipeline.activities.run_record.record_stored`). A retried
  or replayed ending is never counted again; tokens and cost are therefore counted when the run ends.
- ``durafix_step_duration_seconds{step, result}`` and ``durafix_step_failures_total{step, failure_class}``: every
  activity attempt this process ran, by activity type; ``failure_class`` is the :class:`FailureClass` value,
  ``WorkerLost``, ``cancelled`` or ``other`` (an exception no rule classified).
- ``durafix_evidence_store_errors_total{step}``: attempts that failed on the evidence store (an
  :class:`~evidence.interface.ArtifactError` in the failure's causes).
- ``durafix_sandbox_egress_refusals_total``: tunnels a sandboxed setup asked the egress proxy for and was refused
  (the host is the setup's text, so it is no label); ``durafix_sandbox_egress_reached_total{host}``: tunnels to
  allowed hosts (the operator's ``DURAFIX_SETUP_EGRESS`` list, so a bounded set).
- Labels hold only bounded values: enum values, activity type names (a fixed set), model names (the few the
  operator configured). Never a run ID or a repository. Model names outside ``[A-Za-z0-9._:/-]{1,64}`` are
  reported as ``other``.
- The registry is this object's, never ``prometheus_client``'s global one.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest

from environments.egress import EgressEvent
from pipeline.pricing import ModelPrice, run_cost
from pipeline.state import CleanupStatus, RunState

_MODEL = re.compile(r"[A-Za-z0-9._:/-]{1,64}")
# Phases last from milliseconds (a ticket) to days (a review): the buckets span both.
PHASE_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0, 3 * 24 * 3600.0, 7 * 24 * 3600.0)
STEP_BUCKETS = (0.05, 0.25, 1.0, 5.0, 15.0, 60.0, 180.0, 600.0, 1800.0)
# Runs whose start this process already counted (a retried ensure_ticket); bounded, oldest forgotten first.
_REMEMBERED_STARTS = 4096


def model_label(name: str) -> str:
    """``name`` as a label value: a model name of the usual shape, ``unknown`` when empty, else ``other``."""
    if not name:
        return "unknown"
    return name if _MODEL.fullmatch(name) else "other"


class WorkerMetrics:
    """The worker's durafix counters and histograms. Thread-safe (``prometheus_client`` is; the start set is
    locked)."""

    def __init__(self, prices: Mapping[str, ModelPrice] | None = None) -> None:
        self.prices = prices
        self.registry = CollectorRegistry()
        r = self.registry
        self.runs_started = Counter("durafix_runs_started", "Runs whose ticket was ensured", registry=r)
        self.runs_ended = Counter("durafix_runs_ended", "Runs that ended, by outcome", ["outcome"], registry=r)
        self.phase_duration = Histogram(
            "durafix_run_phase_duration_seconds",
            "Time an ended run spent in each phase it entered (observed when the run ended)",
            ["phase"],
            buckets=PHASE_BUCKETS,
            registry=r,
        )
        self.repair_attempts = Counter(
            "durafix_repair_attempts",
            "Repair candidates of ended runs, by verification status",
            ["verification"],
            registry=r,
        )
        self.tokens = Counter(
            "durafix_model_tokens", "Model tokens ended runs spent, by model and kind", ["model", "kind"], registry=r
        )
        self.cost = Counter(
            "durafix_model_cost_dollars",
            "What ended runs' model calls cost at the configured price table, by model",
            ["model"],
            registry=r,
        )
        self.outage_waits = Counter(
            "durafix_model_outage_waits", "Durable waits for a model endpoint outage, in ended runs", registry=r
        )
        self.outage_wait_seconds = Counter(
            "durafix_model_outage_wait_seconds", "Seconds ended runs waited out model endpoint outages", registry=r
        )
        self.cleanup_incomplete = Counter(
            "durafix_cleanup_incomplete", "Ended runs whose cleanup left resources or failed", registry=r
        )
        self.step_duration = Histogram(
            "durafix_step_duration_seconds",
            "Activity attempts this worker ran, by activity type and result (ok, failed, cancelled)",
            ["step", "result"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.step_failures = Counter(
            "durafix_step_failures",
            "Failed activity attempts, by activity type and failure class",
            ["step", "failure_class"],
            registry=r,
        )
        self.evidence_errors = Counter(
            "durafix_evidence_store_errors", "Activity attempts that failed on the evidence store", ["step"], registry=r
        )
        self.egress_refusals = Counter(
            "durafix_sandbox_egress_refusals", "Tunnels sandboxed setups were refused by the egress proxy", registry=r
        )
        self.egress_reached = Counter(
            "durafix_sandbox_egress_reached",
            "Tunnels sandboxed setups opened through the egress proxy, by allowed host",
            ["host"],
            registry=r,
        )
        self._lock = threading.Lock()
        self._started: OrderedDict[str, None] = OrderedDict()

    def run_started(self, workflow_id: str) -> None:
        """Count ``workflow_id``'s start unless this process counted it already."""
        with self._lock:
            if workflow_id in self._started:
                return
            self._started[workflow_id] = None
            if len(self._started) > _REMEMBERED_STARTS:
                self._started.popitem(last=False)
        self.runs_started.inc()

    def egress(self, events: Sequence[EgressEvent]) -> None:
        """Count the egress proxy's verdicts (an :func:`environments.egress.observe_egress` observer)."""
        for event in events:
            if event.verdict == "reached":
                self.egress_reached.labels(host=event.host).inc()
            else:
                self.egress_refusals.inc()

    def step_finished(self, step: str, result: str, seconds: float) -> None:
        self.step_duration.labels(step=step, result=result).observe(seconds)

    def step_failed(self, step: str, failure_class: str, *, evidence_store: bool) -> None:
        self.step_failures.labels(step=step, failure_class=failure_class).inc()
        if evidence_store:
            self.evidence_errors.labels(step=step).inc()

    def run_ended(self, state: RunState) -> None:
        """Count an ended run from its whole state. The caller calls it once per run (see the module)."""
        if state.outcome is not None:
            self.runs_ended.labels(outcome=state.outcome.value).inc()
        for mark, following in zip(state.timeline, state.timeline[1:], strict=False):
            seconds = (following.at - mark.at).total_seconds()
            self.phase_duration.labels(phase=mark.phase.value).observe(max(0.0, seconds))
        for candidate in state.candidates:
            self.repair_attempts.labels(verification=candidate.verification.value).inc()
        budgets = state.budgets
        if budgets.model_prompt_tokens or budgets.model_completion_tokens:
            model = model_label(budgets.model)
            self.tokens.labels(model=model, kind="prompt").inc(budgets.model_prompt_tokens)
            self.tokens.labels(model=model, kind="completion").inc(budgets.model_completion_tokens)
            cost = run_cost(budgets, self.prices).run
            if cost is not None:
                self.cost.labels(model=model).inc(cost)
        if budgets.outage_waits:
            self.outage_waits.inc(budgets.outage_waits)
            self.outage_wait_seconds.inc(budgets.outage_wait_s)
        if state.cleanup is not None and state.cleanup.status != CleanupStatus.COMPLETE:
            self.cleanup_incomplete.inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
