"""The run context every phase of ``repair_bug`` is given: the run's state, the step runner, and the few
helpers all phases share (phase entry, evidence record, memo, ticket, clock).

One :class:`RunContext` exists per workflow run. It holds the mutable state of the run (the query's
:class:`RunState` and what the run keeps beside it) and is the only way a phase reaches Temporal: an activity
through :meth:`RunContext.step` (or :meth:`RunContext.model_step` for a step that asks the model), a patch
through :meth:`RunContext.patched` at the call site that always asked it, the clock, timers and waits through
:meth:`RunContext.now`, :meth:`RunContext.sleep` and :meth:`RunContext.wait_for`. A driver other than Temporal
(the durability-tax benchmark's plain loop) runs the same phases on a context of its own that overrides these.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, CancelledError, TimeoutType
from temporalio.exceptions import TimeoutError as ActivityTimeout
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel

    from environments.interface import EnvironmentHandle
    from evidence.interface import ArtifactRef
    from pipeline import accounting, messages, steps
    from pipeline.failures import failure_details, failure_message, worker_lost
    from pipeline.flow.attempt_carry import ATTEMPT_WORKFLOW, AttemptInput, AttemptOutcome
    from pipeline.flow.carry import ReviewCarry, RunCarry
    from pipeline.hosts import host_queue
    from pipeline.ids import attempt_workflow_id
    from pipeline.inputs import RepairInput
    from pipeline.patches import HOST_WORKER_LOST_PATCH, LATE_COMPLETION_PATCH, MODEL_OUTAGE_PATCH, STATE_MEMO_PATCH
    from pipeline.recorded_state import STATE_MEMO, recorded_state
    from pipeline.state import (
        Approval,
        Budgets,
        CancelMark,
        CancelStep,
        HeadPush,
        Outcome,
        Phase,
        PhaseMark,
        Rejection,
        RunState,
    )
    from pipeline.steps import EnsureCommentInput, ReportInfo, Step, TaskQueue, UpdateTicketInput

In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out")

# A step bound to a host is tried there this many times per send (see :func:`host_retries`).
HOST_TRIES = 2


class RunEnded(Exception):
    """Control flow: the run reached a terminal outcome before the merge."""

    def __init__(self, outcome: Outcome, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail


@dataclass
class ReviewDecisions:
    """What the handlers decided about the run's PR and the review wait has not acted on yet.

    ``approval``: the approval taken (the run's record of it, ``RunState.approval``, is set when the merge
    starts). ``rejection``: a reject command or closed PR. ``revision_request``: a review requesting changes of
    the head under review. ``moved_head``: the moved head to verify next (the latest seen wins). ``gate``: this
    run gates moved heads (MOVED_HEAD_PATCH, decided when the review wait is first entered): a plain value the
    validators read, never a patch call. ``revising``: a revision runs (a rejection then still stands, at its
    end). ``review_note``: said on the ticket while the run waits again after an approval that did not stand.
    """

    approval: Approval | None = None
    rejection: Rejection | None = None
    revision_request: Rejection | None = None
    moved_head: HeadPush | None = None
    gate: bool = False
    revising: bool = False
    review_note: str = ""


# What a run continued as new carries of its review decisions, under the same names there and in
# :class:`~pipeline.flow.carry.ReviewCarry` (its context besides: :meth:`RunContext.carried`).
CARRIED_DECISIONS = ("approval", "rejection", "revision_request", "moved_head", "review_note")


@dataclass
class RunContext:
    """The run's mutable state and its one door to Temporal (see the module docstring)."""

    input: RepairInput
    state: RunState
    decisions: ReviewDecisions = field(default_factory=ReviewDecisions)
    report: ReportInfo | None = None
    spec_ref: ArtifactRef | None = None
    procedure_ref: ArtifactRef | None = None
    live_envs: dict[str, EnvironmentHandle] = field(default_factory=dict)
    # The hosts that held the run's environments, in order of first use: each cleans up its share at the end.
    hosts: list[str] = field(default_factory=list)
    cancellation_v2: bool = True
    ending: bool = False
    # Said on the ticket until the end: the final update rewrites the same comment.
    closing_note: str = ""
    # Ticket updates from a signal handler and from the run never interleave: each body is computed when its
    # turn comes, so the last write carries the latest state. Uncontended, it never yields.
    ticket_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Forge writes started behind the run's work (:meth:`write_behind`), not yet awaited.
    behind: list[asyncio.Task[None]] = field(default_factory=list)

    def carried(self) -> dict[str, Any]:
        """The run's context as another workflow takes it up (:class:`~pipeline.flow.carry.RunCarry`'s fields)."""
        assert self.report is not None and self.spec_ref is not None and self.procedure_ref is not None
        return {name: getattr(self, name) for name in RunCarry.model_fields}

    def take_up(self, carry: RunCarry) -> None:
        """Take up the run's context as ``carry`` has it (its state is already :attr:`state`)."""
        self.report, self.spec_ref, self.procedure_ref = carry.report, carry.spec_ref, carry.procedure_ref
        self.hosts = list(carry.hosts)
        self.live_envs = dict(carry.live_envs)
        self.cancellation_v2 = carry.cancellation_v2

    def resume(self, carry: ReviewCarry) -> None:
        """Take up what the previous execution of the run carried (its state is already :attr:`state`)."""
        self.take_up(carry)
        self.closing_note = carry.closing_note
        self.decisions = ReviewDecisions(**{name: getattr(carry, name) for name in CARRIED_DECISIONS})

    def carry(self, head: str, renewals: int, continued: int) -> ReviewCarry:
        """What the next execution of the run continues with (see :mod:`pipeline.flow.carry`)."""
        return ReviewCarry(
            **self.carried(),
            closing_note=self.closing_note,
            head=head,
            renewals=renewals,
            continued=continued,
            **{name: getattr(self.decisions, name) for name in CARRIED_DECISIONS},
        )

    # ---- facts of the run -----------------------------------------------------------------------------

    @property
    def wf(self) -> str:
        """The workflow ID: the prefix of every operation ID of the run."""
        return self.state.workflow_id

    @property
    def spec(self) -> ArtifactRef:
        """The run's environment spec (prepared in ``provision``; every later phase needs it)."""
        assert self.spec_ref is not None
        return self.spec_ref

    @property
    def the_report(self) -> ReportInfo:
        """The report as pinned at intake (every phase after intake works on it)."""
        assert self.report is not None
        return self.report

    # ---- the run's clock, patches and waits: the only Temporal calls a phase makes --------------------

    def now(self) -> datetime:
        return workflow.now()

    def patched(self, patch_id: str) -> bool:
        """Whether the run takes the branch of ``patch_id`` (``workflow.patched``: its marker is recorded)."""
        return workflow.patched(patch_id)

    async def sleep(self, seconds: float) -> None:
        """A durable wait (a timer)."""
        await workflow.sleep(timedelta(seconds=seconds))

    async def wait_for(self, condition: Callable[[], bool], timeout: timedelta) -> bool:
        """Wait until ``condition`` holds (True), or ``timeout`` passed first (False)."""
        try:
            await workflow.wait_condition(condition, timeout=timeout)
        except TimeoutError:
            return False
        return True

    async def attempt_in_child(self, inp: AttemptInput) -> AttemptOutcome:
        """One repair attempt as the child workflow ``repair_attempt`` (:mod:`pipeline.flow.attempt`), on the
        orchestration queue, under the attempt's own workflow ID."""
        outcome: AttemptOutcome = await workflow.execute_child_workflow(
            ATTEMPT_WORKFLOW,
            inp,
            id=attempt_workflow_id(self.wf, inp.order.attempt),
            task_queue=TaskQueue.ORCHESTRATION.value,
            result_type=AttemptOutcome,
        )
        return outcome

    def history_beyond(self, events: int, size: int) -> bool:
        """Whether this execution's history should continue as new: the server suggests it, or it holds
        ``events`` events or ``size`` bytes."""
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= events
            or info.get_current_history_size() >= size
        )

    def enter(self, phase: Phase) -> None:
        if self.state.phase != phase:
            self.state.phase = phase
            self.state.timeline.append(PhaseMark(phase=phase, at=self.now()))
            self.record_state()

    def record_state(self) -> None:
        """Upsert the compact state into the memo (:mod:`pipeline.recorded_state`), which the server keeps
        and ``describe`` returns: what ``durafix status`` shows while no worker can answer the query."""
        if self.patched(STATE_MEMO_PATCH):
            workflow.upsert_memo({STATE_MEMO: recorded_state(self.state, self.now())})

    def record(self, ref: ArtifactRef) -> None:
        """Add ``ref`` to the run's evidence, once."""
        if all(r.sha256 != ref.sha256 or r.name != ref.name for r in self.state.evidence):
            self.state.evidence.append(ref)

    def count_tokens(self, err: BaseException) -> None:
        """Tokens spent by a failed model call still count against the budget (its transport failures are
        counted too)."""
        accounting.charge_failure(self.state.budgets, err)

    def clear_approval(self) -> Approval | None:
        """The one place an approval is dropped (taken and recorded alike); returns the one dropped, if any."""
        previous = self.decisions.approval or self.state.approval
        self.decisions.approval = None
        self.state.approval = None
        return previous

    def cancel_requested(self) -> bool:
        """Whether a cancellation request has reached the run (before its ending began).

        Deterministic: the request is an event in the history. Checked after every activity, so a result
        that arrives after the request (the activity finished before it learned of the cancellation) is
        never acted on; runs recorded before this check keep replaying as they ran.
        """
        return not self.ending and workflow.cancellation_reason() is not None and self.patched(LATE_COMPLETION_PATCH)

    def cancel_step(self, step: CancelStep, detail: str = "") -> None:
        self.state.cancellation.append(CancelMark(step=step, at=self.now(), detail=detail))

    # ---- ticket and PR ----------------------------------------------------------------------------------

    async def update_ticket(self, note: str = "", *, closing: bool = False) -> None:
        ticket = self.state.ticket
        if ticket is None:
            return
        async with self.ticket_lock:
            await self.step(
                steps.UPDATE_TICKET,
                UpdateTicketInput(
                    repository=self.input.repository,
                    issue_number=ticket.issue_number,
                    comment_id=ticket.comment_id,
                    op_id=ticket.op_id,
                    body=messages.ticket_body(self.state, note),
                    closing=closing,
                ),
            )

    def write_behind(self, note: str = "") -> None:
        """Start a ticket update without waiting for it (FORGE_WRITES_BEHIND_PATCH): it overlaps with the run's
        next work, holding :attr:`ticket_lock` as every ticket update does, so updates still reach the forge one
        at a time and in order, each body computed when its turn comes. Same step, same comment, same operation
        ID as an awaited update: idempotent as that is. :meth:`settle_behind` waits for it before the next human
        step, so a failure still ends the run; the ending waits for it too (its own update takes the lock)."""
        self.behind.append(asyncio.create_task(self.update_ticket(note=note)))

    async def settle_behind(self, *, ending: bool = False) -> None:
        """Wait for every write started behind the run's work. Outside the ending the first that failed raises
        here, as it would have where it was started; in the ending a failure is only noted (the final update
        rewrites the same comment)."""
        pending, self.behind = self.behind, []
        for task in pending:
            if not ending:
                await task
                continue
            try:
                await task
            except (ActivityError, asyncio.CancelledError) as err:
                workflow.logger.warning("a ticket update made behind the run's work failed: %s", err)

    async def say_on_pr(self, key: str, body: str) -> None:
        """One comment on the run's PR, keyed (a retried step finds its own comment)."""
        publish = self.state.publish
        assert publish is not None and publish.pr_number is not None
        await self.step(
            steps.ENSURE_COMMENT,
            EnsureCommentInput(repository=self.input.repository, number=publish.pr_number, key=key, body=body),
        )

    # ---- the step runner --------------------------------------------------------------------------------

    async def model_step(self, step: Step[In, Out], arg: In, attempt: int | None = None) -> Out:
        """:meth:`step` for a step that asks the model: a transport failure that outlasted the step's retries
        is the endpoint's outage, never a verdict on the attempt. The same step is sent again after a durable
        wait (:func:`pipeline.accounting.outage_wait`), its failed tries counted as transport retries of the
        run and of ``attempt``; once the outage would outlast the policy's allowance the run ends saying the
        endpoint was unavailable, the attempt in flight the last one used."""
        policy = self.input.policy
        budgets = self.state.budgets
        began = self.now()
        waits = 0
        while True:
            try:
                return await self.step(step, arg)
            except ActivityError as err:
                if (
                    is_cancellation(err)
                    or not accounting.is_transport_failure(err)
                    or not self.patched(MODEL_OUTAGE_PATCH)
                ):
                    raise
                accounting.charge_failure(budgets, err, attempt)
                wait = accounting.outage_wait(policy, waits)
                down = (self.now() - began).total_seconds()
                if accounting.outage_spent(policy, down, wait):
                    raise RunEnded(
                        Outcome.NEEDS_HUMAN_TRIAGE,
                        f"the model endpoint was unavailable for {down:.0f} s ({failure_message(err)}), longer than "
                        f"the run's outage allowance of {policy.model_outage_allowance_s:g} s; "
                        f"{budgets.transport_retries} model request(s) failed on the transport and no repair "
                        f"attempt was spent on them ({budgets.repair_attempts_used} of {budgets.repair_attempts_max} "
                        "used): start the run again once the endpoint answers",
                    ) from err
                waits += 1
                budgets.outage_waits += 1
                budgets.outage_wait_s += wait
                await self.sleep(wait)

    async def step(self, step: Step[In, Out], arg: In, *, host: str = "") -> Out:
        """Run ``step`` with its declared queue, timeouts and output type (see :mod:`pipeline.steps`); on the
        queue of ``host`` instead when given, which must take it within ``RunPolicy.host_start_s``.

        A host-bound step has two tries per send (:func:`host_retries`), so that a host gone silent is given up
        on quickly. A send whose last try was lost with its worker process (:func:`pipeline.failures.worker_lost`:
        the host's supervisor failed it, so the host is alive and a fresh child polls there) is sent again, until
        the step's own ``max_attempts`` are spent: a worker killed twice on a live host is not a dead host. Sending
        again is as safe as Temporal's retry: every step is idempotent by the operation ID in its input."""
        if not host:
            return await self.send(step, arg, host="")
        tries = self.input.policy.timeouts(step.timeouts).max_attempts
        sent = 0
        while True:
            try:
                return await self.send(step, arg, host=host)
            except ActivityError as err:
                sent += HOST_TRIES
                again = not is_cancellation(err) and worker_lost(err) and not (tries and sent >= tries)
                # The patch is asked last, so its marker is recorded only where a run is really sent again.
                if not (again and self.patched(HOST_WORKER_LOST_PATCH)):
                    raise
                workflow.logger.warning("%s lost its worker on host %s; sending it to the host again", step.name, host)

    async def send(self, step: Step[In, Out], arg: In, *, host: str) -> Out:
        """One ``execute_activity`` of ``step`` (see :meth:`step`)."""
        timeouts = self.input.policy.timeouts(step.timeouts)
        to_start = self.input.policy.host_start_s if host else timeouts.schedule_to_start
        result: Out = await workflow.execute_activity(
            step.name,
            arg,
            task_queue=host_queue(host) if host else step.queue.value,
            result_type=step.output,
            schedule_to_start_timeout=timedelta(seconds=to_start),
            start_to_close_timeout=timedelta(seconds=timeouts.start_to_close),
            schedule_to_close_timeout=timedelta(seconds=timeouts.schedule_to_close),
            heartbeat_timeout=timedelta(seconds=timeouts.heartbeat) if timeouts.heartbeat else None,
            retry_policy=host_retries(timeouts.retry_policy()) if host else timeouts.retry_policy(),
            cancellation_type=(
                ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
                if self.cancellation_v2 and step.waits_for_cancellation
                else ActivityCancellationType.TRY_CANCEL
            ),
        )
        if self.cancel_requested():
            raise asyncio.CancelledError()
        return result


