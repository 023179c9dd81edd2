"""What the runs page shows, read from Temporal: every run's row, and one run's timeline.

Contracts:

- A run's facts come from the workflow itself, as ``durafix status`` reads them: a running run's ``state``
  query (bounded by :data:`pipeline.cli.status.QUERY_TIMEOUT`; without a worker to answer, the compact state
  it recorded in its memo, marked not live), a completed run's result (no worker needed), and for a run that
  failed, was cancelled, terminated or timed out, its recorded memo. What is running right now (the sub-state)
  is its pending activities' last heartbeat (``describe``).
- Rows are the newest :data:`MAX_RUNS` executions of ``repair_bug`` (a review wait that continued as new is one
  run: its closed links are left out), read at most :data:`CONCURRENT_READS` at once.
- Nothing here changes a run; nothing is read from the forge.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import quote

from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowQueryFailedError,
)
from temporalio.service import RPCError

from environments.inventory import open_holders, resource_row, take_inventory
from pipeline import client as runs
from pipeline.cli.status import NotLive, PendingActivity, live_or_recorded, run_pending_activities
from pipeline.config import DurafixConfig
from pipeline.history import summarize_history
from pipeline.ids import parse_workflow_id
from pipeline.pricing import ModelPrice, money, run_cost
from pipeline.recorded_state import RecordedState
from pipeline.state import RunState

MAX_RUNS = 200
CONCURRENT_READS = 8
T = TypeVar("T")


@dataclass(frozen=True)
class RunRow:
    """One run as the list shows it. ``live``: the facts are the run's own answer (query or result), not the
    memo it last recorded. ``outcome``: the run's, or how Temporal closed it (``failed``, ``cancelled`` ...)."""

    workflow_id: str
    run_id: str
    repository: str
    issue: int | None
    status: str
    phase: str
    sub_state: str
    started: datetime
    closed: datetime | None
    outcome: str | None
    detail: str
    attempts: int
    tokens: int | None
    cost: str | None
    ticket_url: str | None
    pr_url: str | None
    report_url: str | None
    temporal_url: str | None
    live: bool


