"""Retries handed to a dead worker process's polls: found and failed again, not left to the heartbeat timeout.

A SIGKILLed worker process leaves its long polls open on the server for a moment: the server learns that the
connection closed only when it next reads from it, later on a loaded host. The retry of an attempt the
supervisor has just failed (:func:`pipeline.worker.inflight.fail_dir`) can be handed to one of those polls. The
server then records the retry as started by the dead process, and nothing runs it: it would wait out its
heartbeat timeout (90 s for a browser step), a minute and a half instead of the milliseconds of a failover.
Measured with the failover benchmark (two busy loops beside the worker): one kill in five once resumed only
after its heartbeat timeout.

:func:`fail_retries_started_by_the_dead` watches the retries of the attempts just failed for
:data:`WATCH_S`: a retry started under the dead process's identity (``…/child-PID``, see
:func:`pipeline.worker.runner.worker_identity`) is failed again, by its activity ID, as :data:`WORKER_LOST`
with the same almost-zero retry delay, and watched in turn. A retry started by any other identity, completed,
or no longer pending ends the watch of that activity.

Contract: failing by activity ID fails whatever attempt is current when the server takes the request. The
identity is read just before, so only the rare attempt that started elsewhere in between could be failed by
mistake; it is then sent again at once, which every step allows (each is idempotent by the operation ID in its
input). Errors reaching the server end the watch quietly: the heartbeat timeout stays the backstop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from temporalio.api.enums.v1 import PendingActivityState
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from pipeline.failures import WORKER_LOST
from pipeline.worker.inflight import RETRY_AT_ONCE, Attempt

# How long the retries of a dead process's attempts are watched, and how often they are read meanwhile.
WATCH_S = 5.0
READ_EVERY_S = 0.1


@dataclass
class Watched:
    """One activity (of ``workflow_id``, ``run_id``, ``activity_id``) whose attempt ``attempt`` was failed for a
    dead process."""

    workflow_id: str
    run_id: str
    activity_id: str
    activity_type: str
    attempt: int


async def fail_retries_started_by_the_dead(
    client: Client, attempts: list[Attempt], dead_pid: int, why: str
) -> list[tuple[str, str, int]]:
    """Watch the retries of ``attempts`` (just failed for the process ``dead_pid``) and fail again every one
    started under that process's identity (see the module). Returns (workflow ID, activity type, attempt) of
    each retry failed again."""
    suffix = f"/child-{dead_pid}"
    watched = [
        Watched(a.workflow_id, a.workflow_run_id, a.activity_id, a.activity_type, a.attempt)
        for a in attempts
        if a.workflow_id
    ]
    failed: list[tuple[str, str, int]] = []
    deadline = time.monotonic() + WATCH_S
    while watched and time.monotonic() < deadline:
        still: list[Watched] = []
        for w in watched:
            with contextlib.suppress(RPCError):  # the server unreachable: this activity's watch ends
                verdict = await _look(client, w, suffix, why)
                if verdict == "failed":
                    failed.append((w.workflow_id, w.activity_type, w.attempt))
                if verdict != "done":
                    still.append(w)
        watched = still
        if watched:
            await asyncio.sleep(READ_EVERY_S)
    return failed


async def _look(client: Client, w: Watched, suffix: str, why: str) -> str:
    """``failed``: ``w``'s retry was started under the dead identity and is failed again (``w`` now names it);
    ``wait``: it is not started yet; ``done``: it was started elsewhere, or is no longer pending."""
    found = await _pending_activity(client, w)
    if found is None:
        return "done"
    if found.attempt <= w.attempt or found.state != PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
        return "wait"
    if not found.last_worker_identity.endswith(suffix):
        return "done"
    error = ApplicationError(
        f"{w.activity_type} attempt {found.attempt}: handed to a poll of a dead process ({why})",
        type=WORKER_LOST,
        next_retry_delay=RETRY_AT_ONCE,
    )
    handle = client.get_async_activity_handle(workflow_id=w.workflow_id, run_id=w.run_id, activity_id=w.activity_id)
    with contextlib.suppress(RPCError):  # the attempt closed meanwhile: nothing to hand over
        await handle.fail(error)
    w.attempt = found.attempt
    return "failed"


async def _pending_activity(client: Client, w: Watched) -> PendingActivityInfo | None:
    desc = await client.get_workflow_handle(w.workflow_id, run_id=w.run_id).describe()
    for pending in desc.raw_description.pending_activities:
        if pending.activity_id == w.activity_id:
            return pending
    return None
