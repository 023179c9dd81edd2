"""Talking to Temporal: connect, start or attach to a run, retry an ended one, read its state, approve,
reject, deliver a webhook's decision, cancel.

Starting is idempotent per report: the workflow ID comes from the report's source and the start uses
``USE_EXISTING`` on conflict, so a second trigger for the same issue attaches to the running workflow.
A retry (:func:`retry_run`) starts run ``k+1`` of an issue (``repair:o/r#N~k+1``) only when run ``k`` ended,
with ``REJECT_DUPLICATE``: two racing retries give one run. Each start carries its trigger in the run's memo
(``trigger``), so a redelivered trigger finds the run it started instead of starting another.
Approvals are Updates with an ID derived from their source (review ID or delivery), so the same approval
delivered twice is recorded once (Temporal deduplicates Update IDs within a run; the handler is idempotent too).
A webhook delivery's decision is the ``deliver`` Update with the delivery's GUID as its ID (:func:`deliver`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from pipeline.config import DurafixConfig
from pipeline.flow.attempt_carry import ATTEMPT_WORKFLOW, take_back
from pipeline.ids import workflow_id_for
from pipeline.inputs import ApprovalAck, PinnedReport, RepairInput
from pipeline.policies import RunPolicy
from pipeline.recorded_state import STATE_MEMO, RecordedState, parse_recorded
from pipeline.replays import before_run
from pipeline.state import (
    Approval,
    Delivered,
    DeliveryAck,
    HeadPush,
    Phase,
    Rejection,
    ReportEdit,
    RunState,
    Withdrawal,
)
from pipeline.steps import TaskQueue
from pipeline.temporal_connection import connect as connect  # the one way to connect, for this module's callers
from pipeline.workflow import RepairBugWorkflow

# The trigger of a run an operator started (``durafix start``); the receiver's are ``webhook:<delivery>``.
CLI_TRIGGER = "cli"

RunHandle = WorkflowHandle[RepairBugWorkflow, RunState]


@dataclass(frozen=True)
class Started:
    workflow_id: str
    run_id: str
    attached: bool


class RunAlreadyEnded(Exception):
    """The report's run under this ID ended; a retry (:func:`retry_run`) runs under the next ID."""

    def __init__(self, workflow_id: str, status: WorkflowExecutionStatus | None) -> None:
        state = status.name.lower() if status else "closed"
        super().__init__(
            f"{workflow_id} already ran and is {state}; `/durafix retry` on the issue (or its trigger label added "
            "again) starts the next run"
        )
        self.workflow_id = workflow_id
        self.status = status


def run_policy(config: DurafixConfig) -> RunPolicy:
    policy = RunPolicy.fast() if config.fast_timeouts else RunPolicy()
    policy.max_repair_attempts = config.max_repair_attempts
    policy.revisions_max = config.revisions_max
    policy.base_moved = config.base_moved
    policy.engine = config.engine
    policy.approval_policy = config.approval_policy_in_force()
    return policy


def repair_input(
    config: DurafixConfig, repository: str, issue_number: int, trigger: str, report: PinnedReport | None = None
) -> RepairInput:
    """What a run of the report starts with under ``config``: the base branch ``main``, :func:`run_policy`."""
    return RepairInput(
        repository=repository,
        issue_number=issue_number,
        trigger=trigger,
        policy=run_policy(config),
        environment_provider=config.environment_provider,
        report=report,
    )


async def start_run(
    client: Client,
    config: DurafixConfig,
    repository: str,
    issue_number: int,
    *,
    base_branch: str = "main",
    trigger: str = CLI_TRIGGER,
    policy: RunPolicy | None = None,
    report: PinnedReport | None = None,
    run: int = 1,
) -> Started:
    """Start ``repair_bug`` (run ``run`` of the report), or attach to the run that already handles it.
    ``report`` pins the text the run works on (a run attached to keeps the text it was started with)."""
    workflow_id = workflow_id_for(repository, issue_number, run)
    desc = await _described(client, workflow_id)
    if desc is not None:
        if desc.status == WorkflowExecutionStatus.RUNNING:
            return Started(workflow_id=workflow_id, run_id=desc.run_id, attached=True)
        raise RunAlreadyEnded(workflow_id, desc.status)
    inp = repair_input(config, repository, issue_number, trigger, report)
    inp.base_branch = base_branch
    inp.policy = policy or inp.policy
    # USE_EXISTING closes the race with a concurrent trigger: the loser attaches to the winner's run.
    handle = await _start_workflow(client, workflow_id, inp, WorkflowIDConflictPolicy.USE_EXISTING)
    return Started(workflow_id=workflow_id, run_id=handle.result_run_id or "", attached=False)


async def _start_workflow(
    client: Client, workflow_id: str, inp: RepairInput, conflict: WorkflowIDConflictPolicy
) -> WorkflowHandle[Any, Any]:
    """Start ``repair_bug`` under ``workflow_id``. Each ID runs once, ever (``REJECT_DUPLICATE``): a run's
    resources are fenced by its workflow ID after its cleanup, so a second run under the same ID could not
    provision anything; a retry runs under the next ID. The trigger is kept in the memo."""
    return await client.start_workflow(
        RepairBugWorkflow.run,
        inp,
        id=workflow_id,
        task_queue=TaskQueue.ORCHESTRATION.value,
        id_conflict_policy=conflict,
        id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        execution_timeout=timedelta(seconds=inp.policy.run_deadline_s),
        memo={TRIGGER_MEMO: inp.trigger},
    )


