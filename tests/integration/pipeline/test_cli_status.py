"""``durafix status``: the pending activities of a run, from real ``PendingActivityInfo`` messages (heartbeat
details encoded as the workers encode them) and from a real Temporal dev server describing a running one."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from google.protobuf.timestamp_pb2 import Timestamp
from temporalio import activity, workflow
from temporalio.api.common.v1 import ActivityType, Payload, Payloads
from temporalio.api.enums.v1 import PendingActivityState, WorkflowExecutionStatus
from temporalio.api.failure.v1 import Failure
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionResponse
from temporalio.client import Client, WorkflowExecutionDescription
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from pipeline.cli.status import NotLive, PendingActivity, decode_pending_activity, pending_activities, recorded_summary
from pipeline.recorded_state import RecordedState

NOW = datetime(2026, 5, 9, 12, 0, 0, tzinfo=UTC)


def stamp(at: datetime) -> Timestamp:
    result = Timestamp()
    result.FromDatetime(at)
    return result


async def info(
    *details: object,
    state: PendingActivityState.ValueType = PendingActivityState.PENDING_ACTIVITY_STATE_STARTED,
    attempt: int = 1,
    started_s_ago: float | None = 41,
    heartbeat_s_ago: float | None = 2,
    failure: str = "",
) -> PendingActivityInfo:
    """A pending ``env.provision`` as the frontend describes it; ``details`` encoded by the workers' converter."""
    message = PendingActivityInfo(
        activity_id="3", activity_type=ActivityType(name="env.provision"), state=state, attempt=attempt
    )
    if details:
        message.heartbeat_details.CopyFrom(Payloads(payloads=await pydantic_data_converter.encode(list(details))))
    if started_s_ago is not None:
        message.last_started_time.CopyFrom(stamp(NOW - timedelta(seconds=started_s_ago)))
    if heartbeat_s_ago is not None:
        message.last_heartbeat_time.CopyFrom(stamp(NOW - timedelta(seconds=heartbeat_s_ago)))
    if failure:
        message.last_failure.CopyFrom(Failure(message=failure))
    return message


async def test_a_heartbeat_text_is_the_sub_state_with_the_attempts_age_and_the_heartbeats() -> None:
    pending = await decode_pending_activity(await info("setup: npm ci"), pydantic_data_converter)

    assert pending.line(NOW) == "running    env.provision (attempt 1): setup: npm ci (41 s, last heartbeat 2 s ago)"
    assert pending.to_json() == {
        "activity_id": "3",
        "activity_type": "env.provision",
        "state": "running",
        "attempt": 1,
        "detail": "setup: npm ci",
        "heartbeat_details": ["setup: npm ci"],
        "last_heartbeat_time": "2026-05-09T11:59:58+00:00",
        "last_started_time": "2026-05-09T11:59:19+00:00",
        "last_failure": None,
    }


async def test_a_heartbeat_carrying_facts_shows_its_detail_and_keeps_the_facts_in_json() -> None:
    carried = {"detail": "calling model", "spent": {"prompt_tokens": 812, "completion_tokens": 96}}
    pending = await decode_pending_activity(await info(carried, started_s_ago=190), pydantic_data_converter)

    assert pending.detail == "calling model"
    assert pending.heartbeat_details == [carried]
    assert pending.line(NOW).endswith(": calling model (3 min, last heartbeat 2 s ago)")


async def test_without_a_heartbeat_the_time_since_the_attempt_started_is_shown() -> None:
    pending = await decode_pending_activity(await info(heartbeat_s_ago=None), pydantic_data_converter)

    assert pending.detail is None and pending.heartbeat_details is None
    assert pending.line(NOW) == "running    env.provision (attempt 1) (41 s, no heartbeat yet)"


async def test_a_retry_shows_the_last_failure_and_marks_an_earlier_attempts_heartbeat() -> None:
    waiting = await decode_pending_activity(
        await info(
            "readiness: GET /healthz",
            state=PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED,
            attempt=2,
            started_s_ago=30,
            heartbeat_s_ago=31,
            failure="app did not answer\ntraceback ...",
        ),
        pydantic_data_converter,
    )
    assert waiting.line(NOW) == (
        "scheduled  env.provision (attempt 2): readiness: GET /healthz "
        "(last heartbeat 31 s ago, last failure: app did not answer)"
    )

    running = await decode_pending_activity(
        await info("readiness: GET /healthz", attempt=2, started_s_ago=5, heartbeat_s_ago=31),
        pydantic_data_converter,
    )
    assert running.line(NOW) == (
        "running    env.provision (attempt 2): readiness: GET /healthz "
        "(5 s, no heartbeat yet; the detail is an earlier attempt's)"
    )


