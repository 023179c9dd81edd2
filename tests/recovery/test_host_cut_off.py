"""A worker host cut off the network in the middle of a run (its processes left running), on five hosts of one
machine (network namespaces, see ``tests/support/cluster.py``).

The run's environment lives on the host that provisioned it (its app answers on that host's loopback), so its
reproduction runs there too (pipeline/hosts.py). Cut off during that reproduction, the host stops beating; the
attempt times out, the step bound to it finds no taker on its host queue, and the run provisions the environment
anew on the peer host and reproduces there. The cut-off host comes back while the run waits for review: its late
completion is refused (the attempt it finished was timed out), and at the end the run cleans up on both hosts.
The forge ends with one ticket, branch, PR and evidence comment, and every artifact the run references is in the
shared S3 store: none stranded on the host that was cut off.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.client import Client

from infra import processes
from infra.netns import netns_processes, unavailable_reason
from pipeline import steps
from pipeline.hosts import host_queue
from pipeline.services import Services
from pipeline.state import Outcome, Phase, RunState
from tests.conftest import require
from tests.e2e.test_pipeline import awaiting_review, finished, state_when
from tests.recovery.test_engine_restarts import pollers
from tests.support.cluster import Cluster, running_cluster
from tests.support.e2e_stack import one_of_each, owned_processes

pytestmark = [pytest.mark.slow]

ENV_HOSTS = ("w2", "w3")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = unavailable_reason()
    require(reason is None, reason or "")
    with running_cluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running


def reproducing_on(state: RunState, _: object) -> bool:
    env = state.environment
    return state.phase == Phase.REPRODUCE and env is not None and env.host in ENV_HOSTS


async def activity_runs(client: Client, workflow_id: str, name: str) -> list[tuple[str, str]]:
    """(task queue, how it ended) of each scheduling of activity ``name`` in the run's history."""
    scheduled: dict[int, str] = {}
    ended: list[tuple[str, str]] = []
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == name:
                scheduled[event.event_id] = attrs.task_queue.name
        ends = {
            EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: ("completed", "activity_task_completed_event_attributes"),
            EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: ("failed", "activity_task_failed_event_attributes"),
            EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: ("timed out", "activity_task_timed_out_event_attributes"),
        }
        if event.event_type in ends:
            how, field = ends[event.event_type]
            queue = scheduled.get(getattr(event, field).scheduled_event_id)
            if queue is not None:
                ended.append((queue, how))
    return ended


async def polling_again(client: Client, queue: str, since: datetime, timeout_s: float) -> float:
    """Seconds until a worker polls activity queue ``queue`` after ``since`` (the server's record of its pollers).

    A worker whose link was down reconnects on its own schedule (its gRPC channel's keep-alive notices the dead
    connection, then reconnects with backoff); until it polls, the steps bound to its host have no taker."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        seen = await pollers(client, queue, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
        if any(p.last_access_time.ToDatetime(tzinfo=UTC) > since for p in seen):
            return time.monotonic() - started
        await asyncio.sleep(1)
    raise AssertionError(f"no worker polled {queue} within {timeout_s:g} s of its host coming back")


@pytest.mark.timeout(1500)
async def test_a_worker_host_cut_off_mid_reproduction_moves_to_its_peer_and_is_refused_when_back(
    cluster: Cluster,
) -> None:
    stack = cluster.stack
    client, repository, issue, wf = await stack.open_run()

    state = await state_when(client, wf, reproducing_on)
    assert state.environment is not None
    cut, peer = state.environment.host, next(h for h in ENV_HOSTS if h != state.environment.host)
    cluster.net.cut(cut)
    cut_at = time.monotonic()
    assert cluster.workers[cut].pid in netns_processes(cluster.host(cut).netns)

    # Bounded by the heartbeat timeout (two attempts on the cut host) and the peer's provisioning; a loaded
    # machine stretches the provisioning, hence the margin.
    moved = await state_when(
        client,
        wf,
        lambda s, st: (s.environment is not None and s.environment.host == peer) or finished(s, st),
        timeout_s=600,
    )
    assert moved.outcome is None, moved.outcome_detail
    moved_after_s = time.monotonic() - cut_at
    review = await state_when(client, wf, awaiting_review)
    assert review.pending_approval is not None, review.outcome_detail
    # Back on the network while the run waits: whatever the host still had to say arrives late.
    restored_at = datetime.now(UTC)
    cluster.net.restore(cut)
    assert processes.is_alive(cluster.workers[cut]), "the cut-off host's worker did not outlive the cut"
    # Its share of the cleanup waits at most the host start timeout for it (twice): approve once it polls again,
    # as an operator would after bringing a host back, so that the run's end finds it.
    rejoined_after_s = await polling_again(client, host_queue(cut), restored_at, timeout_s=300)

    stack.approve_on_forge(repository, review.pending_approval.pr_number, review.pending_approval.head_sha)
    final = await state_when(client, wf, finished)
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    assert final.cleanup is not None and final.cleanup.complete, final.cleanup

    runs = await activity_runs(client, wf, steps.REPRODUCE.name)
    assert (host_queue(cut), "timed out") in runs or (host_queue(cut), "failed") in runs, runs
    assert (host_queue(peer), "completed") in runs, runs
    cleanups = await activity_runs(client, wf, steps.CLEANUP_RUN.name)
    assert {(host_queue(cut), "completed"), (host_queue(peer), "completed")} <= set(cleanups), cleanups

    one_of_each(stack, repository, wf, issue, final)
    assert final.publish is not None
    pulls = list(stack.github().get_repo(repository).get_pulls(state="all"))
    assert [(p.number, p.merged) for p in pulls] == [(final.publish.pr_number, True)]

    store = Services(cluster.base).store
    stranded = [ref.key for ref in final.evidence if not store.exists(ref)]
    assert final.evidence and not stranded, stranded
    assert owned_processes(wf) == []
    for name in ENV_HOSTS:
        workspaces = Path(cluster.root / name / "workspaces")
        assert not any(p.name.startswith(wf.replace("/", "-")) for p in workspaces.glob("*")), name
    print(
        f"reproduction moved from {cut} to {peer} {moved_after_s:.1f} s after the cut; "
        f"{cut} polled again {rejoined_after_s:.1f} s after it came back"
    )