TRIGGER_MEMO = "trigger"
"""The memo key of what started a run (``cli``, ``webhook:<delivery>``): describe returns it."""
# Far more runs than any issue gets; bounds the walk over a report's run IDs.
MAX_RUNS_PER_ISSUE = 100


@dataclass(frozen=True)
class RunOfIssue:
    """A run of an issue: its number ``k``, ID, status, the trigger that started it and when it started."""

    run: int
    workflow_id: str
    run_id: str
    status: WorkflowExecutionStatus | None
    trigger: str
    started_at: datetime | None = None


async def runs_of_issue(client: Client, repository: str, issue_number: int) -> list[RunOfIssue]:
    """The issue's runs, oldest first, found by describing ``repair:o/r#N``, ``~2``, ``~3``... in order until one
    does not exist (describe is strongly consistent; visibility, which a list would read, is not)."""
    found: list[RunOfIssue] = []
    for k in range(1, MAX_RUNS_PER_ISSUE + 1):
        workflow_id = workflow_id_for(repository, issue_number, k)
        desc = await _described(client, workflow_id)
        if desc is None:
            break
        found.append(RunOfIssue(k, workflow_id, desc.run_id, desc.status, await _trigger_of(desc), desc.start_time))
    return found


async def newest_run(client: Client, repository: str, issue_number: int) -> RunOfIssue | None:
    """The issue's newest run (:func:`runs_of_issue`); None: no run."""
    found = await runs_of_issue(client, repository, issue_number)
    return found[-1] if found else None


async def trigger_of(client: Client, workflow_id: str) -> str:
    """What started the run (its memo's ``trigger``); ``""`` when the run cannot be described or predates it."""
    try:
        return await _trigger_of(await client.get_workflow_handle(workflow_id).describe())
    except RPCError:
        return ""


async def _described(client: Client, workflow_id: str) -> WorkflowExecutionDescription | None:
    """The run ``workflow_id`` as the server describes it; None when there is no such run."""
    try:
        return await handle_for(client, workflow_id).describe()
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        return None


async def _trigger_of(desc: WorkflowExecutionDescription) -> str:
    memo = await desc.memo()
    value = memo.get(TRIGGER_MEMO)
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class Retry:
    """What :func:`retry_run` did: ``started`` a run (``retry_of``: the ended run it follows), or found
    ``workflow_id`` running (nothing started), or found that the trigger had already started ``workflow_id``
    (``duplicate``: a redelivery, nothing started), or found the trigger older than the newest, ended run
    ``workflow_id``, which started at ``started_at`` (``stale``: a replay, nothing started)."""

    workflow_id: str
    run_id: str = ""
    started: Started | None = None
    running: bool = False
    duplicate: bool = False
    retry_of: str | None = None
    stale: bool = False
    started_at: datetime | None = None


async def retry_run(
    client: Client,
    config: DurafixConfig,
    repository: str,
    issue_number: int,
    *,
    trigger: str,
    report: PinnedReport | None = None,
    event_at: datetime | None = None,
) -> Retry:
    """Start the next run of the issue unless one is live. Never two at once: run ``k+1`` is started only when
    run ``k`` ended, under its deterministic ID with ``REJECT_DUPLICATE``, so of two racing retries one starts
    it and the other finds it running. A trigger that already started any of the issue's runs (the same
    delivery, redelivered or replayed: each run's memo keeps its trigger) starts nothing, and neither does one
    whose event (``event_at``, by its payload) happened before the newest run, ended, started."""
    found = await runs_of_issue(client, repository, issue_number)
    if not found:
        started = await start_run(client, config, repository, issue_number, trigger=trigger, report=report)
        if started.attached:  # a concurrent first trigger won the start
            return Retry(started.workflow_id, started.run_id, running=True)
        return Retry(started.workflow_id, started.run_id, started=started)
    newest = found[-1]
    running = newest.status == WorkflowExecutionStatus.RUNNING
    for earlier in found:
        if earlier.trigger == trigger:
            live = earlier.status == WorkflowExecutionStatus.RUNNING
            return Retry(earlier.workflow_id, earlier.run_id, duplicate=True, running=live)
    if running:
        return Retry(newest.workflow_id, newest.run_id, running=True)
    if before_run(event_at, newest.started_at):
        return Retry(newest.workflow_id, newest.run_id, stale=True, started_at=newest.started_at)
    workflow_id = workflow_id_for(repository, issue_number, newest.run + 1)
    inp = repair_input(config, repository, issue_number, trigger, report)
    try:
        handle = await _start_workflow(client, workflow_id, inp, WorkflowIDConflictPolicy.FAIL)
    except WorkflowAlreadyStartedError:
        # Another retry won the race: its run is the live one (or already ended, which is its own outcome).
        return Retry(workflow_id, running=True)
    run_id = handle.result_run_id or ""
    return Retry(workflow_id, run_id, started=Started(workflow_id, run_id, attached=False), retry_of=newest.workflow_id)


