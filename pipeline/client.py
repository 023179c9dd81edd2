"""Talking to Temporal: connect, start or attach to a run, read its state, approve, reject, cancel.

Starting is idempotent per report: the workflow ID comes from the report's source and the start uses
``USE_EXISTING`` on conflict, so a second trigger for the same issue attaches to the running workflow.
Approvals are Updates with an ID derived from their source (review ID or delivery), so the same approval
delivered twice is recorded once (Temporal deduplicates Update IDs within a run; the handler is idempotent too).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, timedelta

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

from pipeline.config import DurafixConfig
from pipeline.ids import workflow_id_for
from pipeline.inputs import ApprovalAck, PinnedReport, RepairInput
from pipeline.policies import RunPolicy
from pipeline.state import Approval, HeadPush, Rejection, ReportEdit, RunState, Withdrawal
from pipeline.steps import TaskQueue
from pipeline.temporal_connection import connect_options
from pipeline.workflow import RepairBugWorkflow

RunHandle = WorkflowHandle[RepairBugWorkflow, RunState]


async def connect(config: DurafixConfig) -> Client:
    """The one way a durafix process (worker, CLI, webhook receiver) connects: address, namespace, TLS and API
    key from ``config`` (:func:`pipeline.temporal_connection.connect_options`, whose
    :class:`~pipeline.temporal_connection.TemporalSettingsError` is raised before any connection is tried)."""
    options = connect_options(config)
    return await Client.connect(
        options.target_host,
        namespace=options.namespace,
        tls=options.tls,
        api_key=options.api_key,
        data_converter=pydantic_data_converter,
    )


@dataclass(frozen=True)
class Started:
    workflow_id: str
    run_id: str
    attached: bool


class RunAlreadyEnded(Exception):
    """The report already had its run; a report is repaired by one run, ever (open a new issue to retry)."""

    def __init__(self, workflow_id: str, status: WorkflowExecutionStatus | None) -> None:
        state = status.name.lower() if status else "closed"
        super().__init__(f"{workflow_id} already ran and is {state}; open a new issue to try again")
        self.workflow_id = workflow_id
        self.status = status


def run_policy(config: DurafixConfig) -> RunPolicy:
    policy = RunPolicy.fast() if config.fast_timeouts else RunPolicy()
    policy.max_repair_attempts = config.max_repair_attempts
    policy.revisions_max = config.revisions_max
    policy.engine = config.engine
    policy.approval_policy = config.approval_policy_in_force()
    return policy


async def start_run(
    client: Client,
    config: DurafixConfig,
    repository: str,
    issue_number: int,
    *,
    base_branch: str = "main",
    trigger: str = "cli",
    policy: RunPolicy | None = None,
    report: PinnedReport | None = None,
) -> Started:
    """Start ``repair_bug`` for the report, or attach to the run that already handles it. ``report`` pins the
    text the run works on (a run attached to keeps the text it was started with)."""
    workflow_id = workflow_id_for(repository, issue_number)
    try:
        desc = await handle_for(client, workflow_id).describe()
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
    else:
        if desc.status == WorkflowExecutionStatus.RUNNING:
            return Started(workflow_id=workflow_id, run_id=desc.run_id, attached=True)
        raise RunAlreadyEnded(workflow_id, desc.status)
    policy = policy or run_policy(config)
    # USE_EXISTING closes the race with a concurrent trigger: the loser attaches to the winner's run.
    handle = await client.start_workflow(
        RepairBugWorkflow.run,
        RepairInput(
            repository=repository,
            issue_number=issue_number,
            base_branch=base_branch,
            trigger=trigger,
            policy=policy,
            environment_provider=config.environment_provider,
            report=report,
        ),
        id=workflow_id,
        task_queue=TaskQueue.ORCHESTRATION.value,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        # One run per report, ever: a run's resources are fenced by its workflow ID after its cleanup, so a
        # second run under the same ID could not provision anything.
        id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        execution_timeout=timedelta(seconds=policy.run_deadline_s),
    )
    return Started(workflow_id=workflow_id, run_id=handle.result_run_id or "", attached=False)


def handle_for(client: Client, workflow_id: str) -> RunHandle:
    return client.get_workflow_handle_for(RepairBugWorkflow.run, workflow_id)


async def get_state(client: Client, workflow_id: str) -> RunState:
    return await handle_for(client, workflow_id).query(RepairBugWorkflow.state)


async def approve(client: Client, workflow_id: str, approval: Approval) -> ApprovalAck:
    # The same decision re-sent is recorded once; a renewed one (another expiry) is a new decision.
    update_id = f"approve:{approval.review_id or approval.head_sha}"
    if approval.expires_at is not None:
        update_id += f":until-{approval.expires_at.astimezone(UTC):%Y%m%dT%H%M%SZ}"
    return await handle_for(client, workflow_id).execute_update(RepairBugWorkflow.approve, approval, id=update_id)


async def reject(client: Client, workflow_id: str, rejection: Rejection) -> None:
    await handle_for(client, workflow_id).signal(RepairBugWorkflow.reject, rejection)


async def withdraw(client: Client, workflow_id: str, withdrawal: Withdrawal) -> None:
    await handle_for(client, workflow_id).signal(RepairBugWorkflow.withdraw, withdrawal)


async def report_edited(client: Client, workflow_id: str, edit: ReportEdit) -> None:
    await handle_for(client, workflow_id).signal(RepairBugWorkflow.report_edited, edit)


async def head_moved(client: Client, workflow_id: str, push: HeadPush) -> None:
    """Tell the run its PR head moved. Sent by name: the handler is ``RepairBugWorkflow.head_moved``."""
    await handle_for(client, workflow_id).signal("head_moved", push)


async def cancel(client: Client, workflow_id: str) -> None:
    await handle_for(client, workflow_id).cancel()


async def status_of(client: Client, workflow_id: str) -> WorkflowExecutionStatus | None:
    desc = await handle_for(client, workflow_id).describe()
    return desc.status
