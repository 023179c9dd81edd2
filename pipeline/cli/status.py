"""What ``durafix status`` shows: the run's recorded state and the work Temporal has pending for it.

The state is the workflow's ``state`` query, facts as the workflow recorded them. The pending activities
come from describing the workflow: what is running right now (or scheduled, or waiting to retry), with the
sub-state its last heartbeat carried (:mod:`pipeline.heartbeat`: the text, or ``{"detail": text, ...}``).

The query needs a worker polling ``durafix-orchestration``. When none answers (every worker died, or none was
started yet after a crash), :func:`live_or_recorded` falls back to what the server holds without one: the
compact state the run upserted into its memo at its last phase change (:mod:`pipeline.recorded_state`) and
the pending activities from ``describe``. :func:`recorded_summary` says plainly that this is not live.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.converter import DataConverter
from temporalio.service import RPCError, RPCStatusCode

from pipeline import client as runs
from pipeline import messages
from pipeline.cli.spending import budget_lines
from pipeline.pricing import ModelPrice
from pipeline.recorded_state import RecordedState
from pipeline.state import CandidateFact, RunState, TriageFact
from pipeline.steps import TaskQueue

QUERY_TIMEOUT = timedelta(seconds=5)
"""How long the state query may wait for a worker before the recorded state is shown instead. The server
fails the query at once when it has seen no poller lately; a poller that died moments ago is still
remembered, and the query then waits for it: this bounds that wait."""

_STATES = {
    PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED: "scheduled",
    PendingActivityState.PENDING_ACTIVITY_STATE_STARTED: "running",
    PendingActivityState.PENDING_ACTIVITY_STATE_CANCEL_REQUESTED: "cancelling",
    PendingActivityState.PENDING_ACTIVITY_STATE_PAUSED: "paused",
    PendingActivityState.PENDING_ACTIVITY_STATE_PAUSE_REQUESTED: "pausing",
}


@dataclass(frozen=True)
class PendingActivity:
    """One activity of the run that Temporal has scheduled and that has not finished.

    ``state`` is ``scheduled`` (not started: first try, or a retry waiting out its backoff), ``running``,
    ``cancelling`` (running, its cancellation not yet seen by a heartbeat), ``paused``, ``pausing`` or
    ``unknown``. ``heartbeat_details`` are the last heartbeat's details as decoded (None without any, or
    when they could not be decoded: then ``detail`` says why); ``detail`` is the sub-state they carry. The
    last heartbeat may be from an earlier attempt: Temporal hands it to the retry.
    """

    activity_id: str
    activity_type: str
    state: str
    attempt: int
    detail: str | None
    heartbeat_details: list[Any] | None
    last_heartbeat_time: datetime | None
    last_started_time: datetime | None
    last_failure: str | None

    def line(self, now: datetime) -> str:
        """``running    env.provision (attempt 1): setup: npm ci (41 s, last heartbeat 2 s ago)``: the
        state, the activity and its attempt, the sub-state, then how long this attempt has run (when it
        started) and how old its last heartbeat is (or that it has sent none yet), and the last failure."""
        text = f"{self.state:<10} {self.activity_type} (attempt {self.attempt})"
        if self.detail:
            text += f": {self.detail}"
        started = self.last_started_time if self.state != "scheduled" else None
        notes: list[str] = []
        if started is not None:
            notes.append(age_text(now - started))
        beat = self.last_heartbeat_time
        if beat is not None and (started is None or beat >= started):
            notes.append(f"last heartbeat {age_text(now - beat)} ago")
        elif started is not None:
            notes.append("no heartbeat yet" + ("; the detail is an earlier attempt's" if self.detail else ""))
        if self.last_failure:
            notes.append(f"last failure: {self.last_failure}")
        return text + (f" ({', '.join(notes)})" if notes else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "activity_id": self.activity_id,
            "activity_type": self.activity_type,
            "state": self.state,
            "attempt": self.attempt,
            "detail": self.detail,
            "heartbeat_details": self.heartbeat_details,
            "last_heartbeat_time": _iso(self.last_heartbeat_time),
            "last_started_time": _iso(self.last_started_time),
            "last_failure": self.last_failure,
        }


async def pending_activities(description: WorkflowExecutionDescription) -> list[PendingActivity]:
    """The pending activities of a described workflow, heartbeat details decoded with the data converter of
    the client that described it (the one the workers encode with)."""
    return [
        await decode_pending_activity(info, description.data_converter)
        for info in description.raw_description.pending_activities
    ]


async def run_pending_activities(client: Client, description: WorkflowExecutionDescription) -> list[PendingActivity]:
    """:func:`pending_activities` of a described run, and of the repair attempt it runs as a child workflow
    (where an attempt's steps are)."""
    pending = await pending_activities(description)
    for child in runs.running_attempts(description):
        pending += await pending_activities(await client.get_workflow_handle(child).describe())
    return pending


async def decode_pending_activity(info: PendingActivityInfo, converter: DataConverter) -> PendingActivity:
    """One ``PendingActivityInfo``, its heartbeat details decoded with ``converter``. Details that do not
    decode do not fail the description: ``detail`` says they are unreadable, and why."""
    values: list[Any] | None = None
    detail: str | None = None
    if info.HasField("heartbeat_details") and info.heartbeat_details.payloads:
        try:
            values = await converter.decode(info.heartbeat_details.payloads)
        except (KeyError, RuntimeError, ValueError) as err:
            # KeyError: an encoding this converter does not know; the others: a payload it cannot convert.
            detail = f"(heartbeat details not readable: {err})"
        else:
            detail = heartbeat_detail(values)
    failure = info.last_failure.message.strip().splitlines() if info.HasField("last_failure") else []
    return PendingActivity(
        activity_id=info.activity_id,
        activity_type=info.activity_type.name,
        state=_STATES.get(info.state, "unknown"),
        attempt=info.attempt,
        detail=detail,
        heartbeat_details=values,
        last_heartbeat_time=_time(info.last_heartbeat_time, info.HasField("last_heartbeat_time")),
        last_started_time=_time(info.last_started_time, info.HasField("last_started_time")),
        last_failure=failure[0] if failure else None,
    )


def heartbeat_detail(values: Sequence[Any]) -> str | None:
    """The sub-state heartbeat details carry: the text, or the ``detail`` of a ``{"detail": text, ...}``;
    anything else as compact JSON (shown as sent rather than hidden); None without details."""
    if not values:
        return None
    first = values[0]
    if isinstance(first, str):
        return first
    if isinstance(first, dict) and isinstance(first.get("detail"), str):
        detail: str = first["detail"]
        return detail
    return json.dumps(first, default=str, separators=(",", ":"))


def age_text(delta: timedelta) -> str:
    """``41 s``, ``12 min``, ``3 h``: whole units, rounded down; a negative age (clock skew) is ``0 s``."""
    seconds = max(int(delta.total_seconds()), 0)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def _time(stamp: Timestamp, present: bool) -> datetime | None:
    return stamp.ToDatetime(tzinfo=UTC) if present else None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def triage_summary(triage: TriageFact) -> list[str]:
    """The typed reason of a triage ending (:func:`pipeline.messages.triage_items`, plain): the reason, and for an
    environment that could not be set up the command it failed on, its stored log (key, sha256, link) and the
    hint, when known."""
    return [f"{label:<10} {value}" for label, value in messages.triage_items(triage, markdown=False)]


def _drafted(state: RunState) -> str:
    """``, drafted from the report: round 2 of 3`` when the model drafted the reproduction, else empty."""
    drafting = state.drafting
    if drafting is None or drafting.accepted is None:
        return ""
    return f", drafted from the report: round {drafting.accepted} of {drafting.max_rounds}"


def _draft_rounds(state: RunState) -> list[str]:
    """A line per drafted reproduction while none has been accepted: its kind and what its run on the base found."""
    assert state.drafting is not None
    return [
        f"draft {r.round}    a {r.kind.value} reproduction: {r.status or 'running'}"
        + (f"; {r.detail}" if r.detail else "")
        for r in state.drafting.rounds
    ]


def _candidate_label(c: CandidateFact) -> str:
    """``attempt N`` for a repair attempt; what the others are (they carry attempt 0), by what they hold."""
    if c.rebuilt_from:
        return f"rebuilt    {c.rebuilt_from[:12]} on the moved base {(c.base_revision or '-')[:12]}:"
    if c.pushed_head:
        return f"head       {c.pushed_head[:12]} pushed by {c.pushed_by or 'someone'}:"
    if c.revision:
        return f"revision {c.revision}"
    return f"attempt {c.attempt}"


def state_summary(
    state: RunState,
    status: WorkflowExecutionStatus | None,
    pending: Sequence[PendingActivity] = (),
    now: datetime | None = None,
    prices: Mapping[str, ModelPrice] | None = None,
) -> str:
    """The run for a human: its identity, Temporal status and phase, each pending activity (its times
    relative to ``now``), then what the run has recorded, phase by phase, and its budgets (the cost from
    ``prices``, :mod:`pipeline.cli.spending`)."""
    lines = [
        f"run        {state.workflow_id}  (run {state.run_id[:8]}, workflow v{state.workflow_version})",
        f"status     {status.name.lower() if status else 'unknown'}; phase {state.phase.value}"
        + (f" (side by side: {', '.join(state.checks_beside)})" if state.checks_beside else "")
        + (f"; outcome {state.outcome.value}" if state.outcome else ""),
    ]
    if state.outcome_detail:
        lines.append(f"detail     {state.outcome_detail}")
    if state.triage is not None:
        lines.extend(triage_summary(state.triage))
    lines.extend(activity.line(now or datetime.now(UTC)) for activity in pending)
    if state.target_revision:
        lines.append(f"base       {state.target_revision}")
    if state.ticket:
        lines.append(f"ticket     {state.ticket.url}  (op {state.ticket.op_id})")
    if state.environment:
        env = state.environment
        where = f" on host {env.host}" if env.host else ""
        lines.append(f"env        {env.provider}:{env.env_id} at {env.base_url}{where} [{env.last_status}]")
    if state.reproduction:
        lines.append(
            f"reproduce  {state.reproduction.status} on {state.reproduction.revision[:12]}"
            f" (a {state.reproduction_kind.value} reproduction{_drafted(state)})"
        )
    if state.drafting is not None and state.drafting.accepted is None:
        lines.extend(_draft_rounds(state))
    if state.reproduction_seed is not None:
        seeded = ", ".join(state.reproduction_seed.files)
        lines.append(f"seeded     {seeded}: the reproduction's test, in every attempt and the PR")
    if state.baseline:
        lines.append(f"baseline   recipe tests on base: {state.baseline.summary}")
    lines.extend(_not_shown(state.omitted.candidates, "attempt"))
    for c in state.candidates:
        label = _candidate_label(c)
        lines.append(
            f"{label}{' ' if label.endswith(':') else '  '}{c.verification}; commit {c.commit or '-'}"
            + (f"; {c.failure}" if c.failure else "")
        )
    if state.publish:
        p = state.publish
        lines.append(f"publish    {p.branch} @ {p.commit[:12]}; PR {p.pr_url or '-'}")
        if p.evidence_digest:
            lines.append(f"evidence   bundle {p.evidence_digest}")
    lines.extend(_not_shown(state.omitted.head_pushes, "pushed"))
    for push in state.head_pushes:
        by = f" by {push.pusher}" if push.pusher else ""
        lines.append(
            f"pushed     {push.head_sha[:12]}{by} ({push.source or 'seen'}): {push.status.value}"
            + (f"; {push.detail}" if push.detail else "")
        )
    if state.pending_approval:
        a = state.pending_approval
        lines.append(f"awaiting   approval of PR #{a.pr_number} head {a.head_sha}")
    if state.deliveries:
        last = state.deliveries[-1]
        delivered = state.omitted.total("deliveries", len(state.deliveries))
        lines.append(f"webhooks   {delivered} delivered; last {last.kind.value}: {last.what}")
    if state.approval:
        until = f" until {state.approval.expires_at.isoformat()}" if state.approval.expires_at else ""
        lines.append(f"approved   {state.approval.head_sha[:12]} by {state.approval.reviewer}{until}")
    if state.merged_sha:
        lines.append(f"merged     {state.merged_sha}")
    lines.extend(budget_lines(state.budgets, prices))
    if state.cleanup:
        lines.append(
            f"cleanup    {'complete' if state.cleanup.complete else 'INCOMPLETE'}; removed {state.cleanup.removed}"
            + (f"; remaining {state.cleanup.remaining}" if state.cleanup.remaining else "")
        )
    if state.cancellation:
        lines.append("cancel     " + " -> ".join(m.step.value for m in state.cancellation))
    lines.append(f"artifacts  {state.omitted.total('evidence', len(state.evidence))} stored (sha256-addressed)")
    if state.record_ref is not None:
        lines.append(f"record     the whole state: {state.record_ref.key} (sha256 {state.record_ref.sha256})")
    if status == WorkflowExecutionStatus.TERMINATED:
        lines.append(
            "WARNING    the run was terminated: its own cleanup did not run and the state above is as of the\n"
            f"           termination. Check `durafix resources --run {state.workflow_id}` and clean up with\n"
            f"           `durafix cleanup --run {state.workflow_id}`; check the forge for a half-finished step."
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class NotLive:
    """The state query went unanswered (``reason``); ``recorded`` is what the run last upserted into its memo
    (None: it kept none, a run recorded before it did or one that has not changed phase yet)."""

    reason: str
    recorded: RecordedState | None

    def notice(self) -> str:
        if self.recorded is None:
            return f"{self.reason}; the run recorded no state the server keeps, showing what Temporal holds"
        return f"{self.reason}; showing the state recorded at {self.recorded.at.isoformat()}"

    def to_json(self) -> dict[str, Any]:
        return {
            "live": False,
            "notice": self.notice(),
            "recorded": self.recorded.model_dump(mode="json") if self.recorded else None,
        }


async def live_or_recorded(
    client: Client, workflow_id: str, description: WorkflowExecutionDescription
) -> RunState | NotLive:
    """The live state, or (no worker answered within :data:`QUERY_TIMEOUT`) the recorded one. A run Temporal
    does not know still raises ``RPCError(NOT_FOUND)``; a query the workflow failed still raises."""
    queue = TaskQueue.ORCHESTRATION.value
    try:
        return await asyncio.wait_for(
            runs.get_state(client, workflow_id, rpc_timeout=QUERY_TIMEOUT, description=description),
            QUERY_TIMEOUT.total_seconds() + 5,
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise
        # The query's own deadline ran out: the server answers DEADLINE_EXCEEDED, or the client gives up first
        # ("Timeout expired", CANCELLED). Either way no worker answered in time.
        if err.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED) or "Timeout expired" in err.message:
            reason = _silent(queue)
        elif "poller" in err.message:
            reason = f"no worker is polling {queue}"
        else:
            reason = f"the state query failed ({err.message})"
    except TimeoutError:
        reason = _silent(queue)
    return NotLive(reason, await runs.recorded_state_of(description))


def _silent(queue: str) -> str:
    return f"no worker polling {queue} answered within {QUERY_TIMEOUT.total_seconds():.0f} s"


def recorded_summary(
    workflow_id: str,
    description: WorkflowExecutionDescription,
    not_live: NotLive,
    pending: Sequence[PendingActivity] = (),
    now: datetime | None = None,
) -> str:
    """The run for a human when no worker answers: the notice first, then the recorded state, the pending
    activities the server holds and, for a terminated run, the same warning as :func:`state_summary`."""
    status = description.status
    rec = not_live.recorded
    phase = f"; phase {rec.phase}" + (f"; outcome {rec.outcome}" if rec.outcome else "") if rec else ""
    lines = [
        f"NOTICE     {not_live.notice()}",
        f"run        {workflow_id}  (run {description.run_id[:8]})",
        f"status     {status.name.lower() if status else 'unknown'}{phase}",
    ]
    if rec is not None:
        # (label, whether the run recorded it, the line's text): a line only for what was recorded.
        recorded: tuple[tuple[str, object, str], ...] = (
            ("detail", rec.detail, f"{rec.detail}"),
            ("ticket", rec.ticket, f"{rec.ticket}"),
            ("attempts", rec.attempts, f"{rec.attempts}"),
            ("publish", rec.branch, f"{rec.branch} @ {(rec.commit or '-')[:12]}; PR {rec.pr or '-'}"),
            ("awaiting", rec.awaiting, f"approval of {rec.awaiting}"),
            ("merged", rec.merged, f"{rec.merged}"),
            ("cleanup", rec.cleanup, f"{rec.cleanup}"),
        )
        lines.extend(f"{label:<10} {text}" for label, shown, text in recorded if shown)
    lines.extend(activity.line(now or datetime.now(UTC)) for activity in pending)
    if status == WorkflowExecutionStatus.RUNNING:
        lines.append(
            "           start a worker (`durafix worker`) to resume the run and see its live state; see\n"
            "           docs/runbooks/restart-after-a-crash.md"
        )
    elif status == WorkflowExecutionStatus.TERMINATED:
        lines.append(
            "WARNING    the run was terminated: its own cleanup did not run. Check `durafix resources --run "
            f"{workflow_id}`\n           and clean up with `durafix cleanup --run {workflow_id}`."
        )
    return "\n".join(lines)


def _not_shown(count: int, label: str) -> list[str]:
    """The line saying ``count`` earlier entries were cut from the state (:meth:`RunState.bounded`), if any."""
    return [f"{label:<10} {count} earlier not shown (the run's record holds them)"] if count else []
