"""What a repair attempt's child is given of the run's state and what the run takes back
(pipeline/flow/attempt_carry.py): the lists only the run's handlers grow stay out of the child's input and
result, and taking the attempt's state back never loses them."""

from __future__ import annotations

from datetime import UTC, datetime

from pipeline.flow.attempt_carry import NOT_FOR_ATTEMPTS, attempt_state, take_back
from pipeline.state import Budgets, DeliveryKind, DeliveryRecord, HeadPushFact, Phase, PhaseMark, ReportEdit, RunState

AT = datetime(2026, 12, 6, tzinfo=UTC)


def busy_run() -> RunState:
    """A run that has handled 300 deliveries, edits and pushed heads while it waited for its review."""
    return RunState(
        workflow_id="repair:acme/shop#7",
        run_id="r",
        repository="acme/shop",
        issue_number=7,
        base_branch="main",
        phase=Phase.REPAIR,
        budgets=Budgets(repair_attempts_max=3, model_token_budget=1000),
        deliveries=[
            DeliveryRecord(
                delivery=f"g{i}", attempt="1", kind=next(iter(DeliveryKind)), what="x", at=AT, phase=Phase.REPAIR
            )
            for i in range(300)
        ],
        report_edits=[ReportEdit(editor="owner", fields=["body"], at=AT)],
        head_pushes=[HeadPushFact(head_sha="a" * 40, seen_at=AT)],
    )


def test_the_attempt_starts_without_the_handlers_lists_and_the_run_keeps_its_own() -> None:
    run = busy_run()
    given = attempt_state(run)
    assert all(getattr(given, name) == [] for name in NOT_FOR_ATTEMPTS)
    assert given.model_copy(update={name: getattr(run, name) for name in NOT_FOR_ATTEMPTS}) == run
    assert len(given.model_dump_json()) * 10 < len(run.model_dump_json())

    # The attempt spends and moves on; what it changed comes back, and the run's own lists are as they were.
    given.budgets.repair_attempts_used = 1
    given.phase = Phase.VERIFY
    given.timeline.append(PhaseMark(phase=Phase.VERIFY, at=AT))
    take_back(run, given)
    assert run.budgets.repair_attempts_used == 1 and run.phase == Phase.VERIFY and len(run.timeline) == 1
    assert len(run.deliveries) == 300 and len(run.report_edits) == 1 and len(run.head_pushes) == 1
