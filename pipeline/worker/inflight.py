"""In-flight activity attempts of one worker process, on disk, so that whoever outlives the process can fail them.

A worker process records every activity attempt it starts (:class:`InflightInterceptor`) as one small JSON
file in its own directory, ``STATE/inflight/<pid>-<start time>/`` (:class:`InflightDir`), and removes the
file when the attempt's function returns. When the process dies (SIGKILL included) the files of the attempts
it was running are left behind; the supervisor that waited for it (:mod:`pipeline.worker.supervisor`), or any worker
that later starts on the state directory (:func:`sweep`), fails each of them through Temporal's async
activity handle with a retryable :data:`WORKER_LOST` error and an almost-zero retry delay, so the server
starts the next attempt at once instead of after the heartbeat or start-to-close timeout.

Contracts:

- A record is written with a rename (never half-written) and without fsync: it has to survive the death of
  its process, not of the host, and a host that dies takes its supervisor with it (the heartbeat timeout
  covers that case).
- Failing a record is idempotent and safe against staleness. The task token names one attempt; once that
  attempt completed, failed or timed out, the server refuses the token (``NOT_FOUND``), which is taken as
  done. Conversely an attempt failed here can never record a result afterwards: the server refuses the same
  stale token from its old worker, should that worker somehow still be alive.
- A directory is swept only when the process it names is not running (pid *and* start time, so a recycled
  pid is never taken for it). Two sweepers may race on one directory: each token is then failed once and
  refused the second time.
- Not covered: an attempt whose function returned (record removed) but whose result the process had not yet
  sent when it died; it waits for its heartbeat or start-to-close timeout, as before.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetStickyTaskQueueRequest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from environments.processes import is_running, start_time
from pipeline.failures import WORKER_LOST
from pipeline.worker.logs import worker_logger

# Zero would mean "not set" to the server (the retry policy's backoff would apply): the smallest wait instead.
RETRY_AT_ONCE = timedelta(milliseconds=1)
CLOSED = (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT, RPCStatusCode.FAILED_PRECONDITION)


def inflight_root(state_dir: Path) -> Path:
    return state_dir / "inflight"


class Attempt(BaseModel):
    """One activity attempt a worker process started and has not finished."""

    task_token: str  # base64 of the attempt's task token
    activity_type: str
    activity_id: str
    attempt: int
    workflow_id: str  # empty for an activity no workflow started
    workflow_run_id: str
    started_at: float  # wall clock, seconds

    def token(self) -> bytes:
        return base64.b64decode(self.task_token)


@dataclass(frozen=True)
class InflightDir:
    """The directory of one worker process's in-flight attempts: ``ROOT/<pid>-<start time>``."""

    path: Path

    @classmethod
    def for_process(cls, state_dir: Path, pid: int | None = None) -> InflightDir:
        pid = os.getpid() if pid is None else pid
        return cls(inflight_root(state_dir) / f"{pid}-{start_time(pid)}")

    @property
    def pid(self) -> int:
        return int(self.path.name.partition("-")[0])

    @property
    def start_time(self) -> int:
        return int(self.path.name.partition("-")[2])

    def owner_running(self) -> bool:
        return is_running(self.pid, self.start_time)

    @staticmethod
    def _name(token: bytes) -> str:
        return hashlib.sha256(token).hexdigest()[:32] + ".json"

    def record(self, attempt: Attempt) -> Path:
        """Write the attempt's record (atomically: a rename) and return its path."""
        self.path.mkdir(parents=True, exist_ok=True)
        final = self.path / self._name(attempt.token())
        tmp = final.with_suffix(".tmp")
        tmp.write_text(attempt.model_dump_json())
        os.replace(tmp, final)
        return final

    def remove(self, token: bytes) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.path / self._name(token)).unlink()

    def attempts(self) -> list[tuple[Path, Attempt]]:
        """The records left, oldest first; unreadable ones (a torn ``.tmp``) are skipped."""
        out: list[tuple[Path, Attempt]] = []
        try:
            files = sorted(self.path.glob("*.json"))
        except FileNotFoundError:
            return out
        for file in files:
            with contextlib.suppress(OSError, ValueError):
                out.append((file, Attempt.model_validate_json(file.read_text())))
        out.sort(key=lambda item: item[1].started_at)
        return out

    def discard(self) -> None:
        """Remove the directory and whatever is left in it (only once its attempts have been failed)."""
        for file in self.path.glob("*"):
            with contextlib.suppress(FileNotFoundError):
                file.unlink()
        with contextlib.suppress(FileNotFoundError, OSError):
            self.path.rmdir()


