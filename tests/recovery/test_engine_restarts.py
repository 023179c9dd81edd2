"""Recovery from the engine's own failures: the Temporal dev server killed and restarted on its SQLite file,
every process of the stack restarted while a run waits for its review (with the workflow cache off), and a
compatible change of the workflow deployed while a run waits.

The stack is the end-to-end one (real Temporal dev server, the GitHub emulator over HTTP with webhooks, the
scripted model, Chromium, the sample app), started for this module alone since its tests kill the server.
The server is restarted as it was started: the argv of the recorded process (same port, same database file),
once the old process is gone (SQLite allows one server per file). What is asserted is read back from the
forge (one ticket, one branch, one PR, one evidence comment, the merge), the engine (the run's result and
history, the pollers of the queues) and the machine (no process or workspace of the run left).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, PendingActivityState, TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import PollerInfo
from temporalio.api.taskqueue.v1 import TaskQueue as TaskQueueRef
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest, GetSystemInfoRequest
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from infra import processes, stack
from infra.processes import ServiceRecord
from pipeline import steps
from pipeline.steps import TaskQueue
from pipeline.workflow import RepairBugWorkflow
from tests.e2e.test_pipeline import awaiting_review, finished, state_when
from tests.replay.changed_workflow import MERGE_NOTICE_PATCH, NOTICE_TEXT, ChangedRepairBug
from tests.replay.record import record_history, record_history_to
from tests.support.e2e_stack import E2EStack, assert_merged_once, scripted_stack, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHANGED_CODE_HISTORIES = Path(__file__).resolve().parents[1] / "replay" / "changed-code"
# How long the engine stays down after a kill: long enough that every poller, heartbeat and completion of the
# workers fails at least once and has to be retried on a fresh connection.
OUTAGE_S = 3.0
# How long a (re)started receiver may take to listen: its imports alone take long on a busy machine.
READY_S = 120.0


@pytest.fixture(scope="module")
def engine_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EStack]:
    # The product's step timeouts, not the fast ones: Chromium's start on a busy machine outlasts the fast
    # policy's 10 s browser heartbeat, and a run that fails its reproduction says nothing about the engine. The
    # variable outranks the stack's config.json for every process started here (receiver and workers).
    before = os.environ.get("DURAFIX_FAST_TIMEOUTS")
    os.environ["DURAFIX_FAST_TIMEOUTS"] = "false"
    try:
        with scripted_stack(tmp_path_factory, "durafix-engine", receiver_ready_s=READY_S) as e2e:
            try:
                yield e2e
            finally:
                # A receiver restarted by a test is not the one the stack's fixture started (and stops).
                processes.stop(e2e.receiver)
    finally:
        if before is None:
            del os.environ["DURAFIX_FAST_TIMEOUTS"]
        else:
            os.environ["DURAFIX_FAST_TIMEOUTS"] = before


@pytest.fixture
def fresh_stack(engine_stack: E2EStack) -> Iterator[E2EStack]:
    """The module's stack, its workers stopped at the end (a test that fails midway leaves none behind)."""
    try:
        yield engine_stack
    finally:
        engine_stack.stop_workers()


# ---- the engine's process ---------------------------------------------------------------------------------


def temporal_record(e2e: E2EStack) -> ServiceRecord:
    return stack.read_stack(e2e.state_dir).services["temporal"]


