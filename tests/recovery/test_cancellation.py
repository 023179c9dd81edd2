"""Cancellation reaches running work, and a cleanup that cannot complete says so on the forge.

Each test drives one real run on the embedded stack (Temporal dev server, GitHub emulator, a ``durafix worker``
process, real Chromium, the local provider's sandboxed commands) and asserts external truth:

- a run cancelled while ``browser.reproduce`` waits on a page, or while ``env.verify_candidate`` runs the
  recipe's tests, shows in its history that the activity saw the cancellation within its heartbeat interval
  (``ActivityTaskCancelRequested`` -> ``ActivityTaskCanceled``), and afterwards no process marked for the run,
  no renderer of the worker's Chromium and no resource of the run (``durafix resources``) is left;
- a run whose workspace cannot be removed (made immutable with ``chattr +i``) ends ``cleanup-incomplete``: the
  result names the workspace, the ticket on the forge names it and says how to finish, and doing what it says
  (once the cause is gone) finishes the cleanup.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from environments.files import path_key
from infra.cli.demo import issue_text
from infra.processes import ServiceRecord
from pipeline import client as runs
from pipeline.cli.status import PendingActivity, pending_activities
from pipeline.ids import workflow_id_for
from pipeline.policies import RunPolicy
from pipeline.state import CleanupStatus, Outcome, Phase, RunState
from tests.conftest import require
from tests.e2e.test_pipeline import finished, state_when
from tests.support.e2e_stack import REPO_ROOT, E2EStack, owned_processes, scripted_stack, wait_for
from tests.support.proctree import Proc, descendants, is_chromium

pytestmark = [pytest.mark.slow, pytest.mark.browser]

RUN_TIMEOUT_S = 120.0
# What the activity may take beyond one heartbeat interval to end once its cancellation reached it: the heartbeat
# reply's trip, closing the page's context or stopping the test command's process group, reporting back.
CANCEL_MARGIN_S = 3.0
# The recipe's tests sleep this long on a candidate that carries the scripted fix's new test (never on the base,
# so the baseline is quick): the verification is still running its tests when the run is cancelled.
SLEEP_S = "97"
SLOW_TESTS = (
    f"if grep -q test_total_counts_quantities tests/test_cart.py; then sleep {SLEEP_S}; fi; "
    "python3 -m unittest discover -s tests -t ."
)
# The sample report's procedure, then a wait for an element the cart page never shows: the reproduction waits
# in Chromium (up to a minute) with the page open when the run is cancelled.
NEVER_THERE = "#never-there"
WAITING_STEPS = f"""  - action: wait_for
    selector: "{NEVER_THERE}"
    timeout_ms: 60000
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EStack]:
    require(shutil.which("chattr") is not None, "chattr is not installed (e2fsprogs)")
    with scripted_stack(tmp_path_factory, "durafix-cancel") as e2e:
        yield e2e


@pytest.fixture(scope="module")
def worker(stack: E2EStack) -> Iterator[ServiceRecord]:
    """One ``durafix worker`` process for the module's runs (each run has its own repository and resources)."""
    rec = stack.spawn_worker()
    try:
        yield rec
    finally:
        stack.stop_workers()


async def _running(client: Client, wf: str, activity_type: str, detail: str) -> PendingActivity | None:
    """The run's pending ``activity_type`` once it runs and its last heartbeat's detail contains ``detail``."""
    description = await runs.handle_for(client, wf).describe()
    for pending in await pending_activities(description):
        if pending.activity_type == activity_type and pending.state == "running" and detail in (pending.detail or ""):
            return pending
    return None


async def _wait_running(client: Client, wf: str, activity_type: str, detail: str) -> PendingActivity:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            found = await _running(client, wf, activity_type, detail)
            state = await runs.get_state(client, wf)
        except RPCError:  # the webhook may not have started the run yet
            await asyncio.sleep(0.5)
            continue
        if found is not None:
            return found
        assert state.outcome is None, f"the run ended before {activity_type} got to {detail!r}: {state.outcome_detail}"
        await asyncio.sleep(0.5)
    raise AssertionError(f"{wf}: {activity_type} never ran with {detail!r} in its heartbeat")