def new_run_state(inp: RepairInput, workflow_id: str, run_id: str) -> RunState:
    """The state a new run of ``inp`` starts with: its budgets from the run's policy."""
    return RunState(
        workflow_id=workflow_id,
        run_id=run_id,
        repository=inp.repository,
        issue_number=inp.issue_number,
        base_branch=inp.base_branch,
        budgets=Budgets(
            repair_attempts_max=inp.policy.max_repair_attempts,
            model_token_budget=inp.policy.model_token_budget,
            revisions_max=inp.policy.revisions_max,
        ),
    )


def is_cancellation(err: BaseException) -> bool:
    """An activity that ended because the workflow's cancellation reached it."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, CancelledError):
            return True
        cause = cause.__cause__
    return False


def host_retries(policy: RetryPolicy) -> RetryPolicy:
    """A step bound to a host is tried there twice at most per send: an attempt that stopped beating says the host
    is in trouble, and the run does better provisioning elsewhere than waiting out every attempt on it."""
    attempts = policy.maximum_attempts
    return dataclasses.replace(policy, maximum_attempts=HOST_TRIES if attempts == 0 else min(attempts, HOST_TRIES))


def host_unreachable(err: ActivityError) -> bool:
    """A step bound to a host ended timed out: it waited on the host's queue longer than allowed (no worker of
    the host polls), or its last attempt stopped beating (the host died or was cut off with the attempt, or its
    poll was still open on the server when the link went down and the retry went to it)."""
    cause = err.cause
    return isinstance(cause, ActivityTimeout) and cause.type in (TimeoutType.SCHEDULE_TO_START, TimeoutType.HEARTBEAT)


def detail_ref(err: BaseException, key: str) -> ArtifactRef | None:
    """The artifact an activity's failure names in its details under ``key`` (``None`` when it names none)."""
    for detail in failure_details(err):
        if isinstance(detail, dict) and isinstance(detail.get(key), dict):
            return ArtifactRef.model_validate(detail[key])
    return None
