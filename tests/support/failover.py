"""What the failover test and benchmark share: a supervised ``durafix worker`` process (with the ``probe.hold``
activity of ``workers/faulty.py failover-probe``) on a state directory pointed at a Temporal server (and a
forge), a probe workflow that runs held attempts and forge steps with the default :class:`RunPolicy`'s
timeouts, and the facts read back from the workflow history.

The killed process is the supervisor's *polling* child, named by the in-flight directory that holds the
held attempt's record (``STATE/inflight/<pid>-<start>/``): the process that runs the activity.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from infra.processes import free_port
from pipeline import config as config_module
from pipeline.config import DurafixConfig
from pipeline.policies import RunPolicy, StepTimeouts
from pipeline.steps import ENSURE_TICKET, EnsureTicketInput, TaskQueue, TicketResult
from pipeline.worker.inflight import Attempt, InflightDir, inflight_root
from tests.support.run_history import failure_kind

REPO_ROOT = Path(__file__).resolve().parents[2]
FAULTY_WORKER = Path(__file__).resolve().parent / "workers" / "faulty.py"
PROBE = "probe.hold"
PROBE_QUEUE = "durafix-failover-probe"

M = TypeVar("M", bound=BaseModel)


class Hold(BaseModel):
    first_s: float
    later_s: float = 0.0


class Held(BaseModel):
    pid: int
    attempt: int


class ProbeInput(BaseModel):
    holds: list[Hold] = []
    ticket: EnsureTicketInput | None = None
    # The ticket step waits for the ``proceed`` signal (the test's next kill must find a warm spare first).
    ticket_on_signal: bool = False


class ProbeOutput(BaseModel):
    held: list[Held]
    ticket: TicketResult | None


async def step(name: str, arg: BaseModel, queue: TaskQueue, t: StepTimeouts, result_type: type[M]) -> M:
    """One activity with the timeouts and retry policy of ``t``, as the repair workflow schedules its steps."""
    result: M = await workflow.execute_activity(
        name,
        arg,
        task_queue=queue.value,
        result_type=result_type,
        schedule_to_start_timeout=timedelta(seconds=t.schedule_to_start),
        start_to_close_timeout=timedelta(seconds=t.start_to_close),
        schedule_to_close_timeout=timedelta(seconds=t.schedule_to_close),
        heartbeat_timeout=timedelta(seconds=t.heartbeat) if t.heartbeat else None,
        retry_policy=t.retry_policy(),
    )
    return result


# Not sandboxed: this module also holds the processes' helpers, which the sandbox would refuse at import.
@workflow.defn(name="failover-probe", sandboxed=False)
class ProbeWorkflow:
    """The holds at once (each with the default policy's browser timeouts), then the ticket (its forge ones),
    on the ``proceed`` signal if the input says so."""

    def __init__(self) -> None:
        self.proceeding = False

    @workflow.signal
    def proceed(self) -> None:
        self.proceeding = True

    @workflow.run
    async def run(self, inp: ProbeInput) -> ProbeOutput:
        policy = RunPolicy()
        held = await asyncio.gather(*(step(PROBE, h, TaskQueue.MODEL, policy.browser, Held) for h in inp.holds))
        ticket = None
        if inp.ticket is not None:
            if inp.ticket_on_signal:
                await workflow.wait_condition(lambda: self.proceeding)
            ticket = await step(ENSURE_TICKET.name, inp.ticket, TaskQueue.FORGE, policy.forge, TicketResult)
        return ProbeOutput(held=list(held), ticket=ticket)


def configure(state: Path, client: Client, **forge: str) -> DurafixConfig:
    """The state directory's configuration: the client's server and namespace, and ``forge_*`` settings."""
    config = DurafixConfig(
        state_dir=state,
        temporal_address=client.service_client.config.target_host,
        temporal_namespace=client.namespace,
        # The model queue's activities here never call a model, but the worker serves the queue only with an
        # endpoint configured: one on this host that does not answer (the worker starts, and warns).
        model_base_url=f"http://127.0.0.1:{free_port()}/v1",
        **forge,  # type: ignore[arg-type]
    )
    config.save()
    return config


@dataclass
class SupervisedWorker:
    """A supervised ``durafix worker`` process: ``workers/faulty.py failover-probe``."""

    state: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def count(self, needle: str) -> int:
        return self.log_text().count(needle)

    async def wait_log(self, needle: str, at_least: int, timeout_s: float) -> None:
        """Until the log holds ``needle`` ``at_least`` times (the supervisor's notes)."""
        deadline = time.monotonic() + timeout_s
        while self.count(needle) < at_least:
            assert self.proc.poll() is None, f"the worker exited ({self.proc.returncode}):\n{self.log_text()[-3000:]}"
            if time.monotonic() > deadline:
                raise AssertionError(f"no {at_least}x {needle!r} in the worker's log after {timeout_s:.0f}s")
            await asyncio.sleep(0.1)

    def spares_ready(self) -> int:
        return self.count("ready (spare)")

    def inflight(self, activity_type: str, workflow_id: str) -> tuple[InflightDir, Attempt] | None:
        """The in-flight record of the workflow's attempt of ``activity_type``, and the directory holding it."""
        root = inflight_root(self.state)
        for entry in sorted(root.iterdir()) if root.exists() else []:
            where = InflightDir(entry)
            for _, attempt in where.attempts():
                if attempt.activity_type == activity_type and attempt.workflow_id == workflow_id:
                    return where, attempt
        return None

    async def wait_inflight(
        self, client: Client, activity_type: str, workflow_id: str, timeout_s: float
    ) -> tuple[InflightDir, Attempt]:
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.inflight(activity_type, workflow_id)
            if found is not None:
                return found
            assert self.proc.poll() is None, f"the worker exited:\n{self.log_text()[-3000:]}"
            if time.monotonic() > deadline:
                desc = await client.get_workflow_handle(workflow_id).describe()
                pending = [
                    (a.activity_type.name, a.attempt, a.state, a.last_failure.message)
                    for a in desc.raw_description.pending_activities
                ]
                raise AssertionError(
                    f"{activity_type} of {workflow_id} never started ({desc.status}, pending {pending}):\n"
                    f"{self.log_text()[-3000:]}"
                )
            await asyncio.sleep(0.05)


def kill_child(where: InflightDir) -> float:
    """SIGKILL the process that recorded ``where`` (a supervised child); the wall-clock time of the kill."""
    assert where.owner_running(), f"process {where.pid} is not running"
    killed_at = time.time()
    os.kill(where.pid, signal.SIGKILL)
    return killed_at


@asynccontextmanager
async def supervised_worker(state: Path, queues: str = "forge,model") -> AsyncIterator[SupervisedWorker]:
    """A supervised worker on ``state`` (configured first, :func:`configure`); ready once its first child polls
    and its spare is warm. Stopped with SIGTERM to its group at the end (SIGKILL if it will not)."""
    log = state / "worker.log"
    env = {k: v for k, v in os.environ.items() if k not in config_module._ENV}
    env["PYTHONPATH"] = str(REPO_ROOT)
    argv = [
        sys.executable,
        str(FAULTY_WORKER),
        "failover-probe",
        "--state-dir",
        str(state),
        "worker",
        "--queues",
        queues,
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    worker = SupervisedWorker(state, proc, log)
    try:
        await worker.wait_log(" polls", 1, 180)
        await worker.wait_log("ready (spare)", 1, 180)
        yield worker
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@dataclass(frozen=True)
class AttemptStart:
    """An ``ActivityTaskStarted`` event: which activity, which attempt, when, and why the one before failed."""

    activity_id: str
    activity_type: str
    attempt: int
    started: datetime
    last_failure_type: str  # the previous attempt's failure: an application error's type, or "Timeout:<kind>"


async def attempt_starts(client: Client, workflow_id: str) -> list[AttemptStart]:
    """Every activity's started event (one per activity: its last attempt), from the workflow history."""
    scheduled: dict[int, tuple[str, str]] = {}
    out: list[AttemptStart] = []
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            scheduled[event.event_id] = (attrs.activity_id, attrs.activity_type.name)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = event.activity_task_started_event_attributes
            activity_id, activity_type = scheduled[started.scheduled_event_id]
            out.append(
                AttemptStart(
                    activity_id=activity_id,
                    activity_type=activity_type,
                    attempt=started.attempt,
                    started=event.event_time.ToDatetime(tzinfo=UTC),
                    last_failure_type=failure_kind(started.last_failure),
                )
            )
    return out


def seconds_after(start: AttemptStart, wall: float) -> float:
    """How long after ``wall`` (``time.time()``) the attempt started, by the server's clock (the same host)."""
    return (start.started - datetime.fromtimestamp(wall, UTC)).total_seconds()
