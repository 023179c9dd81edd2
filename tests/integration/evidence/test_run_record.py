"""A run's state with 500 deliveries, 40 candidates, 300 artifacts and 30 moved heads answers bounded (its
size no longer grows with them, each cut counted), and its whole record, stored by ``evidence.record_run``
in each real store (local, S3 on moto and on SeaweedFS), reads back entry for entry and refuses tampering."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import ActivityEnvironment

from evidence.interface import ArtifactKind, ArtifactRef, IntegrityError
from pipeline.activities.run_record import RunRecordActivities, read_record
from pipeline.state import (
    SHOWN_CANDIDATES,
    SHOWN_DELIVERIES,
    SHOWN_EVIDENCE,
    SHOWN_HEAD_PUSHES,
    Budgets,
    CandidateFact,
    DeliveryKind,
    DeliveryRecord,
    HeadPushFact,
    Phase,
    RunState,
)
from pipeline.steps import RecordRunInput
from tests.support.evidence_stores import StoreCase

RUN = "repair:shop/cart#500"
AT = datetime(2026, 12, 1, tzinfo=UTC)


def payload_bytes(state: RunState) -> int:
    (payload,) = pydantic_data_converter.payload_converter.to_payloads([state])
    return payload.ByteSize()


def stored_artifacts(case: StoreCase, count: int = 300) -> list[ArtifactRef]:
    """``count`` artifacts really stored in ``case``'s store, as a run's evidence."""
    return [
        case.store.put_bytes(f"artifact {n}".encode(), kind=ArtifactKind.LOG, run_id=RUN, name=f"a-{n}.log")
        for n in range(count)
    ]


def busy_state(refs: list[ArtifactRef], deliveries: int = 500) -> RunState:
    """A state as a review of weeks leaves it, with ``refs`` as its evidence (the first 40 its candidates')."""
    return RunState(
        workflow_id=RUN,
        run_id="r-1",
        repository="shop/cart",
        issue_number=500,
        base_branch="main",
        budgets=Budgets(repair_attempts_max=3, model_token_budget=1_000),
        deliveries=[
            DeliveryRecord(
                delivery=f"guid-{n:04d}",
                attempt="a",
                kind=DeliveryKind.COMMAND,
                what="recorded: /durafix status",
                at=AT + timedelta(minutes=n),
                phase=Phase.AWAITING_REVIEW,
            )
            for n in range(deliveries)
        ],
        candidates=[
            CandidateFact(attempt=1, op_id=f"op-{n}", patch_ref=refs[n], summary=f"candidate {n}", commit_timestamp=n)
            for n in range(min(40, len(refs)))
        ],
        evidence=refs,
        head_pushes=[HeadPushFact(head_sha=f"{n:040x}", seen_at=AT) for n in range(30)],
    )


def test_a_state_with_500_deliveries_answers_bounded_and_its_stored_record_reads_back_whole(case: StoreCase) -> None:
    refs = stored_artifacts(case)
    whole = busy_state(refs)
    shown = whole.bounded()

    assert [len(shown.deliveries), len(shown.candidates), len(shown.evidence), len(shown.head_pushes)] == [
        SHOWN_DELIVERIES,
        SHOWN_CANDIDATES,
        SHOWN_EVIDENCE,
        SHOWN_HEAD_PUSHES,
    ]
    assert shown.deliveries[0].delivery == f"guid-{500 - SHOWN_DELIVERIES:04d}" and shown.candidate == whole.candidate
    assert shown.omitted.model_dump() == {
        "deliveries": 500 - SHOWN_DELIVERIES,
        "candidates": 40 - SHOWN_CANDIDATES,
        "evidence": 300 - SHOWN_EVIDENCE,
        "head_pushes": 30 - SHOWN_HEAD_PUSHES,
    }
    assert shown.omitted.total("deliveries", len(shown.deliveries)) == 500
    # Bounded, not merely smaller: five times the deliveries answer with the same size (to the digits of a count).
    assert abs(payload_bytes(busy_state(refs, deliveries=2_500).bounded()) - payload_bytes(shown)) < 16
    assert payload_bytes(shown) < payload_bytes(whole) // 2
    assert len(whole.deliveries) == 500  # the workflow's own state keeps every entry
    # Bounding a bounded state cuts nothing more and counts nothing twice.
    assert shown.bounded() == shown

    env = ActivityEnvironment()
    record_ref = env.run(RunRecordActivities(case.store).record_run, RecordRunInput(state=whole))
    assert record_ref == env.run(RunRecordActivities(case.store).record_run, RecordRunInput(state=whole))
    assert record_ref.key.startswith(f"{ArtifactKind.OTHER}/")
    back = read_record(case.store, record_ref)
    assert back == whole and [d.delivery for d in back.deliveries] == [f"guid-{n:04d}" for n in range(500)]
    assert all(case.store.exists(ref) for ref in back.evidence)

    case.tamper(record_ref, whole.model_copy(update={"deliveries": []}).model_dump_json().encode())
    with pytest.raises(IntegrityError):
        read_record(case.store, record_ref)


def test_a_record_never_names_itself(case: StoreCase) -> None:
    """The record is stored without ``record_ref`` (a state that named its own record could not be stored by
    content), so storing the state after the run noted the ref gives the same record."""
    state = busy_state(stored_artifacts(case, 3), deliveries=3)
    first = RunRecordActivities(case.store).record_run(RecordRunInput(state=state))
    noted = state.model_copy(update={"record_ref": first})
    second: ArtifactRef = RunRecordActivities(case.store).record_run(RecordRunInput(state=noted))
    assert second == first and read_record(case.store, first).record_ref is None
