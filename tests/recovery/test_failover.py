"""A SIGKILLed worker process is failed over at once: its attempts are retried as ``WorkerLost``, not timed out.

Real processes: the Temporal dev server, the GitHub emulator over HTTP, and a supervised ``durafix worker``
(``workers/faulty.py failover-probe``: the real CLI, supervisor and activities, plus a heartbeating
``probe.hold``). The probe workflow runs with the *default* run policy's timeouts (a 90 s heartbeat for the
held attempt, 60 s for the forge step), so an attempt that was waited out instead of failed over would show
a timeout as its predecessor's failure. The child killed is the one whose in-flight directory holds the
attempt: the process running it.

External truth checked: the workflow history (each killed attempt's successor started, its predecessor's
failure ``WorkerLost``), the forge (exactly one ticket comment), the processes (the supervisor alive with a
fresh polling child, the killed one gone) and the disk (no in-flight record left behind).
"""

from __future__ import annotations

import base64
import socket
import time
import uuid
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import PollActivityTaskQueueRequest, PollActivityTaskQueueResponse
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from infra.forge.testing import client as forge_client
from infra.forge.testing import running_forge
from infra.processes import free_port
from pipeline.activities.heartbeat import Heartbeat, heartbeating
from pipeline.failures import WORKER_LOST
from pipeline.policies import RunPolicy
from pipeline.steps import ENSURE_TICKET, EnsureTicketInput
from pipeline.steps import TaskQueue as queues
from pipeline.worker.dead_polls import fail_retries_started_by_the_dead
from pipeline.worker.inflight import Attempt, InflightDir, dead_dirs, fail_attempt, inflight_root
from tests.support.failover import (
    PROBE,
    PROBE_QUEUE,
    Held,
    Hold,
    ProbeInput,
    ProbeWorkflow,
    attempt_starts,
    configure,
    kill_child,
    seconds_after,
    supervised_worker,
)
from tests.support.metrics_text import scrape


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_killed_child_during_a_heartbeat_and_a_forge_step_is_failed_over_and_the_run_completes(
    tmp_path: Path, temporal_client: Client
) -> None:
    client = temporal_client
    with running_forge(tmp_path / "forge") as forge:
        bot = forge.create_user("durafix-bot")
        repository = forge.create_repo(bot, "shop")["full_name"]
        issue = forge._call("POST", f"/repos/{repository}/issues", bot, {"title": "cart total", "body": "wrong"})
        state = tmp_path / "state"
        config = configure(state, client, forge_api_url=forge.api_url, forge_git_base=forge.base_url, forge_token=bot)
        config.metrics_port = free_port()
        config.save()
        metrics_url = f"http://127.0.0.1:{config.metrics_port}/metrics"
        # The ticket's first read of its issue's comments hangs long enough to be killed in.
        forge.set_faults(
            {
                "method": "GET",
                "path_regex": rf"/repos/{repository}/issues/{issue['number']}/comments",
                "action": "delay",
                "seconds": 60,
                "count": 1,
            }
        )
        wf = f"failover-{uuid.uuid4().hex[:8]}"
        ticket = EnsureTicketInput(
            op_id=f"{wf}:ticket", repository=repository, issue_number=issue["number"], title="t", body="working on it"
        )
        async with supervised_worker(state) as worker:
            async with Worker(client, task_queue=PROBE_QUEUE, workflows=[ProbeWorkflow]):
                handle = await client.start_workflow(
                    ProbeWorkflow.run,
                    ProbeInput(holds=[Hold(first_s=600, later_s=0.5)], ticket=ticket, ticket_on_signal=True),
                    id=wf,
                    task_queue=PROBE_QUEUE,
                )
                held_in, _ = await worker.wait_inflight(client, PROBE, wf, 120)
                first_kill = kill_child(held_in)
                # The held attempt's successor runs in the promoted spare; the ticket comes next, and hangs.
                await worker.wait_log("ready (spare)", 2, 300)
                # The supervisor's /metrics now serves the promoted child's: the port outlived the dead one.
                promoted = scrape(metrics_url)
                assert promoted.total("durafix_worker_process_deaths_total") == 1
                assert promoted.total("durafix_worker_polling") == 1
                assert promoted.values("temporal_num_pollers", task_queue="durafix-forge")
                await handle.signal(ProbeWorkflow.proceed)
                ticket_in, _ = await worker.wait_inflight(client, ENSURE_TICKET.name, wf, 120)
                assert ticket_in.pid != held_in.pid
                second_kill = kill_child(ticket_in)
                result = await handle.result()

            starts = {s.activity_type: s for s in await attempt_starts(client, wf)}
            # The third child ran the ticket's second attempt: counted there, once; two children died.
            after = scrape(metrics_url)
            assert after.total("durafix_worker_process_deaths_total") == 2
            assert after.values("durafix_step_duration_seconds_count", step=ENSURE_TICKET.name, result="ok") == [1.0]
            assert after.total("durafix_runs_started_total") == 1
            log = worker.log_text()
            assert worker.proc.poll() is None, log[-3000:]
            leftover = list(dead_dirs(state))

        # The killed attempts were failed as WorkerLost and their successors started well inside the heartbeat
        # timeout (the default policy's 90 s, the forge's 60 s): they were failed over, not waited out.
        policy = RunPolicy()
        held, tick = starts[PROBE], starts[ENSURE_TICKET.name]
        assert (held.attempt, held.last_failure_type) == (2, WORKER_LOST), held
        assert (tick.attempt, tick.last_failure_type) == (2, WORKER_LOST), tick
        assert policy.browser.heartbeat is not None and policy.forge.heartbeat is not None
        assert seconds_after(held, first_kill) < policy.browser.heartbeat / 3, (held, first_kill)
        assert seconds_after(tick, second_kill) < policy.forge.heartbeat / 3, (tick, second_kill)
        assert f"worker process {held_in.pid} died (killed by SIGKILL)" in log
        assert f"failed {PROBE} attempt 1 of {wf}" in log
        assert f"failed {ENSURE_TICKET.name} attempt 1 of {wf}" in log

        # The run completed, its held step retried in the promoted spare (the process killed second), and the
        # forge holds one ticket.
        assert [h.attempt for h in result.held] == [2]
        assert result.held[0].pid == ticket_in.pid != held_in.pid
        assert result.ticket is not None and result.ticket.comment_id is not None
        gh = forge_client(forge.api_url, bot)
        comments = list(gh.get_repo(repository).get_issue(issue["number"]).get_comments())
        assert [c.id for c in comments if "durafix:ticket" in c.body] == [result.ticket.comment_id]
        assert not held_in.owner_running() and not ticket_in.owner_running()
        # Nothing a dead process recorded is left behind.
        assert leftover == []