@dataclass(frozen=True)
class RunDetail:
    """One run's page: its row, its phases, its steps (activity events of its history), the heads pushed and
    how each was judged, and what it owns on this host."""

    row: RunRow
    phases: list[tuple[str, datetime]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    heads: list[tuple[str, str, str]] = field(default_factory=list)
    resources: list[tuple[str, ...]] = field(default_factory=list)
    cleanup: str | None = None
    not_live: str = ""


def temporal_link(config: DurafixConfig, workflow_id: str, run_id: str) -> str | None:
    """The run in the Temporal UI, when its URL is configured."""
    if not config.temporal_ui_url:
        return None
    base = config.temporal_ui_url.rstrip("/")
    namespace = quote(config.temporal_namespace, safe="")
    return f"{base}/namespaces/{namespace}/workflows/{quote(workflow_id, safe='')}/{quote(run_id, safe='')}/history"


def _split_id(workflow_id: str) -> tuple[str, int | None]:
    """The run's repository and issue from its ID; an ID of another shape as itself, without an issue."""
    try:
        return parse_workflow_id(workflow_id)
    except ValueError:
        return workflow_id, None


async def _bounded(jobs: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    gate = asyncio.Semaphore(CONCURRENT_READS)

    async def one(job: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await job()

    return list(await asyncio.gather(*(one(job) for job in jobs)))


async def list_runs(client: Client, config: DurafixConfig) -> list[RunRow]:
    """The newest runs, newest first (see the module's contracts)."""
    executions: list[WorkflowExecution] = []
    async for execution in client.list_workflows("WorkflowType = 'repair_bug'", limit=MAX_RUNS * 2):
        if execution.status != WorkflowExecutionStatus.CONTINUED_AS_NEW:
            executions.append(execution)
        if len(executions) >= MAX_RUNS:
            break
    executions.sort(key=lambda e: e.start_time, reverse=True)
    facts = await _bounded([functools.partial(_facts, client, e) for e in executions])
    return [
        _row(config, e, state, recorded, pending)
        for e, (state, recorded, pending, _) in zip(executions, facts, strict=True)
    ]


async def _facts(
    client: Client, execution: WorkflowExecution
) -> tuple[RunState | None, RecordedState | None, list[PendingActivity], str]:
    """The run's state (None when only its memo is known), its memo, its pending activities, and why the state
    is not live (``""`` when it is)."""
    handle = client.get_workflow_handle(execution.id, run_id=execution.run_id, result_type=RunState)
    description = await handle.describe()
    recorded = await runs.recorded_state_of(description)
    if execution.status == WorkflowExecutionStatus.RUNNING:
        pending = await run_pending_activities(client, description)
        try:
            found: RunState | NotLive = await live_or_recorded(client, execution.id, description)
        except WorkflowQueryFailedError as err:
            # A run whose code fails its query (a failing workflow task) is still listed, by what it recorded.
            found = NotLive(f"its state query failed: {err}", recorded)
        if isinstance(found, NotLive):
            return None, found.recorded or recorded, pending, found.reason
        return found, recorded, pending, ""
    if execution.status == WorkflowExecutionStatus.COMPLETED:
        try:
            return await handle.result(follow_runs=False), recorded, [], ""
        except (WorkflowFailureError, RPCError) as err:
            return None, recorded, [], f"its result could not be read ({type(err).__name__})"
    return None, recorded, [], "it closed without a result; what it last recorded"


def _status(execution: WorkflowExecution) -> str:
    return execution.status.name.lower() if execution.status else "unknown"


def _row(
    config: DurafixConfig,
    execution: WorkflowExecution,
    state: RunState | None,
    recorded: RecordedState | None,
    pending: Sequence[PendingActivity],
    prices: Mapping[str, ModelPrice] | None = None,
) -> RunRow:
    repository, issue = _split_id(execution.id)
    status = _status(execution)
    sub_state = "; ".join(
        f"{p.activity_type}" + (f": {p.detail}" if p.detail else "") + (f" ({p.state})" if p.state != "running" else "")
        for p in pending
    )
    common: dict[str, Any] = {
        "workflow_id": execution.id,
        "run_id": execution.run_id,
        "status": status,
        "sub_state": sub_state,
        "started": execution.start_time,
        "closed": execution.close_time,
        "temporal_url": temporal_link(config, execution.id, execution.run_id),
    }
    if state is not None:
        publish = state.publish
        cost = run_cost(state.budgets, prices if prices is not None else config.model_prices)
        return RunRow(
            **common,
            repository=state.repository,
            issue=state.issue_number,
            phase=state.phase.value,
            outcome=state.outcome.value if state.outcome else (None if status == "running" else status),
            detail=state.outcome_detail,
            attempts=len(state.candidates),
            tokens=state.budgets.model_tokens,
            cost=money(cost.run) if cost.run is not None else None,
            ticket_url=state.ticket.url if state.ticket else None,
            pr_url=publish.pr_url if publish else None,
            report_url=publish.report_url if publish else None,
            live=True,
        )
    return RunRow(
        **common,
        repository=repository,
        issue=issue,
        phase=recorded.phase if recorded else "unknown",
        outcome=(recorded.outcome if recorded and recorded.outcome else None)
        or (None if status == "running" else status),
        detail=recorded.detail if recorded else "",
        attempts=recorded.attempts if recorded else 0,
        tokens=None,
        cost=None,
        ticket_url=recorded.ticket if recorded else None,
        pr_url=recorded.pr if recorded else None,
        report_url=None,
        live=False,
    )


async def run_detail(client: Client, config: DurafixConfig, workflow_id: str) -> RunDetail:
    """One run's page (its latest execution); ``RPCError(NOT_FOUND)`` for a run Temporal does not know."""
    execution = await client.get_workflow_handle(workflow_id).describe()
    state, recorded, pending, not_live = await _facts(client, execution)
    history = await client.get_workflow_handle(workflow_id, run_id=execution.run_id).fetch_history()
    steps = [r for r in summarize_history(history) if r["event"].startswith(("activity_task_", "child_workflow_"))]
    phases: list[tuple[str, datetime]] = []
    heads: list[tuple[str, str, str]] = []
    cleanup = recorded.cleanup if recorded else None
    if state is not None:
        phases = [(mark.phase.value, mark.at) for mark in state.timeline]
        for candidate in state.candidates:
            verdict = candidate.verification.value + (f" ({candidate.test_summary})" if candidate.test_summary else "")
            heads.append((candidate.commit or "-", f"attempt {candidate.attempt}: {verdict}", candidate.summary))
        if state.publish is not None:
            heads.append((state.publish.commit, "pushed by the run", state.publish.branch))
        for push in state.head_pushes:
            heads.append((push.head_sha, f"pushed by {push.pusher or 'someone'}: {push.status.value}", push.detail))
        cleanup = state.cleanup.status.value if state.cleanup else None
    return RunDetail(
        row=_row(config, execution, state, recorded, pending),
        phases=phases,
        steps=steps,
        heads=heads,
        resources=owned_here(config, workflow_id),
        cleanup=cleanup,
        not_live=not_live,
    )


def owned_here(config: DurafixConfig, workflow_id: str) -> list[tuple[str, ...]]:
    """What the run owns on this host, as ``durafix resources --run`` lists it (provider, kind, ID, run,
    operation, status), and a row for each holder that could not be listed."""
    holders, unopened = open_holders(
        config.state_dir, environment_provider=config.environment_provider, docker_host=config.docker_host
    )
    inventory = take_inventory(holders, unopened, workflow_id)
    rows = [resource_row(r) for r in inventory.resources]
    return rows + [(item.name, "", "", "", "", f"not listed: {item.reason}") for item in inventory.unavailable]


def age(started: datetime, now: datetime | None = None) -> str:
    """How long ago ``started`` was, as ``3 d 4 h``, ``5 h 12 min``, ``7 min`` or ``12 s``."""
    seconds = int(((now or datetime.now(UTC)) - started).total_seconds())
    days, rest = divmod(max(0, seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min" if minutes else f"{secs} s"