def kill_temporal(e2e: E2EStack) -> list[str]:
    """SIGKILL the stack's Temporal dev server (its process group) and wait until it is gone; its argv."""
    rec = temporal_record(e2e)
    assert processes.is_alive(rec), "the stack's Temporal server is not running"
    argv = Path(f"/proc/{rec.pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
    assert str(e2e.state_dir / "temporal.sqlite") in argv and str(rec.port) in argv, argv
    with contextlib.suppress(ProcessLookupError):
        os.killpg(rec.pid, signal.SIGKILL)
    wait_for(lambda: not processes.is_alive(rec), 30, "the killed Temporal server to be gone")
    wait_for(lambda: not processes.tcp_open("127.0.0.1", rec.port), 30, "the Temporal port to close")
    return argv


async def start_temporal(e2e: E2EStack, argv: list[str]) -> ServiceRecord:
    """Start the server again with ``argv`` (same port, same database file), record the new process in the
    stack's state (so that ``stack.down`` stops it) and return once it serves."""
    old = temporal_record(e2e)
    rec = processes.spawn("temporal", argv, log=Path(old.log), port=old.port, url=old.url, env={})
    rec.extra.update(old.extra)
    state = stack.read_stack(e2e.state_dir)
    state.services["temporal"] = rec
    path = e2e.state_dir / "stack.json"
    tmp = path.with_suffix(".restart.tmp")
    tmp.write_text(state.model_dump_json(indent=2))
    tmp.chmod(0o600)
    tmp.replace(path)
    deadline = time.monotonic() + 60
    while True:
        assert processes.is_alive(rec), processes.log_tail(Path(rec.log))
        try:
            probe = await Client.connect(rec.url)
            await probe.workflow_service.get_system_info(GetSystemInfoRequest())
            return rec
        except Exception as err:  # not serving yet
            assert time.monotonic() < deadline, f"the restarted server does not serve: {err}"
        await asyncio.sleep(0.3)


async def restart_temporal(e2e: E2EStack) -> ServiceRecord:
    argv = kill_temporal(e2e)
    await asyncio.sleep(OUTAGE_S)
    return await start_temporal(e2e, argv)


def restart_receiver(e2e: E2EStack) -> ServiceRecord:
    """SIGKILL the webhook receiver and start it again on the same port (the repositories' hooks name it)."""
    old = e2e.receiver
    with contextlib.suppress(ProcessLookupError):
        os.killpg(old.pid, signal.SIGKILL)
    wait_for(lambda: not processes.is_alive(old), 30, "the killed receiver to be gone")
    wait_for(lambda: not processes.tcp_open("127.0.0.1", old.port), 30, "the receiver's port to close")
    argv = [sys.executable, "-m", "pipeline", "--state-dir", str(e2e.state_dir), "serve", "--port", str(old.port)]
    rec = processes.spawn("receiver", argv, log=Path(old.log), port=old.port, url=old.url)
    e2e.receiver = rec
    processes.wait_ready(rec, lambda: processes.tcp_open("127.0.0.1", old.port), READY_S)
    return rec


async def pollers(client: Client, queue: str, kind: TaskQueueType.ValueType) -> list[PollerInfo]:
    """The pollers of ``queue`` for ``kind`` tasks (identity, last access), as the engine knows them (a
    restarted server knows only the pollers that polled it since)."""
    answer = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(namespace=client.namespace, task_queue=TaskQueueRef(name=queue), task_queue_type=kind)
    )
    return list(answer.pollers)


