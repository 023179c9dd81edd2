"""Where a run's time goes, read from its Temporal history, beside the same run as a plain loop.

A run's wall time (its first execution's start to its last execution's close) is cut into disjoint parts, so
the parts add up to it. Every execution of the run counts: the parent, its repair attempts' child workflows,
and the executions its review wait continued as new. Where several things happen at once, the instant goes to
the first of these that covers it (:data:`PARTS`, in this order):

- ``activity``: some activity's implementation runs in the worker (:class:`BodyClock` notes when each is
  entered and left, on the wall clock the server's event times share on this host);
- ``handover``: some activity is executing (its ``ActivityTaskStarted`` to its ``ActivityTaskCompleted``)
  but not in its implementation: the task's way from the server to the implementation (the poll's answer,
  decoding its input, the executor's thread) and back (encoding its result, the completion call);
- ``scheduling``: some activity is scheduled and waits for a worker to take it (scheduled -> started);
- ``review``: the run asked for a review (its memo's phase became ``awaiting-review``) and the operator's
  approval is not yet accepted (the Update's ``accepted`` event): the harness's reaction plus the Update's
  round trip;
- ``child``: a child workflow is being started (its ``initiated`` event to its execution's start) or its
  close is being reported to the parent;
- ``continue-as-new``: one execution closed continuing as new and the next one's first task has not started;
- ``task queue``: a workflow task waits for the worker (scheduled -> started);
- ``first task``: the first workflow task of an execution runs in the worker (started -> completed): the
  workflow's instantiation (the sandbox) as well as its first commands;
- ``task``: any other workflow task runs in the worker (started -> completed): the workflow code between
  two steps, the encoding of its commands and state;
- ``other``: none of these (a timer, or the server between a task's completion and what it recorded).

The plain loop (:class:`tests.bench.bench_tax.PlainContext`) records each step it calls with
:class:`StepTime`; its wall time is cut into ``activity`` (some step's implementation running) and ``other``
(the phase code and the loop between steps). Steps are matched across the two ways by name and occurrence
(the n-th call of a step in each), which holds also where two steps run side by side and start in either
order.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from pipeline.recorded_state import STATE_MEMO
from pipeline.state import Phase

ACTIVITY = "activity"
HANDOVER = "handover"
SCHEDULING = "scheduling"
REVIEW = "review"
CHILD = "child"
CONTINUE_AS_NEW = "continue-as-new"
TASK_QUEUE = "task queue"
FIRST_TASK = "first task"
TASK = "task"
OTHER = "other"
# The parts of a run's wall time, first wins where several cover the same instant (see the module docstring).
PARTS = (ACTIVITY, HANDOVER, SCHEDULING, REVIEW, CHILD, CONTINUE_AS_NEW, TASK_QUEUE, FIRST_TASK, TASK, OTHER)

Interval = tuple[float, float]

# How an activity's attempt ends in history, and where its event names the activity's scheduled event.
ENDED: dict[EventType.ValueType, Callable[[HistoryEvent], Any]] = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: lambda e: e.activity_task_completed_event_attributes,
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: lambda e: e.activity_task_failed_event_attributes,
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: lambda e: e.activity_task_timed_out_event_attributes,
}


@dataclass(frozen=True)
class StepTime:
    """One step's execution: its activity type, when it started and ended, and the part of that spent in its
    implementation (seconds on one clock; the plain loop's step is all implementation)."""

    name: str
    span: Interval
    # None where the implementation was not timed apart (the plain loop's call is nothing else).
    body: float | None = None

    @property
    def seconds(self) -> float:
        """Start to end: through Temporal, the history's started -> completed."""
        return self.span[1] - self.span[0]

    @property
    def in_body(self) -> float:
        """The part in the implementation (all of it where ``body`` was not timed)."""
        return self.seconds if self.body is None else self.body


class BodyClock(Interceptor):
    """A worker interceptor noting when each activity attempt's implementation is entered and left in this
    process (the wall clock), by the attempt's run ID and activity ID: what :func:`breakdown` reads as the
    step's own work."""

    def __init__(self) -> None:
        self.bodies: dict[tuple[str, str], Interval] = {}

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Clocked(next, self.bodies)


class _Clocked(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, bodies: dict[tuple[str, str], Interval]) -> None:
        super().__init__(next)
        self.bodies = bodies

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        entered = time.time()
        try:
            return await super().execute_activity(input)
        finally:
            self.bodies[(info.workflow_run_id or "", info.activity_id)] = (entered, time.time())


@dataclass(frozen=True)
class Breakdown:
    """One run's wall time cut into :data:`PARTS` (``parts`` adds up to ``wall``), its steps in the order
    scheduled, and its workflow tasks' own times (seconds)."""

    wall: float
    parts: dict[str, float]
    steps: list[StepTime]
    task_queue: list[float] = field(default_factory=list)
    task_run: list[float] = field(default_factory=list)
    executions: int = 1
    events: int = 0

    @property
    def step_names(self) -> list[str]:
        return [s.name for s in self.steps]


def _t(event: HistoryEvent) -> float:
    return event.event_time.ToNanoseconds() / 1e9


def partition(wall: Interval, covering: dict[str, list[Interval]]) -> dict[str, float]:
    """``wall`` cut into the parts of ``covering`` (a part's intervals), the earlier in :data:`PARTS` taking an
    instant several cover; what none covers is :data:`OTHER`. The values add up to ``wall``'s length."""
    lo, hi = wall
    cuts = sorted({lo, hi, *(x for ivs in covering.values() for iv in ivs for x in iv if lo < x < hi)})
    out = dict.fromkeys(PARTS, 0.0)
    for a, b in itertools.pairwise(cuts):
        mid = (a + b) / 2
        part = next(
            (p for p in PARTS if any(s <= mid < e for s, e in covering.get(p, ()))),
            OTHER,
        )
        out[part] += b - a
    return out


def asked_for_review(event: HistoryEvent) -> bool:
    """A memo upsert recording the phase ``awaiting-review`` (:meth:`pipeline.flow.context.RunContext.record_state`)."""
    if event.event_type != EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED:
        return False
    payload = event.workflow_properties_modified_event_attributes.upserted_memo.fields.get(STATE_MEMO)
    if payload is None:
        return False
    try:
        recorded = json.loads(payload.data)
    except ValueError:
        return False
    return isinstance(recorded, dict) and recorded.get("phase") == Phase.AWAITING_REVIEW.value


def breakdown(
    executions: Sequence[Sequence[HistoryEvent]], bodies: Mapping[tuple[str, str], Interval] | None = None
) -> Breakdown:
    """The breakdown of a run whose executions' histories are ``executions``
    (:func:`tests.support.run_history.run_histories`): its parent's chain continued as new and its children's,
    each a closed execution's whole history. ``bodies``:
    :attr:`BodyClock.bodies` of the workers that ran it (without, an activity's execution is all ``activity``)."""
    bodies = bodies or {}
    covering: dict[str, list[Interval]] = {p: [] for p in PARTS}
    steps: list[tuple[float, StepTime]] = []
    task_queue: list[float] = []
    task_run: list[float] = []
    # A child's workflow ID -> its execution's start and close (its parent's history is read first).
    starts: dict[str, float] = {}
    closes: dict[str, float] = {}
    for events in executions:
        attrs = events[0].workflow_execution_started_event_attributes
        if attrs.parent_workflow_execution.workflow_id:
            starts[attrs.workflow_id] = _t(events[0])
            closes[attrs.workflow_id] = _t(events[-1])
    initiated: dict[int, float] = {}  # initiated event ID -> its time (per parent execution)
    continued_at: float | None = None
    asked: float | None = None
    begin = min(_t(events[0]) for events in executions)
    end = max(_t(events[-1]) for events in executions)
    for events in executions:
        first = events[0]
        own_start = _t(first)
        run_id = first.workflow_execution_started_event_attributes.original_execution_run_id
        scheduled: dict[int, HistoryEvent] = {}
        started: dict[int, float] = {}
        task_scheduled: float | None = None
        task_started: float | None = None
        first_task = True
        initiated.clear()
        if first.workflow_execution_started_event_attributes.continued_execution_run_id and continued_at is not None:
            covering[CONTINUE_AS_NEW].append((continued_at, own_start))
        for event in events:
            kind, at = event.event_type, _t(event)
            if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                scheduled[event.event_id] = event
            elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                sid = event.activity_task_started_event_attributes.scheduled_event_id
                started[sid] = at
                covering[SCHEDULING].append((_t(scheduled[sid]), at))
            elif kind in ENDED:
                sid = ENDED[kind](event).scheduled_event_id
                s = scheduled[sid]
                what = s.activity_task_scheduled_event_attributes
                covering[HANDOVER].append((started.get(sid, at), at))
                body = bodies.get((run_id, what.activity_id))
                if body is not None:
                    covering[ACTIVITY].append(body)
                step = StepTime(
                    what.activity_type.name, (started.get(sid, at), at), body[1] - body[0] if body else None
                )
                steps.append((_t(s), step))
            elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                task_scheduled = at
            elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                task_started = at
                if task_scheduled is not None:
                    covering[TASK_QUEUE].append((task_scheduled, at))
                    task_queue.append(at - task_scheduled)
            elif kind in (EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED):
                if task_started is not None:
                    covering[FIRST_TASK if first_task else TASK].append((task_started, at))
                    task_run.append(at - task_started)
                first_task = False
                task_scheduled = task_started = None
            elif kind == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
                initiated[event.event_id] = at
            elif kind == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
                child_started = event.child_workflow_execution_started_event_attributes
                since = initiated.get(child_started.initiated_event_id, at)
                covering[CHILD].append((since, starts.get(child_started.workflow_execution.workflow_id, at)))
            elif kind in (
                EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED,
                EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_FAILED,
            ):
                child = (
                    event.child_workflow_execution_completed_event_attributes.workflow_execution.workflow_id
                    or event.child_workflow_execution_failed_event_attributes.workflow_execution.workflow_id
                )
                covering[CHILD].append((closes.get(child, at), at))
            elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                continued_at = at
            elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED and asked is not None:
                covering[REVIEW].append((asked, at))
                asked = None
            elif asked_for_review(event):
                asked = at
    return Breakdown(
        wall=end - begin,
        parts=partition((begin, end), covering),
        steps=[s for _, s in sorted(steps, key=lambda pair: pair[0])],
        task_queue=task_queue,
        task_run=task_run,
        executions=len(executions),
        events=sum(len(events) for events in executions),
    )


def plain_breakdown(wall: Interval, steps: Sequence[StepTime]) -> Breakdown:
    """The plain loop's run over ``wall``: its steps as called (see the module docstring)."""
    return Breakdown(
        wall=wall[1] - wall[0],
        parts=partition(wall, {ACTIVITY: [s.span for s in steps]}),
        steps=list(steps),
    )


# ---- comparing the two ways -----------------------------------------------------------------------------


def _occurrences(steps: Iterable[StepTime]) -> dict[tuple[str, int], StepTime]:
    seen: dict[str, int] = {}
    out: dict[tuple[str, int], StepTime] = {}
    for s in steps:
        n = seen.get(s.name, 0)
        seen[s.name] = n + 1
        out[(s.name, n)] = s
    return out


def step_deltas(temporal: Breakdown, plain: Breakdown) -> dict[tuple[str, int], float]:
    """Per step (name, occurrence), the time in its implementation through Temporal minus the plain loop's
    (seconds); steps only one way ran are left out."""
    t, p = _occurrences(temporal.steps), _occurrences(plain.steps)
    return {key: t[key].in_body - p[key].in_body for key in t if key in p}


def median_of(values: Iterable[float]) -> float:
    got = list(values)
    return statistics.median(got) if got else 0.0


# ---- printing -------------------------------------------------------------------------------------------

LABELS = {
    ACTIVITY: "activities: in their implementation",
    HANDOVER: "activities: handed to the implementation and back",
    SCHEDULING: "activities: waiting for a worker (scheduled -> started)",
    REVIEW: "review wait: asked -> approval accepted (the harness)",
    CHILD: "child workflows: start and close reported",
    CONTINUE_AS_NEW: "continue-as-new: close -> next execution's start",
    TASK_QUEUE: "workflow tasks: waiting for the worker",
    FIRST_TASK: "workflow tasks in the worker: an execution's first",
    TASK: "workflow tasks in the worker: the others",
    OTHER: "other (plain: the loop and phase code between steps)",
}
# Parts only the Temporal way has: the plain loop's column shows a dash.
TEMPORAL_ONLY = frozenset(PARTS) - {ACTIVITY, OTHER}
TOP_STEPS = 8


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:+.0f} ms"


