"""A stale but live worker: stopped (SIGSTOP) in the middle of a forge step past the step's timeout, a successor
finishes the step and the run, and then the stopped worker is continued (SIGCONT) and carries on as if nothing
happened. Nothing it does after waking shows on the forge: its late write meets the adapter's claims and
markers (the step was done by the successor), or, when it wakes before its first check and after the run's
cleanup, the run's tombstone; and Temporal refuses its stale task token.

The stack is the embedded one of the end-to-end tests (Temporal dev server, GitHub emulator, scripted model,
real git and Chromium, the real receiver); the run is started by the trigger label's webhook. One ``durafix
worker`` serves every queue but the forge's; the forge queue is served by a worker process that stops itself
at the named point (``workers/faulty.py stop-mid-step``) and, once it is stopped, by a successor. Asserted:
the forge as PyGithub reads it (one ticket, PR, branch and evidence comment; the ticket's final text), the
run's history (the step's one completion is the successor's attempt) and the disk (no process or workspace of
the run left).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from environments.run_fence import tombstone_ref
from infra import processes
from infra.processes import ServiceRecord
from pipeline import steps
from pipeline.services import Services
from pipeline.state import Outcome, RunState
from tests.e2e.test_pipeline import awaiting_review, finished, state_when
from tests.support.e2e_stack import REPO_ROOT, E2EStack, e2e_stack, one_of_each, owned_processes, run_workspaces

__all__ = ["e2e_stack"]

pytestmark = [pytest.mark.slow, pytest.mark.browser]

FAULTY_WORKER = Path(__file__).resolve().parents[1] / "support" / "workers" / "faulty.py"
NOT_FORGE = "orchestration,environments,browser,model"


class Workers:
    """The test's ``durafix worker`` processes; each is continued (if stopped) and stopped at the end."""

    def __init__(self, stack: E2EStack, stop_dir: Path) -> None:
        self.stack = stack
        self.stop_dir = stop_dir
        self.started: list[ServiceRecord] = []

    def spawn(self, queues: str, *, stop_at: str | None = None) -> ServiceRecord:
        n = len(self.started)
        env = {"PYTHONPATH": str(REPO_ROOT)}
        argv = [sys.executable, "-m", "pipeline"]
        if stop_at is not None:
            env |= {"DURAFIX_TEST_STOP_AT": stop_at, "DURAFIX_TEST_STOP_DIR": str(self.stop_dir)}
            argv = [sys.executable, str(FAULTY_WORKER), "stop-mid-step"]
        rec = processes.spawn(
            f"stale-worker-{n}",
            # Unsupervised: the process that stops itself is the one recorded (a stopped worker is alive, so a
            # supervisor would not fail it over anyway; the heartbeat timeout is what moves its step).
            [*argv, "--state-dir", str(self.stack.state_dir), "worker", "--queues", queues, "--no-supervise"],
            log=self.stack.state_dir / "logs" / f"stale-worker-{n}.log",
            port=0,
            url="",
            env=env,
        )
        self.started.append(rec)
        return rec

    def close(self) -> None:
        for rec in self.started:
            with_cont(rec)
            processes.stop(rec, grace_s=15)


def with_cont(rec: ServiceRecord) -> None:
    if processes.is_alive(rec):
        os.kill(rec.pid, signal.SIGCONT)