async def _cancelled_within_heartbeat(client: Client, wf: str, activity: str, heartbeat: float | None) -> RunState:
    """Cancels the run while ``activity`` runs: the run ends cancelled, and the activity saw the cancellation
    within its heartbeat (and a margin). The run's final state."""
    await runs.cancel(client, wf)
    final = await state_when(client, wf, finished, timeout_s=RUN_TIMEOUT_S)

    assert await runs.status_of(client, wf) == WorkflowExecutionStatus.CANCELED
    requested, canceled = await _cancellation_seen(client, wf, activity)
    assert heartbeat is not None
    assert (canceled - requested).total_seconds() <= heartbeat + CANCEL_MARGIN_S, (requested, canceled)
    return final


# How an activity task can end, each with the attributes of its event that name the scheduled task.
ACTIVITY_ENDS = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: "activity_task_canceled_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity_task_completed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity_task_failed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity_task_timed_out_event_attributes",
}


async def _cancellation_seen(client: Client, wf: str, activity_type: str) -> tuple[datetime, datetime]:
    """When the cancellation of the run's (last) ``activity_type`` was requested and when the activity ended
    cancelled, read from the workflow's history; the activity must have ended by acknowledging it."""
    history = await runs.handle_for(client, wf).fetch_history()
    scheduled = [
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == activity_type
    ]
    assert scheduled, f"{activity_type} was never scheduled"
    ours = scheduled[-1]
    requested = [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED
        and e.activity_task_cancel_requested_event_attributes.scheduled_event_id == ours
    ]
    ends = [
        (e.event_type, e)
        for e in history.events
        if e.event_type in ACTIVITY_ENDS and getattr(e, ACTIVITY_ENDS[e.event_type]).scheduled_event_id == ours
    ]
    assert len(requested) == 1, f"the cancellation of {activity_type} was requested {len(requested)} times"
    assert [EventType.Name(kind) for kind, _ in ends] == ["EVENT_TYPE_ACTIVITY_TASK_CANCELED"], (
        f"{activity_type} did not end by acknowledging its cancellation"
    )
    return requested[0].event_time.ToDatetime(), ends[0][1].event_time.ToDatetime()


def _is_page_renderer(argv: list[str]) -> bool:
    # Chromium rewrites a renderer's command line as one space-joined string; the browser's own WebUI has a
    # renderer of its own, which is not a page's.
    words = " ".join(argv).split()
    return bool(words) and is_chromium(words[0]) and "--type=renderer" in words and ("--top-chrome-webui" not in words)


def _renderers(worker: ServiceRecord) -> list[Proc]:
    """The page renderers of the worker's Chromium (a page's context closed, its renderer ends)."""
    return descendants(worker.pid, _is_page_renderer)


def _marked_for(wf: str, argv: tuple[str, ...]) -> list[int]:
    """PIDs of the processes marked for the run whose command line is ``argv``."""
    found = []
    for pid in owned_processes(wf):
        try:
            cmdline = tuple(a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a)
        except OSError:
            continue
        if cmdline == argv:
            found.append(pid)
    return found