def breakdown_lines(pairs: Sequence[tuple[Breakdown, Breakdown]]) -> list[str]:
    """The printed breakdown of rounds of (plain, temporal) runs: medians over the rounds (see the module)."""
    lines = [
        "where each way's wall time goes (medians over rounds; a run's parts add up to its time, their medians "
        "need not):"
    ]
    width = max(len(label) for label in LABELS.values())
    lines.append(f"  {'part':<{width}}  {'plain':>8}  {'temporal':>8}  {'difference':>10}")
    for part in PARTS:
        p = median_of(plain.parts[part] for plain, _ in pairs)
        t = median_of(temporal.parts[part] for _, temporal in pairs)
        plain_cell = "-" if part in TEMPORAL_ONLY else f"{p:.2f} s"
        lines.append(f"  {LABELS[part]:<{width}}  {plain_cell:>8}  {t:>6.2f} s  {t - p:>+8.2f} s")
    tasks = median_of(len(temporal.task_run) for _, temporal in pairs)
    queue = median_of(median_of(temporal.task_queue) for _, temporal in pairs)
    run = median_of(median_of(temporal.task_run) for _, temporal in pairs)
    lines.append(
        f"workflow tasks per run: {tasks:.0f} in {median_of(t.executions for _, t in pairs):.0f} execution(s), "
        f"{median_of(t.events for _, t in pairs):.0f} events; per task (median) {queue * 1000:.1f} ms on the "
        f"queue, {run * 1000:.1f} ms in the worker"
    )
    n_steps = max(median_of(len(temporal.steps) for _, temporal in pairs), 1)
    p_body = median_of(sum(s.in_body for s in plain.steps) for plain, _ in pairs)
    t_body = median_of(sum(s.in_body for s in temporal.steps) for _, temporal in pairs)
    handover = median_of(sum(s.seconds - s.in_body for s in temporal.steps) for _, temporal in pairs)
    lines.append(
        f"steps summed (side-by-side steps overlap): in their implementation plain {p_body:.2f} s, temporal "
        f"{t_body:.2f} s ({_ms((t_body - p_body) / n_steps)} per step); handed over {handover:.2f} s "
        f"({_ms(handover / n_steps)} per step)"
    )
    deltas: dict[tuple[str, int], list[float]] = {}
    plain_s: dict[tuple[str, int], list[float]] = {}
    handed: dict[tuple[str, int], list[float]] = {}
    for plain, temporal in pairs:
        for key, delta in step_deltas(temporal, plain).items():
            deltas.setdefault(key, []).append(delta)
        for key, step in _occurrences(plain.steps).items():
            plain_s.setdefault(key, []).append(step.in_body)
        for key, step in _occurrences(temporal.steps).items():
            handed.setdefault(key, []).append(step.seconds - step.in_body)
    ranked = sorted(deltas, key=lambda key: median_of(deltas[key]), reverse=True)
    lines.append(
        f"the steps whose implementation Temporal's run lengthens most (top {TOP_STEPS}; medians of plain, "
        "temporal - plain, and the handover):"
    )
    for name, n in ranked[:TOP_STEPS]:
        label = f"{name}" + (f" #{n + 1}" if n else "")
        lines.append(
            f"  {label:<{width}}  {median_of(plain_s[(name, n)]) * 1000:>6.0f} ms  "
            f"{_ms(median_of(deltas[(name, n)])):>10}  {_ms(median_of(handed.get((name, n), []))):>8}"
        )
    rest = [median_of(deltas[key]) for key in ranked[TOP_STEPS:]]
    lines.append(f"  the other {len(rest)} steps: {_ms(sum(rest))} in all, median {_ms(median_of(rest))} each")
    return lines