def handle_for(client: Client, workflow_id: str) -> RunHandle:
    return client.get_workflow_handle_for(RepairBugWorkflow.run, workflow_id)


async def get_state(
    client: Client,
    workflow_id: str,
    rpc_timeout: timedelta | None = None,
    description: WorkflowExecutionDescription | None = None,
) -> RunState:
    """The run's live state (the ``state`` query): a worker polling ``durafix-orchestration`` answers it, for
    a closed run too. Without one the server fails it (``no poller seen``) or, while it still remembers a
    poller that died, holds it until ``rpc_timeout``. :func:`recorded_state_of` needs no worker.

    While a repair attempt runs as a child workflow, what it has changed so far (its turns, tokens, phase and
    evidence) is in the attempt's state, not yet in the run's: it is taken from the attempt's own ``state``
    query, as the run takes it back when the attempt ends. An attempt that does not answer leaves the run's.
    A caller that has just described the run passes ``description``, so the run is not described again."""
    state = await handle_for(client, workflow_id).query(RepairBugWorkflow.state, rpc_timeout=rpc_timeout)
    if state.outcome is not None or state.phase != Phase.REPAIR:
        return state
    if description is None:
        description = await handle_for(client, workflow_id).describe()
    for child in running_attempts(description):
        try:
            attempt = await client.get_workflow_handle(child).query(
                "state", result_type=RunState, rpc_timeout=rpc_timeout
            )
        except (RPCError, WorkflowQueryFailedError):
            continue
        take_back(state, attempt)
    return state


def running_attempts(description: WorkflowExecutionDescription) -> list[str]:
    """The workflow IDs of the described run's repair attempts running as child workflows (at most one)."""
    return [
        child.workflow_id
        for child in description.raw_description.pending_children
        if child.workflow_type_name == ATTEMPT_WORKFLOW
    ]


async def get_record(client: Client, workflow_id: str, rpc_timeout: timedelta | None = None) -> RunState:
    """The run's whole state (the ``record`` query: every entry of its lists, which the ``state`` query cuts to
    the latest, :meth:`RunState.bounded`), for a caller deciding over all of them (the reconciler). A worker
    running code from before the query fails it: then the ``state`` query answers, whole as it was then."""
    handle = handle_for(client, workflow_id)
    try:
        return await handle.query(RepairBugWorkflow.record, rpc_timeout=rpc_timeout)
    except WorkflowQueryFailedError:
        return await handle.query(RepairBugWorkflow.state, rpc_timeout=rpc_timeout)


async def recorded_state_of(description: WorkflowExecutionDescription) -> RecordedState | None:
    """The compact state the run last upserted into its memo (:mod:`pipeline.recorded_state`), read from a
    ``describe``: no worker needed. None for a run recorded before it kept one, or before its first phase change."""
    memo = await description.memo()
    return parse_recorded(memo.get(STATE_MEMO))


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


async def deliver(client: Client, workflow_id: str, delivered: Delivered) -> DeliveryAck:
    """Send a webhook delivery's decision as the ``deliver`` Update, its ID the delivery's GUID: the same
    delivery sent again (a redelivery, another receiver) gets the first outcome back and changes nothing
    (``DeliveryAck.duplicate_of``). Refused by the run's validator: ``WorkflowUpdateFailedError``."""
    return await handle_for(client, workflow_id).execute_update(
        RepairBugWorkflow.deliver, delivered, id=f"delivery:{delivered.delivery}"
    )


async def cancel(client: Client, workflow_id: str) -> None:
    await handle_for(client, workflow_id).cancel()


async def status_of(client: Client, workflow_id: str) -> WorkflowExecutionStatus | None:
    desc = await handle_for(client, workflow_id).describe()
    return desc.status


async def status_and_state(client: Client, workflow_id: str) -> tuple[WorkflowExecutionStatus | None, RunState]:
    """The run's status, then its live state, in that order: a state read after a closed status is the run's
    final one, whereas a state read first could be from just before the run's last steps (its closing ticket
    update) and pair with a closed status read after them."""
    status = await status_of(client, workflow_id)
    return status, await get_state(client, workflow_id)


async def polled_states(
    client: Client, workflow_id: str, deadline: float, interval_s: float = 0.5
) -> AsyncIterator[tuple[WorkflowExecutionStatus | None, RunState]]:
    """The run's status and state (:func:`status_and_state`) every ``interval_s`` until ``time.monotonic()``
    passes ``deadline``, for a caller waiting for the run to reach a point: it stops iterating once it has, and
    the iteration ends (without raising) at the deadline. A read that fails is skipped, not raised: the run may not
    exist yet (its trigger not handled) or no worker may answer its query yet."""
    while time.monotonic() < deadline:
        try:
            read = await status_and_state(client, workflow_id)
        except Exception:  # the run not started yet, or its query not answered yet: read again
            await asyncio.sleep(interval_s)
            continue
        yield read
        await asyncio.sleep(interval_s)