def attempt(token: bytes, started_at: float, activity_type: str = "forge.ensure_ticket") -> Attempt:
    return Attempt(
        task_token=base64.b64encode(token).decode(),
        activity_type=activity_type,
        activity_id="1",
        attempt=1,
        workflow_id="wf",
        workflow_run_id="run",
        started_at=started_at,
    )


def test_records_are_written_whole_and_removed_by_token(tmp_path: Path) -> None:
    here = InflightDir.for_process(tmp_path)
    assert here.pid > 0 and here.owner_running()
    first = here.record(attempt(b"\x00token-1", 2.0))
    here.record(attempt(b"\x01token-2", 1.0, "probe.hold"))
    assert first.parent == here.path and not list(here.path.glob("*.tmp"))
    assert [a.activity_type for _, a in here.attempts()] == ["probe.hold", "forge.ensure_ticket"]  # oldest first
    assert here.attempts()[1][1].token() == b"\x00token-1"
    here.remove(b"\x01token-2")
    here.remove(b"\x01token-2")  # removing twice is a no-op
    assert [a.token() for _, a in here.attempts()] == [b"\x00token-1"]


def test_only_directories_of_processes_not_running_are_dead(tmp_path: Path) -> None:
    mine = InflightDir.for_process(tmp_path)
    mine.record(attempt(b"live", 1.0))
    # The same pid with another start time is another (gone) process: a recycled pid is never taken for it.
    recycled = InflightDir(inflight_root(tmp_path) / f"{mine.pid}-{mine.start_time + 1}")
    recycled.record(attempt(b"recycled", 1.0))
    gone = InflightDir(inflight_root(tmp_path) / "999999999-1")
    gone.record(attempt(b"gone", 1.0))
    (inflight_root(tmp_path) / "not-a-record-dir").mkdir()
    assert sorted(d.path.name for d in dead_dirs(tmp_path)) == sorted([recycled.path.name, gone.path.name])
    gone.discard()
    assert not gone.path.exists()
    assert [d.path.name for d in dead_dirs(tmp_path)] == [recycled.path.name]


def test_a_torn_record_is_skipped(tmp_path: Path) -> None:
    here = InflightDir.for_process(tmp_path)
    here.record(attempt(b"whole", 1.0))
    (here.path / "torn.json").write_text('{"task_token": "')
    assert [a.token() for _, a in here.attempts()] == [b"whole"]


