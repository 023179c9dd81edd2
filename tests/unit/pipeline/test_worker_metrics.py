"""What a worker counts (pipeline/observability): an ended run's outcome, phases, attempts and spend; a run's
start once per process; failure labels from the bounded set; and the run record's "already stored" test that
keeps a retried ending from being counted twice."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from environments.egress import EgressEvent, log_events, observe_egress
from evidence.interface import ArtifactKind, ArtifactMissingError, ArtifactRef
from evidence.local import LocalArtifactStore
from pipeline.activities.run_record import record_stored, store_record
from pipeline.failures import FailureClass
from pipeline.observability.gauges import Cached
from pipeline.observability.step_metrics import evidence_store_error, failure_label
from pipeline.observability.worker_metrics import WorkerMetrics, model_label
from pipeline.pricing import ModelPrice
from pipeline.state import (
    Budgets,
    CandidateFact,
    CleanupFact,
    CleanupStatus,
    Outcome,
    Phase,
    PhaseMark,
    RunState,
    VerificationStatus,
)
from tests.support.metrics_text import parse

T0 = datetime(2026, 5, 9, 12, 0, tzinfo=UTC)
PATCH = ArtifactRef(
    key="patch/aa/" + "a" * 64, sha256="a" * 64, size=1, media_type="text/x-diff", kind=ArtifactKind.PATCH,
    run_id="repair:acme/shop#1", name="p.diff", created_at="2026-05-09T12:00:00Z",
)  # fmt: skip


def ended_run() -> RunState:
    state = RunState(
        workflow_id="repair:acme/shop#1", run_id="r" * 16, repository="acme/shop", issue_number=1,
        base_branch="main", budgets=Budgets(repair_attempts_max=3, model_token_budget=200_000),
    )  # fmt: skip
    for minutes, phase in [
        (0, Phase.INTAKE),
        (1, Phase.REPAIR),
        (4, Phase.VERIFY),
        (6, Phase.CLEANUP),
        (7, Phase.DONE),
    ]:
        state.timeline.append(PhaseMark(phase=phase, at=T0 + timedelta(minutes=minutes)))
    for attempt, status in [(1, VerificationStatus.FAILED), (2, VerificationStatus.PASSED)]:
        state.candidates.append(
            CandidateFact(
                attempt=attempt,
                op_id=f"op-{attempt}",
                patch_ref=PATCH,
                summary="s",
                commit_timestamp=0,
                verification=status,
            )
        )
    state.budgets.model = "gpt-4o-mini"
    state.budgets.model_prompt_tokens = 1_000_000
    state.budgets.model_completion_tokens = 100_000
    state.budgets.outage_waits = 2
    state.budgets.outage_wait_s = 90.0
    state.outcome = Outcome.CLEANUP_INCOMPLETE
    state.cleanup = CleanupFact(status=CleanupStatus.INCOMPLETE, remaining=["workspace w"])
    return state


def test_an_ended_run_is_counted_from_its_state_and_no_label_names_it() -> None:
    metrics = WorkerMetrics({"gpt-4o-mini": ModelPrice(prompt=0.15, completion=0.6)})
    metrics.run_ended(ended_run())
    out = parse(metrics.render().decode())

    assert out.values("durafix_runs_ended_total", outcome="cleanup-incomplete") == [1.0]
    assert out.values("durafix_run_phase_duration_seconds_sum", phase="repair") == [180.0]
    assert out.values("durafix_run_phase_duration_seconds_sum", phase="intake") == [60.0]
    assert out.values("durafix_run_phase_duration_seconds_count", phase="done") == []  # the last phase has no end
    assert out.values("durafix_repair_attempts_total", verification="failed") == [1.0]
    assert out.values("durafix_repair_attempts_total", verification="passed") == [1.0]
    assert out.values("durafix_model_tokens_total", model="gpt-4o-mini", kind="prompt") == [1_000_000.0]
    assert out.values("durafix_model_tokens_total", model="gpt-4o-mini", kind="completion") == [100_000.0]
    assert out.values("durafix_model_cost_dollars_total", model="gpt-4o-mini") == [0.15 + 0.06]
    assert out.total("durafix_model_outage_waits_total") == 2
    assert out.total("durafix_model_outage_wait_seconds_total") == 90
    assert out.total("durafix_cleanup_incomplete_total") == 1
    assert not any("acme" in v or "repair:" in v for v in out.label_values())


def test_a_run_start_is_counted_once_per_process_and_model_names_are_bounded() -> None:
    metrics = WorkerMetrics()
    metrics.run_started("repair:acme/shop#1")
    metrics.run_started("repair:acme/shop#1")
    metrics.run_started("repair:acme/shop#2")
    assert parse(metrics.render().decode()).total("durafix_runs_started_total") == 2
    assert model_label("gpt-4o-mini") == "gpt-4o-mini"
    assert model_label("") == "unknown"
    assert model_label("a model {with} spaces") == "other"
    assert model_label("x" * 65) == "other"


def test_a_run_record_reads_as_stored_only_once_the_same_state_was_stored(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    state = ended_run()
    assert not record_stored(store, state)
    store_record(store, state)
    assert record_stored(store, state)
    later = state.model_copy(update={"outcome_detail": "another ending"})
    assert not record_stored(store, later)


def test_failure_labels_come_from_the_failure_classes_and_name_evidence_store_errors() -> None:
    transient = FailureClass.TRANSIENT.error("503")
    assert failure_label(transient) == "Transient"
    assert failure_label(ApplicationError("x", type="SomethingElse")) == "other"
    assert failure_label(ValueError("unclassified")) == "other"
    missing = FailureClass.PERMANENT.error("no artifact")
    missing.__cause__ = ArtifactMissingError("no artifact k")
    assert evidence_store_error(missing)
    assert not evidence_store_error(transient)


def test_the_egress_proxys_verdicts_reach_the_metrics_through_the_observer_and_refused_hosts_are_no_label(
    tmp_path: Path,
) -> None:
    metrics = WorkerMetrics()
    said: list[str] = []
    remove = observe_egress(metrics.egress)
    try:
        log_events(
            [
                EgressEvent("reached", "pypi.org", 443, "151.101.0.223"),
                EgressEvent("reached", "pypi.org", 443, "151.101.0.223"),
                EgressEvent("refused", "exfil.example", 443, reason="not an allowed registry host"),
                EgressEvent("refused", "169.254.169.254", 80, reason="not an allowed registry host"),
            ],
            tmp_path / "setup.log",
            said.append,
        )
    finally:
        remove()
    log_events([EgressEvent("refused", "late.example", 443)], None, said.append)  # no observer any more
    out = parse(metrics.render().decode())
    assert out.values("durafix_sandbox_egress_reached_total", host="pypi.org") == [2.0]
    assert out.total("durafix_sandbox_egress_refusals_total") == 2
    assert not any("example" in v or "169.254" in v for v in out.label_values())
    assert "setup: egress refused 2 tunnel(s); the setup log names them" in said


def test_a_failing_gauge_snapshot_is_absent_and_logged_once_until_it_succeeds(caplog: pytest.LogCaptureFixture) -> None:
    outcomes: list[int | Exception] = [
        OSError("inventory unreadable"),
        OSError("still unreadable"),
        7,
        OSError("again"),
    ]

    def read() -> int:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    cached = Cached(read, ttl_s=0.0)
    with caplog.at_level(logging.WARNING, logger="pipeline.observability.gauges"):
        assert cached.get() is None
        assert cached.get() is None
        assert cached.get() == 7
        assert cached.get() is None
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2, warnings
    assert "inventory unreadable" in warnings[0] and "again" in warnings[1]