@pytest.fixture
def workers(e2e_stack: E2EStack, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(e2e_stack, tmp_path / "stop")
    try:
        yield started
    finally:
        started.close()


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``T``: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


async def until_file(path: Path, timeout_s: float, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(0.2)
    found: dict[str, Any] = json.loads(path.read_text())
    return found


async def stopped_attempt(workers: Workers, rec: ServiceRecord) -> dict[str, Any]:
    """What the stopped worker noted of its attempt, once the whole process is stopped."""
    stopped = await until_file(workers.stop_dir / "stopped.json", 400, "the forge worker to stop itself")
    assert stopped["pid"] == rec.pid
    deadline = time.monotonic() + 10
    while process_state(rec.pid) != "T":
        assert time.monotonic() < deadline, f"worker {rec.pid} never stopped"
        await asyncio.sleep(0.05)
    return stopped


async def step_events(client: Client, workflow_id: str, step: str) -> tuple[list[Any], list[Any], list[Any]]:
    """The run's scheduled, started and completed events of activity type ``step``."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    scheduled = {
        e.event_id: e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == step
    }
    started = [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.scheduled_event_id in scheduled
    ]
    completed = [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and e.activity_task_completed_event_attributes.scheduled_event_id in scheduled
    ]
    return list(scheduled.values()), started, completed


async def assert_done_once_by(client: Client, workflow_id: str, step: str, successor: ServiceRecord) -> None:
    """The step was scheduled once and completed once, by the successor's retry (the stale attempt was the
    first): what the stopped worker sends later is not in the history."""
    scheduled, started, completed = await step_events(client, workflow_id, step)
    assert len(scheduled) == 1 and len(started) == 1 and len(completed) == 1, (scheduled, started, completed)
    attrs = started[0].activity_task_started_event_attributes
    assert attrs.attempt >= 2, attrs
    assert attrs.identity == f"{successor.pid}@{socket.gethostname()}", attrs.identity


async def assert_token_refused(client: Client, stopped: dict[str, Any]) -> None:
    """The stopped attempt's task token no longer completes anything: Temporal answers it NotFound."""
    token = base64.b64decode(stopped["task_token"])
    with pytest.raises(RPCError) as refused:
        await client.get_async_activity_handle(task_token=token).complete(None)
    assert refused.value.status == RPCStatusCode.NOT_FOUND, refused.value


async def stopped_in_a_forge_step(
    stack: E2EStack, workers: Workers, stop_at: str, step: str
) -> tuple[Client, str, int, str, ServiceRecord, dict[str, Any], ServiceRecord]:
    """A run whose forge ``step`` (attempt 1) a worker stopped itself in, at ``stop_at``, and the successor forge
    worker started once it stopped (the other queues have a worker of their own): the run's client, repository,
    issue and workflow ID, the stopped worker, what it noted of its attempt, and the successor."""
    workers.spawn(NOT_FORGE)
    stale = workers.spawn("forge", stop_at=stop_at)
    client, repository, issue, wf = await stack.open_run()
    stopped = await stopped_attempt(workers, stale)
    assert stopped["activity_type"] == step and stopped["attempt"] == 1
    successor = workers.spawn("forge")
    return client, repository, issue, wf, stale, stopped, successor


async def merged_run(stack: E2EStack, client: Client, repository: str, workflow_id: str) -> RunState:
    """The reviewer approves the head under review on the forge; the run merges and ends."""
    state = await state_when(client, workflow_id, awaiting_review)
    assert state.pending_approval is not None, state.outcome_detail
    stack.approve_on_forge(repository, state.pending_approval.pr_number, state.pending_approval.head_sha)
    final = await state_when(client, workflow_id, finished)
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    return final


def assert_one_of_each(stack: E2EStack, repository: str, workflow_id: str, issue: int, final: RunState) -> None:
    """The forge holds one ticket (its text the run's final one), one PR (merged), one branch, one evidence
    comment; and the machine holds nothing of the run."""
    one_of_each(stack, repository, workflow_id, issue, final)
    assert final.publish is not None
    repo = stack.github().get_repo(repository)
    pulls = list(repo.get_pulls(state="all"))
    assert [(p.number, p.merged) for p in pulls] == [(final.publish.pr_number, True)]
    assert repo.get_branch("main").commit.sha == final.merged_sha
    [ticket] = [c.body for c in repo.get_issue(issue).get_comments() if "durafix:ticket" in c.body]
    # The closing update landed after the cleanup: the one forge write the tombstone lets through.
    assert "has finished with this report" in ticket, ticket
    assert owned_processes(workflow_id) == []
    assert run_workspaces(stack, workflow_id) == []


@pytest.mark.timeout(600)
async def test_a_worker_stopped_inside_a_forge_write_wakes_after_the_run_and_its_write_meets_the_claim(
    e2e_stack: E2EStack, workers: Workers
) -> None:
    """Stopped inside ``forge.ensure_ticket`` just before the adapter writes (the run's fence check passed);
    the successor's retry posts the ticket and the run goes on to merge and clean up; continued after that, the
    stale attempt finds the ticket under its claim and posts nothing, and its task token is refused."""
    stack = e2e_stack
    client, repository, issue, wf, stale, stopped, successor = await stopped_in_a_forge_step(
        stack, workers, "adapter:ensure_ticket", steps.ENSURE_TICKET.name
    )

    final = await merged_run(stack, client, repository, wf)
    before = [(c.id, c.body) for c in stack.github().get_repo(repository).get_issue(issue).get_comments()]

    with_cont(stale)
    resumed = await until_file(workers.stop_dir / "resumed.json", 60, "the continued attempt to finish its write")
    assert "created=False" in resumed.get("result", ""), (resumed, processes.log_tail(Path(stale.log), 60))
    await assert_token_refused(client, stopped)
    await assert_done_once_by(client, wf, steps.ENSURE_TICKET.name, successor)
    after = [(c.id, c.body) for c in stack.github().get_repo(repository).get_issue(issue).get_comments()]
    assert after == before
    assert_one_of_each(stack, repository, wf, issue, final)
    assert (await client.get_workflow_handle(wf).describe()).status == WorkflowExecutionStatus.COMPLETED


@pytest.mark.timeout(600)
async def test_a_worker_stopped_as_a_forge_step_began_wakes_after_cleanup_and_is_fenced(
    e2e_stack: E2EStack, workers: Workers
) -> None:
    """Stopped as its ``forge.ensure_draft_pr`` attempt began (before any check); the successor opens the PR
    and the run merges it and cleans up; continued after that, the stale attempt meets the run's tombstone and
    opens nothing (the adapter alone would: it looks only for an *open* PR of the branch, and the run's is
    merged)."""
    stack = e2e_stack
    client, repository, issue, wf, stale, stopped, successor = await stopped_in_a_forge_step(
        stack, workers, "activity:ensure_draft_pr", steps.ENSURE_DRAFT_PR.name
    )

    final = await merged_run(stack, client, repository, wf)
    assert final.cleanup is not None and final.cleanup.complete, final.cleanup
    # What the stale attempt is about to meet: still stopped, and the run's tombstone already in the store.
    assert process_state(stale.pid) == "T", "the stale worker woke before it was continued"
    assert Services(stack.config).store.exists(tombstone_ref(wf)), "the run ended without its tombstone"

    with_cont(stale)
    resumed = await until_file(workers.stop_dir / "resumed.json", 60, "the continued attempt to end")
    fenced = resumed.get("error") == "ApplicationError" and "cleaned up" in resumed["detail"]
    closed = (await client.get_workflow_handle(wf).describe()).close_time
    assert fenced, (resumed, closed, wf, processes.log_tail(Path(stale.log), 60))
    await assert_token_refused(client, stopped)
    await assert_done_once_by(client, wf, steps.ENSURE_DRAFT_PR.name, successor)
    assert_one_of_each(stack, repository, wf, issue, final)
