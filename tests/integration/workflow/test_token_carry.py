"""Tokens spent by a model activity's failed attempts are carried to the retry and counted, on the real
Temporal dev server, with the real activity talking to the scripted model server over HTTP."""

from __future__ import annotations

import concurrent.futures
import uuid
from datetime import timedelta
from pathlib import Path

from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from browser.procedure import Procedure, parse_procedure
from pipeline import steps
from pipeline.config import DurafixConfig
from pipeline.services import Services
from pipeline.steps import DraftProcedureInput, ProcedureResult
from tests.integration.repair.test_procedure_draft import UNKNOWN_ACTION, VALID, script_of, submit
from tests.support.modelserver import Serve, inject_fault, recorded


@workflow.defn(name="draft_with_retries", sandboxed=False)
class DraftWithRetries:
    @workflow.run
    async def run(self, inp: DraftProcedureInput) -> ProcedureResult:
        result: ProcedureResult = await workflow.execute_activity(
            steps.DRAFT_PROCEDURE.name,
            inp,
            result_type=steps.DRAFT_PROCEDURE.output,
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=100), maximum_attempts=3),
        )
        return result


def config_for(tmp_path: Path, base_url: str) -> DurafixConfig:
    return DurafixConfig(
        state_dir=tmp_path / "state", model_base_url=base_url, model_api_key="test-key", model_name="durafix-scripted"
    )


async def draft(client: Client, tmp_path: Path, base_url: str) -> tuple[str, ProcedureResult | WorkflowFailureError]:
    config = config_for(tmp_path, base_url)
    queue = f"draft-{uuid.uuid4().hex[:8]}"
    wf_id = f"draft-{uuid.uuid4().hex[:8]}"
    inp = DraftProcedureInput(run_id=wf_id, op_id=f"{wf_id}:draft-procedure", issue_title="Cart", issue_body="wrong")
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as executor:
        async with Worker(
            client,
            task_queue=queue,
            workflows=[DraftWithRetries],
            activities=Services(config).model_activities().all(),
            activity_executor=executor,
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            try:
                result: ProcedureResult | WorkflowFailureError = await client.execute_workflow(
                    DraftWithRetries.run, inp, id=wf_id, task_queue=queue
                )
            except WorkflowFailureError as err:
                result = err
    return wf_id, result


def billed(records: list[dict[str, object]]) -> tuple[int, int]:
    """Prompt and completion tokens the server charged over every answered request."""
    usages = [r["usage"] for r in records if isinstance(r.get("usage"), dict)]
    return (
        sum(int(u["prompt_tokens"]) for u in usages if isinstance(u, dict)),
        sum(int(u["completion_tokens"]) for u in usages if isinstance(u, dict)),
    )


async def attempts(client: Client, wf_id: str) -> list[int]:
    history = await client.get_workflow_handle(wf_id).fetch_history()
    return [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]


async def test_a_retry_after_a_mid_conversation_failure_reports_both_attempts_tokens(
    temporal_client: Client, serve: Serve, tmp_path: Path
) -> None:
    server = serve(script_of(submit(UNKNOWN_ACTION), submit(VALID)))
    # Attempt 1: the first round is answered (and billed), the second fails with a 500 (transient).
    inject_fault(server, status=500, after=1)

    wf_id, result = await draft(temporal_client, tmp_path, server.base_url)

    assert isinstance(result, ProcedureResult), result
    assert result.procedure_ref is not None
    # The store holds the procedure attempt 2 submitted (read back, sha256-verified).
    stored = Services(config_for(tmp_path, server.base_url)).store.read_bytes(result.procedure_ref)
    assert Procedure.model_validate_json(stored) == parse_procedure(VALID)
    # The ActivityTaskStarted event of a retried activity is written once, with its last attempt.
    assert await attempts(temporal_client, wf_id) == [2]
    records = recorded(server)
    assert [r["status"] for r in records] == [200, 500, 200, 200]
    prompt, completion = billed(records)
    first_round = records[0]["usage"]
    assert isinstance(first_round, dict) and first_round["prompt_tokens"] > 0
    # Attempt 1's billed round is counted, not only attempt 2's two rounds.
    assert (result.prompt_tokens, result.completion_tokens) == (prompt, completion)
    assert result.prompt_tokens > prompt - int(first_round["prompt_tokens"])


async def test_a_final_failure_carries_every_attempts_tokens(
    temporal_client: Client, serve: Serve, tmp_path: Path
) -> None:
    server = serve(script_of(submit(UNKNOWN_ACTION), submit(VALID)))
    # Every attempt gets its first round answered and its second refused: three attempts, all failing.
    for _ in range(3):
        inject_fault(server, status=500, after=1)

    wf_id, result = await draft(temporal_client, tmp_path, server.base_url)

    assert isinstance(result, WorkflowFailureError), result
    activity_failure = result.cause
    assert isinstance(activity_failure, ActivityError), activity_failure
    failure = activity_failure.cause
    assert isinstance(failure, ApplicationError) and failure.type == "Transient", failure
    details = failure.details
    records = recorded(server)
    assert [r["status"] for r in records] == [200, 500] * 3
    prompt, completion = billed(records)
    # Every attempt failed on the transport, and the carry counted each of them.
    assert details and details[0] == {"prompt_tokens": prompt, "completion_tokens": completion, "transport_failures": 3}
    assert await attempts(temporal_client, wf_id) == [3]