def dead_dirs(state_dir: Path) -> Iterator[InflightDir]:
    """The in-flight directories under the state directory whose processes are not running."""
    root = inflight_root(state_dir)
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return
    for entry in entries:
        pid, sep, started = entry.name.partition("-")
        if not (sep and pid.isdigit() and started.isdigit()):
            continue
        found = InflightDir(entry)
        if not found.owner_running():
            yield found


async def fail_attempt(client: Client, attempt: Attempt, why: str) -> bool:
    """Fail one attempt through its task token as :data:`WORKER_LOST`, retryable, retried at once.

    True when the server took it or had already closed the attempt (a stale token: ``NOT_FOUND``); False when
    the server could not be reached (the record should be kept for a later sweep)."""
    error = ApplicationError(
        f"{attempt.activity_type} attempt {attempt.attempt}: {why}",
        type=WORKER_LOST,
        next_retry_delay=RETRY_AT_ONCE,
    )
    try:
        await client.get_async_activity_handle(task_token=attempt.token()).fail(error)
    except RPCError as err:
        # Refused: the attempt is closed (or the token is not one the server can use); nothing to hand over.
        return err.status in CLOSED
    return True


async def unstick(client: Client, attempt: Attempt) -> None:
    """Send the run's next workflow task to the normal queue, not to the dead process's sticky queue."""
    request = ResetStickyTaskQueueRequest(
        namespace=client.namespace,
        execution=WorkflowExecution(workflow_id=attempt.workflow_id, run_id=attempt.workflow_run_id),
    )
    with contextlib.suppress(RPCError):
        await client.workflow_service.reset_sticky_task_queue(request)


async def fail_dir(client: Client, found: InflightDir, why: str) -> list[Attempt]:
    """Fail every attempt left in a dead process's directory; the directory goes once all were handed over.

    The attempts that were failed (or found already closed) are returned; a record the server could not be
    reached for stays, with its directory, for the next sweep."""
    done: list[Attempt] = []
    kept = False
    for file, attempt in found.attempts():
        if await fail_attempt(client, attempt, why):
            done.append(attempt)
            with contextlib.suppress(FileNotFoundError):
                file.unlink()
        else:
            kept = True
    for run in {(a.workflow_id, a.workflow_run_id): a for a in done if a.workflow_id}.values():
        await unstick(client, run)
    if not kept:
        found.discard()
    return done


async def sweep(client: Client, state_dir: Path) -> list[Attempt]:
    """Fail the attempts left by every dead worker process on this state directory (idempotent)."""
    failed: list[Attempt] = []
    for found in list(dead_dirs(state_dir)):
        done = await fail_dir(client, found, f"worker process {found.pid} is gone")
        for attempt in done:
            note(f"failed {attempt.activity_type} attempt {attempt.attempt} of {attempt.workflow_id}: process gone")
        failed += done
    return failed


def note(text: str) -> None:
    """A line of the worker's own log (:mod:`pipeline.worker.logs`: JSON unless asked for text)."""
    worker_logger().info(text)


class InflightInterceptor(Interceptor):
    """Records each activity attempt this process runs in its :class:`InflightDir` while the attempt runs."""

    def __init__(self, where: InflightDir) -> None:
        self.where = where

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Recording(next, self.where)


class _Recording(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, where: InflightDir) -> None:
        super().__init__(next)
        self.where = where

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        attempt = Attempt(
            task_token=base64.b64encode(info.task_token).decode(),
            activity_type=info.activity_type,
            activity_id=info.activity_id,
            attempt=info.attempt,
            workflow_id=info.workflow_id or "",
            workflow_run_id=info.workflow_run_id or "",
            started_at=time.time(),
        )
        # A record that cannot be written costs only the fast failover of this attempt, never the attempt.
        recorded = True
        try:
            self.where.record(attempt)
        except OSError as err:
            recorded = False
            note(f"could not record in-flight {info.activity_type}: {err}")
        try:
            return await super().execute_activity(input)
        finally:
            if recorded:
                self.where.remove(info.task_token)