def test_a_wrapped_activity_beats_under_its_name_and_an_inner_heartbeat_takes_over_while_it_lasts() -> None:
    @activity.defn(name="forge.sample")
    def sample(inp: EnsureTicketInput) -> str:
        with Heartbeat("pushing", every_s=0.05, carry={"spent": 1}):
            time.sleep(0.3)
        time.sleep(0.3)
        return inp.op_id

    wrapped = heartbeating(sample, every_s=0.05)
    beats: list[object] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details[0])
    inp = EnsureTicketInput(op_id="op", repository="o/r", issue_number=1, title="t", body="b")
    assert env.run(wrapped, inp) == "op"
    kinds = ["inner" if isinstance(b, dict) else str(b).split(" (")[0] for b in beats]
    # The inner one (with its carry, so at once: the outer, without one, beats only once it has lasted its period)
    # and only it while it lasts, then the outer again.
    assert kinds[0] == "inner" and kinds[-1] == "forge.sample"
    first_inner, last_inner = kinds.index("inner"), len(kinds) - 1 - kinds[::-1].index("inner")
    assert set(kinds[first_inner : last_inner + 1]) == {"inner"}
    assert all(b == {"detail": b["detail"], "spent": 1} for b in beats if isinstance(b, dict))


@activity.defn(name=PROBE)
async def probe_hold_at_once(hold: Hold) -> Held:
    info = activity.info()
    return Held(pid=0, attempt=info.attempt)


async def poll_as(client: Client, identity: str) -> PollActivityTaskQueueResponse:
    """One activity task of the model queue, taken by a poll under ``identity`` that never answers it."""
    request = PollActivityTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=queues.MODEL.value), identity=identity
    )
    while True:
        task = await client.workflow_service.poll_activity_task_queue(request)
        if task.task_token:
            return task


@pytest.mark.timeout(300)
async def test_a_retry_handed_to_a_dead_childs_poll_is_failed_again_not_left_to_its_heartbeat(
    temporal_client: Client,
) -> None:
    """The server can hand the retry of an attempt the supervisor just failed to a long poll the killed child
    left open; a poll under the dead child's identity that never answers stands in for it. The retry is
    failed again as ``WorkerLost`` and the next attempt runs on a live worker, long before the step's 90 s
    heartbeat timeout."""
    client = temporal_client
    dead_pid = 999_999
    dead = f"4242@{socket.gethostname()}/child-{dead_pid}"
    wf = f"dead-poll-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=PROBE_QUEUE, workflows=[ProbeWorkflow]):
        handle = await client.start_workflow(
            ProbeWorkflow.run, ProbeInput(holds=[Hold(first_s=0)]), id=wf, task_queue=PROBE_QUEUE
        )
        first = await poll_as(client, dead)
        attempt = Attempt(
            task_token=base64.b64encode(first.task_token).decode(),
            activity_type=first.activity_type.name,
            activity_id=first.activity_id,
            attempt=first.attempt,
            workflow_id=first.workflow_execution.workflow_id,
            workflow_run_id=first.workflow_execution.run_id,
            started_at=time.time(),
        )
        assert await fail_attempt(client, attempt, f"worker process {dead_pid} died")
        retry = await poll_as(client, dead)  # the zombie poll takes the retry
        assert retry.attempt == 2
        again = await fail_retries_started_by_the_dead(client, [attempt], dead_pid, "killed")
        assert again == [(wf, PROBE, 2)]
        async with Worker(client, task_queue=queues.MODEL.value, activities=[probe_hold_at_once]):
            out = await handle.result()
    assert [h.attempt for h in out.held] == [3]
    # Attempt 2 ended failed over, not timed out (its heartbeat timeout would read ``Timeout:4``).
    (start,) = [s for s in await attempt_starts(client, wf) if s.activity_type == PROBE]
    assert (start.attempt, start.last_failure_type) == (3, WORKER_LOST)


async def test_a_retry_a_live_worker_took_is_left_alone(temporal_client: Client) -> None:
    client = temporal_client
    wf = f"live-poll-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=PROBE_QUEUE, workflows=[ProbeWorkflow]):
        handle = await client.start_workflow(
            ProbeWorkflow.run, ProbeInput(holds=[Hold(first_s=0)]), id=wf, task_queue=PROBE_QUEUE
        )
        first = await poll_as(client, f"4242@{socket.gethostname()}/child-999998")
        attempt = Attempt(
            task_token=base64.b64encode(first.task_token).decode(),
            activity_type=first.activity_type.name,
            activity_id=first.activity_id,
            attempt=first.attempt,
            workflow_id=wf,
            workflow_run_id=first.workflow_execution.run_id,
            started_at=time.time(),
        )
        assert await fail_attempt(client, attempt, "worker process 999998 died")
        live = await poll_as(client, f"4242@{socket.gethostname()}/child-1234")
        assert await fail_retries_started_by_the_dead(client, [attempt], 999_998, "killed") == []
        await client.get_async_activity_handle(task_token=live.task_token).complete(Held(pid=1234, attempt=2))
        out = await handle.result()
    assert [h.attempt for h in out.held] == [2]