async def workers_polling_again(client: Client, workers: list[ServiceRecord]) -> None:
    """Each worker process (still the same process) polls the orchestration and the forge queues again."""
    pids = {f"{w.pid}@" for w in workers}
    deadline = time.monotonic() + 180
    while True:
        try:
            wf = [
                p.identity
                for p in await pollers(client, TaskQueue.ORCHESTRATION.value, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)
            ]
            act = [
                p.identity for p in await pollers(client, TaskQueue.FORGE.value, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
            ]
        except Exception:  # the client's channel reconnects on its own; until then the call fails
            wf = act = []
        if all(any(p.startswith(pid) for p in wf) and any(p.startswith(pid) for p in act) for pid in pids):
            return
        assert time.monotonic() < deadline, f"workers {sorted(pids)} not polling again: {wf} / {act}"
        await asyncio.sleep(0.5)


async def reproduction_running(client: Client, wf: str) -> None:
    """Return once the run's reproduction (``browser.reproduce``) has been started by a worker."""
    deadline = time.monotonic() + 180
    handle = client.get_workflow_handle(wf)
    while time.monotonic() < deadline:
        try:
            desc = await handle.describe()
        except Exception:  # the receiver may not have started the run yet
            await asyncio.sleep(0.3)
            continue
        for pending in desc.raw_description.pending_activities:
            if (
                pending.activity_type.name == steps.REPRODUCE.name
                and pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
            ):
                return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{wf}: the reproduction never started")


# ---- what the forge, the engine and the machine hold ----------------------------------------------------------


async def history_of(client: Client, wf: str) -> WorkflowHistory:
    return await client.get_workflow_handle(wf).fetch_history()


def patch_markers(history: WorkflowHistory) -> list[str]:
    """The patch IDs the run recorded (its ``core_patch`` markers)."""
    found = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            attrs = event.marker_recorded_event_attributes
            if attrs.marker_name == "core_patch":
                found.append(str(json.loads(attrs.details["patch-data"].payloads[0].data)["id"]))
    return found


async def replays_on(history: WorkflowHistory, workflow: type) -> None:
    replayer = Replayer(workflows=[workflow], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{workflow.__name__}: {result.replay_failure!r}"


# ---- the tests -------------------------------------------------------------------------------------------


@pytest.mark.timeout(900)
async def test_engine_killed_during_reproduction_and_at_review_wait_the_run_still_merges_once(
    fresh_stack: E2EStack,
) -> None:
    """SIGKILL of the Temporal server while the browser reproduces the report, and again while the run waits
    for its review: the same worker and receiver processes reconnect on their own, the approval given on the
    forge after the second restart reaches the run, and it merges with one of each on the forge."""
    e2e = fresh_stack
    worker = e2e.spawn_worker()
    receiver = e2e.receiver
    client, repository, issue, wf = await e2e.open_run()

    await reproduction_running(client, wf)
    await restart_temporal(e2e)
    await workers_polling_again(client, [worker])
    state = await state_when(client, wf, awaiting_review)
    assert state.pending_approval is not None, state.outcome_detail
    assert state.reproduction is not None and state.reproduction.status == "reproduced"

    await restart_temporal(e2e)
    await workers_polling_again(client, [worker])
    # The receiver was not restarted: its Temporal connection comes back on its own and the approval's webhook
    # is delivered through it.
    e2e.approve_on_forge(repository, state.pending_approval.pr_number, state.pending_approval.head_sha)
    final = await state_when(client, wf, finished)
    assert final.approval is not None and final.approval.source == "webhook", e2e.deliveries_log()
    assert final.approval.head_sha == state.pending_approval.head_sha
    assert_merged_once(e2e, repository, issue, wf, final)
    assert processes.is_alive(worker) and e2e.workers == [worker], processes.log_tail(Path(worker.log))
    assert processes.is_alive(receiver) and e2e.receiver == receiver
    e2e.stop_workers()
    assert not processes.is_alive(worker)


@pytest.mark.timeout(900)
async def test_every_process_restarted_at_review_wait_with_the_workflow_cache_off_the_run_merges(
    fresh_stack: E2EStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers without a workflow cache (``DURAFIX_MAX_CACHED_WORKFLOWS=0``: every task replays the history);
    at the review wait the workers, the receiver and the Temporal server are all SIGKILLed and started again;
    the approval reaches the run through the new receiver and the new worker merges."""
    e2e = fresh_stack
    monkeypatch.setenv("DURAFIX_MAX_CACHED_WORKFLOWS", "0")
    first = e2e.spawn_worker()
    client, repository, issue, wf = await e2e.open_run()
    state = await state_when(client, wf, awaiting_review)
    assert state.pending_approval is not None, state.outcome_detail

    old_receiver = e2e.receiver
    for rec in [first, old_receiver]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rec.pid, signal.SIGKILL)
    argv = kill_temporal(e2e)
    wait_for(lambda: not processes.is_alive(first) and not processes.is_alive(old_receiver), 30, "killed processes")
    e2e.workers.clear()
    await start_temporal(e2e, argv)
    receiver = restart_receiver(e2e)
    second = e2e.spawn_worker()
    await workers_polling_again(client, [second])

    e2e.approve_on_forge(repository, state.pending_approval.pr_number, state.pending_approval.head_sha)
    final = await state_when(client, wf, finished)
    assert final.approval is not None and final.approval.source == "webhook", e2e.deliveries_log()
    assert_merged_once(e2e, repository, issue, wf, final)
    assert receiver.pid != old_receiver.pid and processes.is_alive(receiver)
    # Without a cache no workflow task is ever offered on a worker's sticky queue: each one went to the
    # orchestration queue and was replayed from the history by whichever worker took it.
    history = await history_of(client, wf)
    scheduled = [
        e.workflow_task_scheduled_event_attributes.task_queue
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED
    ]
    assert len(scheduled) > 5
    assert {q.kind for q in scheduled} == {TaskQueueKind.TASK_QUEUE_KIND_NORMAL}, scheduled
    assert {q.name for q in scheduled} == {TaskQueue.ORCHESTRATION.value}
    await replays_on(history, RepairBugWorkflow)
    record_history(history, "all-restarted-at-review-cache-off")


@pytest.mark.timeout(900)
async def test_a_compatible_change_deployed_while_a_run_waits_finishes_it_on_the_old_path(
    fresh_stack: E2EStack, tmp_path: Path
) -> None:
    """A run waiting at review on the current code; the workers replaced by workers of a changed release (a new
    step behind ``MERGE_NOTICE_PATCH`` after the review wait). The waiting run is replayed by the new code
    without nondeterminism, takes the old path (no notice, no marker) and merges; a run started on the new code
    takes the new path (the notice on its PR, the marker in its history) and merges."""
    e2e = fresh_stack
    e2e.spawn_worker()
    client, repo_old, issue_old, wf_old = await e2e.open_run()
    waiting = await state_when(client, wf_old, awaiting_review)
    assert waiting.pending_approval is not None, waiting.outcome_detail
    history = await history_of(client, wf_old)
    assert MERGE_NOTICE_PATCH not in patch_markers(history)
    await replays_on(history, RepairBugWorkflow)
    await replays_on(history, ChangedRepairBug)
    record_history(history, "awaiting-review-before-change")

    e2e.stop_workers()
    e2e.spawn_worker(fault="changed-workflow", kill_dir=tmp_path / "kills")
    _, repo_new, issue_new, wf_new = await e2e.open_run()
    new_waiting = await state_when(client, wf_new, awaiting_review)
    assert new_waiting.pending_approval is not None, new_waiting.outcome_detail

    for repository, pending in [(repo_old, waiting.pending_approval), (repo_new, new_waiting.pending_approval)]:
        e2e.approve_on_forge(repository, pending.pr_number, pending.head_sha)
    old_final = await state_when(client, wf_old, finished)
    new_final = await state_when(client, wf_new, finished)
    assert_merged_once(e2e, repo_old, issue_old, wf_old, old_final)
    assert_merged_once(e2e, repo_new, issue_new, wf_new, new_final)

    def notices(repository: str, number: int) -> list[str]:
        comments = e2e.github().get_repo(repository).get_issue(number).get_comments()
        return [c.body for c in comments if NOTICE_TEXT in c.body]

    assert notices(repo_old, waiting.pending_approval.pr_number) == []
    said = notices(repo_new, new_waiting.pending_approval.pr_number)
    assert len(said) == 1 and new_waiting.pending_approval.head_sha in said[0], said

    old_history = await history_of(client, wf_old)
    new_history = await history_of(client, wf_new)
    assert MERGE_NOTICE_PATCH not in patch_markers(old_history)
    assert patch_markers(new_history).count(MERGE_NOTICE_PATCH) == 1
    # The old run's whole history (its end written by the new code) replays on both releases; the new run's on
    # the new release.
    await replays_on(old_history, RepairBugWorkflow)
    await replays_on(old_history, ChangedRepairBug)
    await replays_on(new_history, ChangedRepairBug)
    record_history(old_history, "finished-on-changed-code")
    record_history_to(new_history, CHANGED_CODE_HISTORIES, "started-on-changed-code")
