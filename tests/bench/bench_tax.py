"""Benchmark: the durability tax, the demo's run driven by a plain loop vs through Temporal.

Run: ``uv run python -m tests.bench.bench_tax [--rounds R] [--quick]`` (default R=3; ``--quick`` is one
round). On the embedded e2e stack (:func:`tests.support.e2e_stack.running_e2e_stack`: the GitHub emulator, the
scripted model server, the evidence server, a real Temporal dev server), each round repairs the sample app's
report (``examples/cart``) twice, each time on a fresh repository seeded with the sample, to the merge:

- *plain*: :class:`PlainRun` runs ``repair_bug``'s own phase code (:class:`pipeline.flow.phases.Phases`, the
  classes under :mod:`pipeline.flow`) on a run context of its own, :class:`PlainContext`: each step calls the
  real activity implementation (the production worker's, from :func:`pipeline.worker.runner.activities_for`
  over one :class:`~pipeline.services.Services`) in this process, under
  :class:`temporalio.testing.ActivityEnvironment` (the adapters read ``activity.info()`` and heartbeat); the
  clock is the wall clock, every patch is taken (as by a run started now) and the review wait is answered at
  once by the operator's approval. There is no server, no serialization, no task queue and no history;
- *temporal*: the same report through ``repair_bug`` (:func:`pipeline.client.start_run`) with the
  production workers (:func:`pipeline.worker.runner.build_workers`) in this process, approved as an operator
  (:func:`pipeline.client.approve`) as soon as it asks for a review, awaited to ``merged``. The approver
  follows the run's history as the server appends to it (a long poll) rather than querying its state over and
  over: a query is answered by the worker, so polling cost the run it measured worker time every 0.1 s.

The two take turns (which goes first alternates by round) after one unmeasured warm-up of each (the mirror
and dependency caches, the browser, imports). What differs is what Temporal adds: scheduling each step,
serializing its input and output, the workflow tasks, the history. The figures are medians over rounds,
and the ratio is temporal / plain (also the median of each round's own ratio, which a load that changes
between rounds moves less).

Then where the time goes (:mod:`tests.bench.tax_breakdown`): each Temporal run's wall time read from its
histories (the parent's, its repair attempts' child workflows', any execution its review wait continued as
new) and cut into disjoint parts that add up to it: the activities' implementations (timed in the worker by
an interceptor, :class:`~tests.bench.tax_breakdown.BodyClock`), their handover between the server and the
implementation, their wait for a worker, the wait for the operator's approval, child workflows' start and
close, continue-as-new, and the workflow tasks (on the queue, in the worker); beside the plain loop's steps
(timed by :meth:`PlainContext.send`) and the time between them. Then each step's implementation, matched by
name and occurrence, through Temporal against the plain loop: the steps it lengthens most.

Then Temporal's own floor under the run (:mod:`tests.bench.tax_floor`), measured in each round on the same
server: the plain run's critical path (its steps, those that ran side by side merged) replayed through a workflow
whose activities only wait as long as each step took, with empty payloads and no durafix code. What it adds to
the waits is the least tax any workflow of one activity a step pays here; the run's tax beyond it is durafix's
own.

The plain loop is meant for the happy path (what the demo's run does): a step that fails raises its error as
the activity raised it (no retries), and a run that ends otherwise than merged is reported as not merged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment

from infra.processes import ServiceError
from pipeline import client as runs
from pipeline.config import DurafixConfig
from pipeline.flow.context import In, Out, RunContext, RunEnded, new_run_state
from pipeline.flow.phases import Phases
from pipeline.hosts import host_id
from pipeline.ids import workflow_id_for
from pipeline.patches import ATTEMPT_CHILD_PATCH
from pipeline.services import Services
from pipeline.state import Approval, ApprovalRequest, Outcome, RunState
from pipeline.steps import Step
from pipeline.worker.queue_settings import ALL_QUEUES
from pipeline.worker.runner import activities_for, build_workers
from tests.bench.report import counted, print_rows
from tests.bench.tax_breakdown import (
    BodyClock,
    Breakdown,
    StepTime,
    asked_for_review,
    breakdown,
    breakdown_lines,
    plain_breakdown,
)
from tests.bench.tax_floor import floor_seconds, floor_workers, waves
from tests.support.e2e_stack import E2EStack, combined_model_script, running_e2e_stack
from tests.support.run_history import run_histories
from tests.support.temporal_workers import running

DEFAULT_ROUNDS = 3
REVIEWER = "bench-operator"


class PlainRunFailed(RuntimeError):
    """The plain loop could not follow the run (a review wait with nothing to approve)."""


def registry(services: Services, host: str) -> dict[str, Callable[..., Any]]:
    """Every activity the production worker registers, by its step name; as the worker serving every queue,
    its environments are stamped with ``host`` (the run then sends their steps to the host's queue)."""
    out: dict[str, Callable[..., Any]] = {}
    for queue in ALL_QUEUES:
        for fn in activities_for(queue, services, host):
            defn = activity._Definition.must_from_callable(fn)
            assert defn.name is not None
            out[defn.name] = fn
    return out


def operator_approval(pending: ApprovalRequest) -> Approval:
    """The operator's approval of what a run asks to have reviewed."""
    return Approval(reviewer=REVIEWER, head_sha=pending.head_sha, evidence_digest=pending.evidence_digest)


@dataclass
class PlainContext(RunContext):
    """A run context with no Temporal behind it: a step is its activity's implementation called in this
    process (off the event loop: some adapters drive loops of their own and block on them), the clock is the
    wall clock, every patch but the child attempts' is taken, no timer is durable, and the review wait is
    answered by ``operator``. ``calls`` is the step names in the order called (the smoke test compares them
    with a workflow history)."""

    activities: dict[str, Callable[..., Any]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    # Each call as timed around it (the monotonic clock), in the order called.
    timed: list[StepTime] = field(default_factory=list)
    # Called when the review wait would wait: decides what the run waits for (the driver approves).
    operator: Callable[[], None] = lambda: None

    def now(self) -> datetime:
        return datetime.now(UTC)

    def patched(self, patch_id: str) -> bool:
        # A plain loop has no child workflows: its attempts run their steps here, as the child would.
        return patch_id != ATTEMPT_CHILD_PATCH

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait_for(self, condition: Callable[[], bool], timeout: timedelta) -> bool:
        if not condition():
            self.operator()
        if not condition():
            raise PlainRunFailed(f"the review wait of {self.wf} had nothing to wait for")
        return True

    def history_beyond(self, events: int, size: int) -> bool:
        return False

    def record_state(self) -> None:
        """No memo: there is no server to keep one."""

    def cancel_requested(self) -> bool:
        return False

    async def send(self, step: Step[In, Out], arg: In, *, host: str) -> Out:
        env = ActivityEnvironment()
        env.info = dataclasses.replace(
            env.info,
            activity_type=step.name,
            activity_id=str(len(self.calls) + 1),
            task_queue=step.queue.value,
            workflow_id=self.wf,
            workflow_run_id=self.state.run_id,
            workflow_type="repair_bug",
        )
        self.calls.append(step.name)
        started = time.monotonic()
        result: Out = await asyncio.to_thread(env.run, self.activities[step.name], arg)
        self.timed.append(StepTime(step.name, (started, time.monotonic())))
        return result


class PlainRun:
    """One run of ``repair_bug``'s phases (:class:`~pipeline.flow.phases.Phases`) as a plain loop on a
    :class:`PlainContext`: in the order ``run`` takes them, to the ending and the run's record. Not durable and
    not idempotent beyond what each activity is by itself: it exists to be timed."""

    def __init__(
        self, config: DurafixConfig, activities: dict[str, Callable[..., Any]], repository: str, issue: int
    ) -> None:
        inp = runs.repair_input(config, repository, issue, trigger="bench")
        state = new_run_state(inp, workflow_id_for(repository, issue), "plain")
        self.ctx = PlainContext(input=inp, state=state, activities=activities, operator=self.approve)
        self.phases = Phases(self.ctx)

    @property
    def calls(self) -> list[str]:
        return self.ctx.calls

    def approve(self) -> None:
        """As an operator, approve the head under review (as ``repair_bug``'s ``approve`` Update takes it)."""
        pending = self.ctx.state.pending_approval
        if pending is None:
            raise PlainRunFailed(f"{self.ctx.wf} waits for review but asks for none")
        approval = operator_approval(pending)
        decide = self.phases.decide
        refusal = decide.approval_refusal(approval, early=False)
        if refusal is not None:
            raise PlainRunFailed(f"the approval was refused: {refusal}")
        decide.take_approval(approval, early=False)

    async def run(self) -> RunState:
        ctx = self.ctx
        ctx.state.budgets.deadline = ctx.now() + timedelta(seconds=ctx.input.policy.run_deadline_s)
        try:
            await self.phases.to_review()
            outcome, detail = await self.phases.review.run()
        except RunEnded as ended:
            outcome, detail = ended.outcome, ended.detail
        ctx.ending = True
        await self.phases.ending.finish(outcome, detail)
        await self.phases.ending.store_record()
        return ctx.state


# ---- the two ways, timed ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timed:
    """One run: where its wall time went (:class:`~tests.bench.tax_breakdown.Breakdown`: its steps in order
    among it), and whether it merged."""

    breakdown: Breakdown
    merged: bool

    @property
    def seconds(self) -> float:
        return self.breakdown.wall

    @property
    def steps(self) -> list[str]:
        return self.breakdown.step_names


class Tax:
    """Both ways on one stack; one :class:`Services` for the plain loop, kept across its runs as the worker
    keeps its own (its browser, its forge clients)."""

    def __init__(self, stack: E2EStack) -> None:
        self.stack = stack
        self.config = stack.config
        self.services = Services(self.config)
        self.activities = registry(self.services, host_id(self.config.host_id))
        # When the workers enter and leave each activity's implementation (the only interceptor they run).
        self.clock = BodyClock()

    def report(self, *, labelled: bool) -> tuple[str, int]:
        repository = self.stack.new_repository()
        return repository, self.stack.open_report(repository, labelled=labelled)

    @asynccontextmanager
    async def workers(self, client: Client, config: DurafixConfig) -> AsyncIterator[None]:
        """The production workers (every queue) in this process for the whole benchmark: like the plain loop's
        one :class:`Services`, their collaborators (the browser, the forge clients) outlive each run. They
        poll idle while the plain loop runs. At the end both ways' browsers are closed: nothing the benchmark
        launched outlives it."""
        served = Services(config)
        with concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="durafix-activity") as pool:
            built = build_workers(client, config, ALL_QUEUES, pool, services=served, interceptors=[self.clock])
            try:
                async with running(built, best_effort_shutdown=True):
                    yield
            finally:
                for services in (served, self.services):
                    if "browser" in services.__dict__:  # launched (a cached property): close it
                        await asyncio.to_thread(services.browser.close)

    async def plain(self) -> Timed:
        # Unlabelled, so that neither the receiver nor its reconciler starts a run for the report.
        repository, issue = self.report(labelled=False)
        run = PlainRun(self.config, self.activities, repository, issue)
        started = time.monotonic()
        state = await run.run()
        ended = time.monotonic()
        return Timed(plain_breakdown((started, ended), run.ctx.timed), state.merged_sha is not None)

    async def temporal(self, client: Client) -> Timed:
        """The run the labelled report's webhook starts, as in the demo (the reconciler would cancel a run whose
        report lost its label, and start one for a labelled report without a run), on the workers of
        :meth:`workers`. Timed by the server, from the first execution's start to the last one's close (its
        history: :func:`~tests.support.run_history.run_histories`): the webhook's own latency is
        ``bench_webhook_pr``'s to measure."""
        repository, issue = self.report(labelled=True)
        workflow_id = workflow_id_for(repository, issue)
        await asyncio.wait_for(approve_when_asked(client, workflow_id), timeout=APPROVAL_TIMEOUT_S)
        final = await client.get_workflow_handle(workflow_id, result_type=RunState).result()
        return Timed(
            breakdown(await run_histories(client, workflow_id), self.clock.bodies), final.outcome == Outcome.MERGED
        )


APPROVAL_TIMEOUT_S = 600


async def approve_when_asked(client: Client, workflow_id: str) -> None:
    """As an operator, approve the head under review as soon as the run asks for a review: follow the run's
    history as the server appends to it (a long poll: no query, no work for the worker while the run goes on)
    until an event records that it awaits review (its memo's phase, :mod:`pipeline.recorded_state`), then read
    what it asks to have reviewed (the ``state`` query) and approve exactly that (the ``approve`` Update)."""
    handle = client.get_workflow_handle(workflow_id)
    while True:
        last: HistoryEvent | None = None
        try:
            async for event in handle.fetch_history_events(wait_new_event=True):
                last = event
                if asked_for_review(event):
                    pending = (await runs.get_state(client, workflow_id)).pending_approval
                    if pending is None:
                        raise PlainRunFailed(f"{workflow_id} awaits review but asks for none")
                    ack = await runs.approve(client, workflow_id, operator_approval(pending))
                    assert ack.accepted, ack.detail
                    return
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            await asyncio.sleep(0.05)  # the webhook has not started the run yet
            continue
        if last is not None and last.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            state = await runs.get_state(client, workflow_id)
            raise PlainRunFailed(f"{workflow_id} ended {state.outcome} without asking for a review")


@dataclass(frozen=True)
class Round:
    plain: Timed
    temporal: Timed
    # Temporal's floor under the plain run's critical path (:mod:`tests.bench.tax_floor`), measured in the round.
    floor: float


STACK_STARTS = 3


@contextmanager
def e2e_stack(
    root: Path,
    *,
    model_script: Callable[[Path], Path] = combined_model_script,
    configure: Callable[[DurafixConfig], None] | None = None,
) -> Iterator[E2EStack]:
    """:func:`~tests.support.e2e_stack.running_e2e_stack` with a model script (``model_script(dest)`` writes it;
    default the e2e tests'), in ``root``, its saved config changed by ``configure``; started again (in a fresh
    state directory, everything of the failed start stopped) when one of its services is not ready in time: on a
    loaded host the receiver's start can outlast the 30 s it is given."""
    for attempt in range(1, STACK_STARTS + 1):
        state = root / f"state-{attempt}"
        state.mkdir()
        with ExitStack() as started:
            try:
                stack = started.enter_context(
                    running_e2e_stack(state, model_script=model_script(root / "model-script.yaml"), configure=configure)
                )
            except ServiceError as err:
                if attempt == STACK_STARTS:
                    raise
                print(f"the stack did not start ({err}); starting it again", file=sys.stderr, flush=True)
                continue
            yield stack
            return


def bench(rounds: int, *, warm: bool = True) -> list[Round]:
    """``rounds`` rounds (see the module) on one fresh e2e stack, after a warm-up of each way. Synchronous: the
    stack starts and stops outside any event loop (it runs its own)."""
    with tempfile.TemporaryDirectory(prefix="durafix-bench-tax-") as tmp, e2e_stack(Path(tmp)) as stack:
        return asyncio.run(on_stack(stack, rounds, warm=warm))


async def on_stack(stack: E2EStack, rounds: int, *, warm: bool) -> list[Round]:
    tax = Tax(stack)
    client = await runs.connect(stack.config)
    async with tax.workers(client, stack.config), floor_workers(client):
        return await rounds_of(tax, client, rounds, warm=warm)


async def rounds_of(tax: Tax, client: Client, rounds: int, *, warm: bool) -> list[Round]:
    if warm:
        print("warming up: one run each way (not measured)", file=sys.stderr, flush=True)
        await tax.plain()
        await tax.temporal(client)
        await floor_seconds(client, [0.0])
    out: list[Round] = []
    for i in range(rounds):
        if i % 2 == 0:
            plain = await tax.plain()
            temporal = await tax.temporal(client)
        else:
            temporal = await tax.temporal(client)
            plain = await tax.plain()
        floor = await floor_seconds(client, waves([s.span for s in plain.breakdown.steps]))
        print(
            f"  round {i + 1}: plain {plain.seconds:.1f}s, temporal {temporal.seconds:.1f}s, floor {floor:.2f}s",
            file=sys.stderr,
            flush=True,
        )
        out.append(Round(plain, temporal, floor))
    return out


def report(results: list[Round], command: str) -> None:
    def med(values: Iterable[float]) -> float:
        return statistics.median(list(values))

    plain = med(r.plain.seconds for r in results)
    temporal = med(r.temporal.seconds for r in results)
    n_steps = len(results[0].temporal.steps)
    # The same steps; those started side by side may be called in either order.
    same = all(sorted(r.plain.steps) == sorted(r.temporal.steps) for r in results)
    print(f"$ {command}")
    print(
        f"the sample app's report (examples/cart) repaired to the merge on the embedded stack; "
        f"medians of {len(results)} round(s)"
    )
    rows: list[tuple[str, str]] = [
        ("steps per run (activities)", f"{n_steps}" + ("" if same else " (the plain loop's differ!)")),
        ("plain loop (ActivityEnvironment, one process)", f"{plain:.2f} s"),
        ("through Temporal (repair_bug, in-process worker)", f"{temporal:.2f} s"),
        ("  temporal / plain", f"{temporal / plain:.3f}x"),
        ("  the rounds' own ratios, median", f"{med(r.temporal.seconds / r.plain.seconds for r in results):.3f}x"),
        ("  tax per run", f"{temporal - plain:+.2f} s"),
        ("  tax per step", f"{(temporal - plain) / n_steps * 1000:+.0f} ms"),
        (
            "runs merged (plain / temporal)",
            f"{sum(r.plain.merged for r in results)} / {sum(r.temporal.merged for r in results)}",
        ),
    ]
    print_rows(rows + floor_rows(results, plain, temporal))
    for line in breakdown_lines([(r.plain.breakdown, r.temporal.breakdown) for r in results]):
        print(line)


def floor_rows(results: list[Round], plain: float, temporal: float) -> list[tuple[str, str]]:
    """Temporal's own floor under the run (:mod:`tests.bench.tax_floor`): the least tax one activity a step
    costs on this server, the best ratio it leaves reachable, and the tax beyond it (durafix's own)."""
    path = [waves([s.span for s in r.plain.breakdown.steps]) for r in results]
    n_waves = statistics.median(len(p) for p in path)
    least = statistics.median(r.floor - sum(p) for r, p in zip(results, path, strict=True))
    return [
        ("the plain run's critical path (steps side by side merged)", f"{n_waves:.0f} steps"),
        (
            "Temporal's floor: that path as waiting no-op activities",
            f"{statistics.median(r.floor for r in results):.2f} s",
        ),
        ("  the least tax of one activity a step", f"{least:+.2f} s ({least / n_waves * 1000:.1f} ms a step)"),
        ("  the best ratio one activity a step leaves", f"{(plain + least) / plain:.3f}x"),
        ("  the tax beyond the floor (durafix's own)", f"{temporal - plain - least:+.2f} s"),
    ]


def main() -> None:
    rounds = counted(__doc__, "--rounds", DEFAULT_ROUNDS, "rounds")
    report(bench(rounds), f"python -m tests.bench.bench_tax --rounds {rounds}")


if __name__ == "__main__":
    main()
