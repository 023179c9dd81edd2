"""The run answers with a bounded state and keeps the whole one: on a real Temporal test server, a run handed
more deliveries than its state shows answers its ``state`` query and its result with the latest
``SHOWN_DELIVERIES`` and the count of the others, its ``record`` query and the record it stores hold every
one, and ``durafix status`` says how many it does not show."""

from __future__ import annotations

from datetime import UTC, datetime

from pipeline.cli.status import state_summary
from pipeline.client import get_record
from pipeline.state import SHOWN_DELIVERIES, Delivered, DeliveryKind, Outcome, Phase, RunState
from pipeline.steps import RecordRunInput
from pipeline.workflow import RepairBugWorkflow
from tests.integration.workflow.test_workflow_logic import Harness, approve, harness  # noqa: F401 (the fixture)

EXTRA = 12


async def test_a_run_with_more_deliveries_than_it_shows_answers_bounded_and_records_them_all(
    harness: Harness,  # noqa: F811 (the imported fixture)
) -> None:
    wf = await harness.start()
    await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
    handle = harness.client.get_workflow_handle(wf)
    sent = SHOWN_DELIVERIES + EXTRA
    for n in range(sent):
        delivered = Delivered(delivery=f"guid-{n}", attempt="a", kind=DeliveryKind.COMMAND, command="status")
        await handle.execute_update(RepairBugWorkflow.deliver, delivered, id=f"guid-{n}")

    live = await handle.query(RepairBugWorkflow.state)
    assert [d.delivery for d in live.deliveries] == [f"guid-{n}" for n in range(EXTRA, sent)]
    assert live.omitted.deliveries == EXTRA and live.omitted.total("deliveries", len(live.deliveries)) == sent
    whole = await get_record(harness.client, wf)  # the ``record`` query, as the reconciler reads it
    assert [d.delivery for d in whole.deliveries] == [f"guid-{n}" for n in range(sent)]
    assert whole.omitted.deliveries == 0
    # A delivery cut from the answer is still known to the run: sent again, it is answered with its first handling.
    again = Delivered(delivery="guid-0", attempt="b", kind=DeliveryKind.COMMAND, command="status")
    ack = await handle.execute_update(RepairBugWorkflow.deliver, again, id="guid-0-again")
    assert ack.duplicate_of(again) and ack.first.attempt == "a"

    await approve(harness, wf)
    final = await harness.result(wf)
    assert final.outcome == Outcome.MERGED
    assert len(final.deliveries) == SHOWN_DELIVERIES and final.omitted.deliveries == EXTRA
    # The run stored its whole state once it ended, and its result names the record.
    (stored,) = harness.script.records
    assert isinstance(stored, RunState) and [d.delivery for d in stored.deliveries][:2] == ["guid-0", "guid-1"]
    assert len(stored.deliveries) == sent and stored.outcome == Outcome.MERGED and stored.cleanup is not None
    recorded = [c for n, c in harness.script.calls if n == "record_run"]
    assert len(recorded) == 1 and isinstance(recorded[0], RecordRunInput)
    assert final.record_ref is not None and harness.script.names()[-1] == "record_run"

    shown = state_summary(final, None, now=datetime.now(UTC))
    assert f"webhooks   {sent} delivered" in shown and f"record     the whole state: {final.record_ref.key}" in shown