async def test_details_the_converter_cannot_read_are_named_not_raised() -> None:
    message = await info(heartbeat_s_ago=1)
    message.heartbeat_details.CopyFrom(Payloads(payloads=[Payload(metadata={"encoding": b"binary/sealed"}, data=b"x")]))

    pending = await decode_pending_activity(message, pydantic_data_converter)

    assert pending.heartbeat_details is None
    assert pending.detail is not None and pending.detail.startswith("(heartbeat details not readable:")
    assert "binary/sealed" in pending.detail


async def described(status: WorkflowExecutionStatus.ValueType) -> WorkflowExecutionDescription:
    """A run as the frontend describes it (a real ``DescribeWorkflowExecutionResponse``)."""
    raw = DescribeWorkflowExecutionResponse()
    raw.workflow_execution_info.execution.workflow_id = "repair-acme-shop-7"
    raw.workflow_execution_info.execution.run_id = "0123456789abcdef"
    raw.workflow_execution_info.type.name = "repair_bug"
    raw.workflow_execution_info.status = status
    return await WorkflowExecutionDescription._from_raw_description(
        raw, namespace="default", converter=pydantic_data_converter
    )


async def test_a_recorded_state_shows_a_line_for_each_thing_the_run_recorded_and_none_for_the_rest() -> None:
    description = await described(WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_COMPLETED)
    full = RecordedState(
        at=NOW,
        phase="done",
        outcome="merged",
        detail="merged after review",
        ticket="https://forge/acme/shop/issues/7",
        branch="durafix/7",
        commit="c0ffee0123456789abcd",
        pr="https://forge/acme/shop/pull/8",
        awaiting="PR #8 head c0ffee01",
        merged="c0ffee0123456789abcd",
        cleanup="done",
        attempts=2,
    )
    text = recorded_summary("repair-acme-shop-7", description, NotLive("no worker answered", full), now=NOW)
    assert text.splitlines()[1:] == [
        "run        repair-acme-shop-7  (run 01234567)",
        "status     completed; phase done; outcome merged",
        "detail     merged after review",
        "ticket     https://forge/acme/shop/issues/7",
        "attempts   2",
        "publish    durafix/7 @ c0ffee012345; PR https://forge/acme/shop/pull/8",
        "awaiting   approval of PR #8 head c0ffee01",
        "merged     c0ffee0123456789abcd",
        "cleanup    done",
    ]

    sparse = RecordedState(at=NOW, phase="repairing", branch="durafix/7")
    text = recorded_summary("repair-acme-shop-7", description, NotLive("no worker answered", sparse), now=NOW)
    assert text.splitlines()[2:] == ["status     completed; phase repairing", "publish    durafix/7 @ -; PR -"]


RELEASE: dict[str, asyncio.Event] = {}


@activity.defn(name="env.provision")
async def provision(key: str) -> str:
    activity.heartbeat({"detail": "setup: npm ci", "spent": 7})
    await RELEASE[key].wait()
    return "ready"


@workflow.defn(name="status_cli_provisioner")
class Provisioner:
    @workflow.run
    async def run(self, key: str) -> str:
        result: str = await workflow.execute_activity(
            "env.provision",
            key,
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=timedelta(seconds=30),
        )
        return result


async def test_a_running_activity_is_described_with_its_heartbeat(temporal_client: Client) -> None:
    key = uuid.uuid4().hex
    RELEASE[key] = asyncio.Event()
    queue = f"status-cli-{key}"
    async with Worker(
        temporal_client,
        task_queue=queue,
        workflows=[Provisioner],
        activities=[provision],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await temporal_client.start_workflow(Provisioner.run, key, id=f"status-cli-{key}", task_queue=queue)
        pending: PendingActivity | None = None
        for _ in range(100):
            described = await pending_activities(await handle.describe())
            pending = described[0] if described else None
            if pending is not None and pending.last_heartbeat_time is not None:
                break
            await asyncio.sleep(0.1)
        RELEASE[key].set()
        assert await handle.result() == "ready"

    assert pending is not None
    assert (pending.activity_type, pending.state, pending.attempt) == ("env.provision", "running", 1)
    assert pending.detail == "setup: npm ci"
    assert pending.heartbeat_details == [{"detail": "setup: npm ci", "spent": 7}]
    assert pending.last_started_time is not None and pending.last_heartbeat_time is not None
    assert pending.last_heartbeat_time >= pending.last_started_time
    assert (await handle.describe()).raw_description.pending_activities == []