def _durafix(stack: E2EStack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "--state-dir", str(stack.state_dir), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _resources(stack: E2EStack, wf: str) -> list[dict[str, Any]]:
    """What ``durafix resources --run`` lists for the run (exit 3: it owns nothing)."""
    listed = _durafix(stack, "resources", "--run", wf, "--json")
    if listed.returncode == 3:
        return []
    assert listed.returncode == 0, listed.stderr
    resources: list[dict[str, Any]] = json.loads(listed.stdout)["resources"]
    return resources


def _assert_cancelled_and_clean(stack: E2EStack, worker: ServiceRecord, final: RunState, wf: str) -> None:
    assert final.outcome == Outcome.CANCELLED, final.outcome_detail
    assert final.phase == Phase.DONE
    assert final.cleanup is not None and final.cleanup.complete, final.cleanup
    assert [m.step.value for m in final.cancellation][-1] == "cancelled"
    assert owned_processes(wf) == []
    assert _resources(stack, wf) == []
    workspaces = stack.state_dir / "workspaces" / path_key(wf)
    assert not workspaces.exists() or not [p for p in workspaces.iterdir() if p.is_dir()]
    wait_for(lambda: not _renderers(worker), 20, "the page's renderer to end with its closed context")


def waiting_report() -> tuple[str, str]:
    """The sample report, its procedure ending in a wait for an element the page never shows."""
    title, body = issue_text()
    fence = body.index("bug_present:")
    return title, body[:fence] + WAITING_STEPS + body[fence:]


async def test_a_reproduction_waiting_in_chromium_sees_the_cancellation_within_its_heartbeat(
    stack: E2EStack, worker: ServiceRecord
) -> None:
    client, _, _, wf = await stack.open_run(*waiting_report())

    await _wait_running(client, wf, "browser.reproduce", NEVER_THERE)
    wait_for(lambda: _renderers(worker), 30, "a renderer of the worker's Chromium showing the cart page")
    final = await _cancelled_within_heartbeat(client, wf, "browser.reproduce", RunPolicy.fast().browser.heartbeat)
    assert final.reproduction is None, "a cancelled reproduction must not be recorded as a finding"
    _assert_cancelled_and_clean(stack, worker, final, wf)


async def test_a_verification_running_the_tests_sees_the_cancellation_and_stops_them(
    stack: E2EStack, worker: ServiceRecord
) -> None:
    repository = stack.new_repository()
    recipe = (REPO_ROOT / "examples" / "cart" / "durafix.yaml").read_text()
    slow = recipe.replace("test: python3 -m unittest discover -s tests -t .", f"test: {json.dumps(SLOW_TESTS)}")
    assert slow != recipe
    stack.push_files(repository, {"durafix.yaml": slow}, "Tests wait on candidates")
    issue = stack.open_report(repository)
    client = await runs.connect(stack.config)
    wf = workflow_id_for(repository, issue)

    await _wait_running(client, wf, "env.verify_candidate", "running tests")
    sleeping = wait_for(lambda: _marked_for(wf, ("sleep", SLEEP_S)), 30, "the recipe's tests running for the run")
    final = await _cancelled_within_heartbeat(
        client, wf, "env.verify_candidate", RunPolicy.fast().environment.heartbeat
    )
    assert all(not Path(f"/proc/{pid}").exists() for pid in sleeping), "the test command outlived its activity"
    assert final.candidates and final.candidates[-1].tests_passed is None, "cancelled tests must not be a verdict"
    _assert_cancelled_and_clean(stack, worker, final, wf)


async def test_a_cleanup_that_cannot_remove_a_workspace_ends_incomplete_and_the_ticket_says_how_to_finish(
    stack: E2EStack, worker: ServiceRecord
) -> None:
    client, repository, issue, wf = await stack.open_run(*waiting_report())

    # The reproduction waits on the page, so the base environment and its workspace stay until the cancellation.
    await _wait_running(client, wf, "browser.reproduce", NEVER_THERE)
    env = (await runs.get_state(client, wf)).environment
    assert env is not None
    stuck = stack.state_dir / "workspaces" / path_key(wf) / path_key(env.op_id)
    assert stuck.is_dir(), f"the base environment's workspace is not at {stuck}"
    # Immutable: nothing in it can be removed, by the worker or anyone else, until the flag is cleared.
    subprocess.run(["chattr", "+i", str(stuck)], check=True)
    try:
        await runs.cancel(client, wf)
        final = await state_when(client, wf, finished, timeout_s=RUN_TIMEOUT_S)
        assert final.outcome == Outcome.CLEANUP_INCOMPLETE, final.outcome_detail
        assert final.cancellation[-1].step.value == "cleanup-incomplete"
        cleanup = final.cleanup
        assert cleanup is not None and cleanup.status == CleanupStatus.INCOMPLETE, cleanup
        assert len(cleanup.remaining) == 1 and cleanup.remaining[0].startswith("workspace:"), cleanup.remaining
        left = cleanup.remaining[0]
        assert left in final.outcome_detail
        # The app it served is stopped all the same: only the workspace remains, and the inventory says so.
        assert owned_processes(wf) == []
        assert [(r["kind"], r["resource_id"]) for r in _resources(stack, wf)] == [tuple(left.split(":", 1))]

        assert final.ticket is not None and final.ticket.comment_id is not None
        ticket = stack.github().get_repo(repository).get_issue(issue).get_comment(final.ticket.comment_id).body
        assert "cleanup incomplete" in ticket, ticket
        assert f"`{left}`" in ticket, ticket
        assert f"durafix cleanup --run '{wf}' --yes" in ticket, ticket
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)

    # Doing what the ticket says, once the cause is gone, finishes the cleanup.
    cleaned = _durafix(stack, "cleanup", "--run", wf, "--yes")
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert _resources(stack, wf) == []
    assert not stuck.exists()
