"""repair_bug end to end on the real parts: Temporal dev server, the GitHub emulator over HTTP (webhooks
included), real git, Debian Chromium, the scripted model server over HTTP, local processes for the app.

Assertions are about external truth read back from the forge (tickets, branches, PRs, comments, the merged
tree) and the machine (processes, workspaces), not only the workflow's own state.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory

from browser.procedure import Procedure
from infra import processes
from infra.cli.demo import issue_text
from pipeline import client as runs
from pipeline.flow.attempt_carry import ATTEMPT_WORKFLOW
from pipeline.ids import branch_for, workflow_id_for
from pipeline.services import Services
from pipeline.state import Outcome, Phase, Rejection, RunState, TriageReason
from pipeline.worker.tmp_root import PREFIX as TMP_PREFIX
from pipeline.worker.tmp_root import TmpRoot
from tests.replay.record import record_history
from tests.support.durafix_cli import run_durafix
from tests.support.e2e_stack import (
    NEVER_FIXABLE,
    REPO_ROOT,
    E2EStack,
    footprint,
    kill,
    one_of_each,
    owned_processes,
    run_workspaces,
    wait_for,
)
from tests.support.metrics_text import Exposition, named_metrics, scrape
from tests.support.tmp_dirs import passable_tmp

pytestmark = [pytest.mark.slow, pytest.mark.browser]

RUN_TIMEOUT_S = 300


async def state_when(client: Client, workflow_id: str, predicate: Any, timeout_s: float = RUN_TIMEOUT_S) -> RunState:
    """Poll the run's state until ``predicate(state, status)`` holds."""
    last: RunState | None = None
    async for status, last in runs.polled_states(client, workflow_id, time.monotonic() + timeout_s):
        if predicate(last, status):
            return last
    raise AssertionError(f"{workflow_id}: condition not met in {timeout_s}s; last state {last!r}")


def finished(_: RunState, status: WorkflowExecutionStatus | None) -> bool:
    return status is not None and status != WorkflowExecutionStatus.RUNNING


def awaiting_review(state: RunState, status: WorkflowExecutionStatus | None) -> bool:
    return state.pending_approval is not None or finished(state, status)


def file_on_main(stack: E2EStack, repository: str, path: str) -> str:
    """A file of ``main`` as a real git clone over the emulator's smart HTTP sees it."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            ["git", "clone", "-q", "--depth", "1", stack.config.clone_url(repository), tmp],
            check=True,
            capture_output=True,
        )
        return (Path(tmp) / path).read_text()


def redeliver_review_webhooks(stack: E2EStack, repository: str) -> list[int]:
    """Redeliver every pull_request_review delivery through GitHub's hook-delivery API; the statuses."""
    gh_api = stack.config.forge_api_url
    owner_token = stack.owner_token()

    def call(method: str, path: str, tok: str) -> Any:
        req = urllib.request.Request(f"{gh_api}{path}", method=method, headers={"Authorization": f"token {tok}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return json.loads(raw) if raw else None

    hooks = call("GET", f"/repos/{repository}/hooks", owner_token)
    statuses = []
    for hook in hooks:
        for d in call("GET", f"/repos/{repository}/hooks/{hook['id']}/deliveries", owner_token):
            if d["event"] == "pull_request_review":
                call("POST", f"/repos/{repository}/hooks/{hook['id']}/deliveries/{d['id']}/attempts", owner_token)
                statuses.append(d["status_code"])
    return statuses


@pytest.fixture
def worker_tmp() -> Iterator[Path]:
    """A temporary directory of its own for a test's workers (their ``TMPDIR``), where nothing else makes files."""
    with passable_tmp("e2e-worker-tmp-") as tmp:
        yield tmp


@pytest.fixture
def stack_with_metered_worker(e2e_stack: E2EStack, worker_tmp: Path) -> Iterator[E2EStack]:
    """A worker serving ``/metrics`` (``DURAFIX_METRICS_PORT``) at its record's ``url``, its ``TMPDIR``
    ``worker_tmp``."""
    e2e_stack.spawn_worker(metrics_port=processes.free_port(), extra_env={"TMPDIR": str(worker_tmp)})
    try:
        yield e2e_stack
    finally:
        e2e_stack.stop_workers()


def temporary_entries(tmp: Path) -> list[str]:
    """What worker processes left in their temporary directory ``tmp`` (names, sorted)."""
    return sorted(p.name for p in tmp.iterdir())


def worker_roots(tmp: Path) -> list[TmpRoot]:
    """The worker processes' temporary roots in ``tmp`` (:mod:`pipeline.worker.tmp_root`)."""
    return [TmpRoot(p) for p in sorted(tmp.iterdir()) if p.name.startswith(TMP_PREFIX)]


def live_roots_only(tmp: Path, how_many: int) -> list[TmpRoot] | None:
    """The roots in ``tmp`` once there are ``how_many`` and each belongs to a live process (nothing else there)."""
    found = worker_roots(tmp)
    alone = len(found) == len(temporary_entries(tmp))
    return found if alone and len(found) == how_many and all(r.owner_running() for r in found) else None


async def test_happy_path_through_webhooks_merges_once_and_leaves_one_of_each(
    stack_with_metered_worker: E2EStack, worker_tmp: Path
) -> None:
    stack = stack_with_metered_worker
    client, repository, issue, wf = await stack.open_run()

    state = await state_when(client, wf, awaiting_review)
    assert state.pending_approval is not None, state.outcome_detail
    # The worker's /metrics while the run waits for its review: the SDK's own metrics, the run started once,
    # parked in review, not ended.
    # The open runs are listed every 15 s: the parked run shows within one listing.
    during = wait_for(lambda: parked_in_metrics(stack), 60, "the parked run in the worker's /metrics")
    assert during.values("temporal_num_pollers", task_queue="durafix-orchestration", poller_type="workflow_task")
    assert during.total("durafix_runs_started_total") == 1
    assert during.values("durafix_run_phase_age_max_seconds", phase="awaiting-review")
    assert during.total("durafix_runs_ended_total") == 0
    assert state.reproduction is not None and state.reproduction.status == "reproduced"
    head = state.pending_approval.head_sha

    reviewer = stack.github(stack.reviewer_token).get_repo(repository)
    pr = reviewer.get_pull(state.pending_approval.pr_number)
    assert pr.head.sha == head and pr.draft
    pr.create_review(commit=reviewer.get_commit(head), event="APPROVE", body="LGTM")

    final = await state_when(client, wf, finished)
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    assert final.approval is not None and final.approval.head_sha == head and final.approval.source == "webhook"

    # The same approval delivered again (a redelivery through the hook-delivery API) changes nothing.
    assert redeliver_review_webhooks(stack, repository)
    time.sleep(2)
    repo = stack.github().get_repo(repository)
    merged = repo.get_pull(pr.number)
    assert merged.merged and merged.merge_commit_sha == final.merged_sha
    assert repo.get_branch("main").commit.sha == final.merged_sha
    assert "line_total(item) for item in items" in file_on_main(stack, repository, "cart.py")

    fp = footprint(stack, repository, wf, issue)
    assert len(fp.tickets) == 1
    assert fp.pull_requests == [pr.number]
    assert len(fp.evidence_comments) == 1
    assert fp.branches == [branch_for(wf)]
    assert final.ticket is not None and final.ticket.comment_id is not None
    assert "merged" in repo.get_issue(issue).get_comment(final.ticket.comment_id).body

    assert {r.kind for r in final.evidence} >= {"trace", "screenshot", "patch", "manifest", "report"}
    assert owned_processes(wf) == []
    assert run_workspaces(stack, wf) == []
    assert_metrics_after_one_merged_run(stack, wf, repository, (await client.get_workflow_handle(wf).describe()).run_id)
    # The stack's worker was started with --no-spare: in all this time its supervisor started no second child.
    assert "(spare)" not in Path(stack.workers[0].log).read_text()
    history = await client.get_workflow_handle(wf).fetch_history()
    # Forge writes off the critical path: the ticket update once the base reproduced is sent with the repair
    # attempt (the baseline ran beside the base reproduction), the evidence built while the branch is pushed
    # (each pair scheduled by one workflow task), and the ticket is written once between publishing and asking
    # for the review, not twice.
    together = scheduled_together(history)
    assert {"forge.update_ticket", f"child:{ATTEMPT_WORKFLOW}"} in together, together
    assert {"evidence.build", "forge.publish_branch"} in together, together
    names = [sorted(batch) for batch in together]
    commented = next(i for i, batch in enumerate(together) if "forge.ensure_comment" in batch)
    merging = next(i for i, batch in enumerate(together) if "forge.read_pr" in batch)
    assert [b for b in together[commented:merging] if "forge.update_ticket" in b] == [{"forge.update_ticket"}], names
    # Recorded since runs have a baseline and update the ticket at the review wait ("happy-path" is older).
    record_history(history, "happy-path-baseline")
    record_history(history, "forge-writes-behind")

    # Everything the worker's processes made in their temporary directory is in their two roots (the supervisor's
    # and its child's, which reproduced in Chromium and ran git; beside them only Playwright's folders, the driver's
    # own, which go as the worker closes the browser), and a normal stop removes them all.
    tmp = worker_tmp
    live = worker_roots(tmp)
    assert len(live) == 2 and all(r.owner_running() for r in live), temporary_entries(tmp)
    inside = {p.name.rsplit("-", 1)[0] for root in live for p in root.path.iterdir()}
    assert {"durafix-chromium", "durafix-git-home", "durafix-sandbox-etc"} <= inside, inside
    stack.stop_workers()
    assert temporary_entries(tmp) == []


def scheduled_together(history: WorkflowHistory) -> list[set[str]]:
    """The activities (step names) and child workflows (``child:TYPE``) each workflow task started, in history
    order: a set per task."""
    batches: dict[int, set[str]] = {}
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            batches.setdefault(attrs.workflow_task_completed_event_id, set()).add(attrs.activity_type.name)
        elif event.HasField("start_child_workflow_execution_initiated_event_attributes"):
            child = event.start_child_workflow_execution_initiated_event_attributes
            batches.setdefault(child.workflow_task_completed_event_id, set()).add(f"child:{child.workflow_type.name}")
    return [batches[key] for key in sorted(batches)]


def parked_in_metrics(stack: E2EStack) -> Exposition | None:
    """The worker's /metrics once they count a run parked waiting for its review."""
    metrics = scrape(stack.workers[0].url)
    return metrics if metrics.total("durafix_runs_awaiting_review") >= 1 else None


def assert_metrics_after_one_merged_run(stack: E2EStack, wf: str, repository: str, run_id: str) -> None:
    """The worker's /metrics once the run merged (and its review webhooks were delivered again): its outcome
    counted once, its phases' durations observed, the SDK's task latencies there, no label naming the run or
    its repository, and every metric the shipped alert rules and dashboard query exported by the worker or
    the receiver."""
    after = scrape(stack.workers[0].url)
    assert after.values("durafix_runs_ended_total", outcome="merged") == [1.0]
    assert after.total("durafix_runs_ended_total") == 1
    assert after.total("durafix_runs_started_total") == 1
    for phase in ("reproduce", "repair", "verify", "awaiting-review", "merge"):
        assert after.total("durafix_run_phase_duration_seconds_count", phase=phase) >= 1, phase
    assert after.total("durafix_run_phase_duration_seconds_sum", phase="awaiting-review") > 0
    assert after.total("durafix_repair_attempts_total", verification="passed") >= 1
    assert after.total("durafix_step_duration_seconds_count", step="forge.merge", result="ok") >= 1
    assert after.total("temporal_activity_schedule_to_start_latency_seconds_count") > 0
    assert after.total("temporal_workflow_task_schedule_to_start_latency_seconds_count") > 0
    for value in after.label_values():
        assert wf not in value and run_id not in value and repository not in value, value
    receiver = scrape(f"http://127.0.0.1:{stack.receiver.port}/metrics")
    assert named_metrics() - after.names - receiver.names == set()


async def test_report_that_does_not_reproduce_ends_in_triage_without_pr(stack_with_worker: E2EStack) -> None:
    stack = stack_with_worker
    # A report claiming the total should read $23.75: that is what the page shows, so nothing reproduces.
    _, body = issue_text()
    body = body.replace("not_equals: $40.00", "not_equals: $23.75")
    client, repository, issue, wf = await stack.open_run(title="Cart total should be $23.75", body=body)

    final = await state_when(client, wf, finished)
    assert final.outcome == Outcome.NEEDS_HUMAN_TRIAGE, final.outcome_detail
    assert final.reproduction is not None and final.reproduction.status == "not_reproduced"
    assert final.candidates == []
    fp = footprint(stack, repository, wf, issue)
    assert fp.pull_requests == [] and fp.branches == []
    assert len(fp.tickets) == 1
    repo = stack.github().get_repo(repository)
    assert final.ticket is not None and final.ticket.comment_id is not None
    assert "needs human triage" in repo.get_issue(issue).get_comment(final.ticket.comment_id).body
    assert owned_processes(wf) == []
    record_history(await client.get_workflow_handle(wf).fetch_history(), "not-reproduced")


async def test_repair_that_never_verifies_exhausts_the_budget_without_pr(stack_with_worker: E2EStack) -> None:
    stack = stack_with_worker
    title, body = issue_text()
    client, repository, issue, wf = await stack.open_run(title=f"{title} ({NEVER_FIXABLE})", body=body)

    final = await state_when(client, wf, finished)
    assert final.outcome == Outcome.REPAIR_BUDGET_EXHAUSTED, final.outcome_detail
    assert len(final.candidates) == 2
    assert all(c.verification == "failed" for c in final.candidates)
    fp = footprint(stack, repository, wf, issue)
    assert fp.pull_requests == [] and fp.branches == []
    assert owned_processes(wf) == []
    assert run_workspaces(stack, wf) == []
    record_history(await client.get_workflow_handle(wf).fetch_history(), "budget-exhausted")


@pytest.mark.timeout(600)
async def test_workers_killed_after_forge_mutations_leave_exactly_one_of_each(
    e2e_stack: E2EStack, tmp_path: Path, worker_tmp: Path
) -> None:
    """SIGKILL right after the forge accepted the ticket, the push and the PR (before each activity
    completed); fresh workers finish the run, and the forge holds exactly one of each. The killed processes'
    temporary roots are removed by whoever outlives them, a live worker's never."""
    stack = e2e_stack
    kills = ["ensure_ticket", "publish_branch", "ensure_draft_pr"]
    tmp = worker_tmp
    kill_dir = tmp_path / "kills"
    own_tmp = {"TMPDIR": str(tmp)}
    worker = stack.spawn_worker(kill_after=kills, kill_dir=kill_dir, extra_env=own_tmp)
    try:
        client, repository, issue, wf = await stack.open_run()
        deadline = time.monotonic() + RUN_TIMEOUT_S * 2
        state: RunState | None = None
        while time.monotonic() < deadline:
            if not processes.is_alive(worker):
                # Each kill costs one worker; more deaths than kills means workers die for another reason.
                assert len(stack.workers) <= len(kills) + 1, processes.log_tail(Path(worker.log))
                worker = stack.spawn_worker(kill_after=kills, kill_dir=kill_dir, extra_env=own_tmp)
            try:
                state = await runs.get_state(client, wf)
            except Exception:
                await asyncio.sleep(0.5)
                continue
            if state.pending_approval is not None or state.outcome is not None:
                break
            await asyncio.sleep(0.5)
        assert state is not None and state.pending_approval is not None, state
        assert sorted(p.name for p in kill_dir.iterdir()) == sorted(kills)
        # Each SIGKILLed child's root (one of them reproduced in Chromium and pushed) is gone, removed by its
        # supervisor; the supervisor's and its polling child's are there.
        live = wait_for(lambda: live_roots_only(tmp, 2), 30, "the killed children's temporary roots removed")
        # The whole worker killed: no code of its own runs, so its roots stay until the next worker starts, which
        # removes them and not its own (nor any other live worker's).
        kill(worker)
        wait_for(lambda: not any(r.owner_running() for r in live), 15, "the killed worker's processes gone")
        assert worker_roots(tmp) == live
        stack.spawn_worker(extra_env=own_tmp)
        fresh = wait_for(lambda: live_roots_only(tmp, 2), 60, "the next worker's start removing the dead roots")
        assert not {r.path for r in fresh} & {r.path for r in live}
        stack.approve_on_forge(repository, state.pending_approval.pr_number, state.pending_approval.head_sha)
        final = await state_when(client, wf, finished)
    finally:
        stack.stop_workers()
    assert temporary_entries(tmp) == []
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    one_of_each(stack, repository, wf, issue)
    repo = stack.github().get_repo(repository)
    mine = [c for c in repo.get_issue(issue).get_comments() if "durafix:ticket" in c.body]
    assert len(mine) == 1
    assert len([p for p in repo.get_pulls(state="all")]) == 1
    record_history(await client.get_workflow_handle(wf).fetch_history(), "killed-workers")


async def test_cancellation_removes_every_owned_process_and_workspace(stack_with_worker: E2EStack) -> None:
    stack = stack_with_worker
    client, repository, issue, wf = await stack.open_run()

    def env_live(state: RunState, status: WorkflowExecutionStatus | None) -> bool:
        return (state.environment is not None and state.environment.last_status == "ready") or finished(state, status)

    await state_when(client, wf, env_live)
    wait_for(lambda: owned_processes(wf), 30, "the app process of the run")
    await runs.cancel(client, wf)
    final = await state_when(client, wf, finished)
    assert await runs.status_of(client, wf) == WorkflowExecutionStatus.CANCELED, final
    assert final.outcome == Outcome.CANCELLED, final.outcome_detail
    assert final.phase == Phase.DONE
    assert final.cleanup is not None and final.cleanup.complete and final.cleanup.removed >= 1
    assert [m.step.value for m in final.cancellation][-1] == "cancelled"
    assert "preserving-required-evidence" in [m.step.value for m in final.cancellation]
    # What it preserved is in the store, intact, and the ticket on the forge reports the cancellation.
    store = Services(stack.config).store
    assert final.evidence, "the run recorded no evidence before it was cancelled"
    for ref in final.evidence:
        assert hashlib.sha256(store.read_bytes(ref)).hexdigest() == ref.sha256, ref.name
    assert final.ticket is not None and final.ticket.comment_id is not None
    ticket = stack.github().get_repo(repository).get_issue(issue).get_comment(final.ticket.comment_id)
    assert "outcome: **cancelled**" in ticket.body, ticket.body
    assert "evidence kept in the store" in ticket.body, ticket.body
    assert owned_processes(wf) == []
    assert run_workspaces(stack, wf) == []
    record_history(await client.get_workflow_handle(wf).fetch_history(), "cancelled")


async def test_report_in_prose_gets_a_drafted_procedure_and_a_rejection_ends_the_run(
    stack_with_worker: E2EStack,
) -> None:
    stack = stack_with_worker
    title, body = issue_text()
    prose = body[: body.index("```durafix-repro")].strip() + "\n"
    client, repository, issue, wf = await stack.open_run(title=title, body=prose)

    state = await state_when(client, wf, awaiting_review)
    assert state.pending_approval is not None, state.outcome_detail
    assert state.reproduction is not None and state.reproduction.status == "reproduced"
    assert state.reproduction.procedure_ref.name == "drafted-procedure.json"
    # The draft the run reproduced with is a valid procedure, as stored.
    Procedure.model_validate_json(Services(stack.config).store.read_bytes(state.reproduction.procedure_ref))
    assert state.budgets.model_prompt_tokens > 0
    await runs.reject(client, wf, Rejection(reviewer="reviewer", reason="not the fix we want"))
    final = await state_when(client, wf, finished)
    assert final.outcome == Outcome.REJECTED, final.outcome_detail
    assert "not the fix we want" in final.outcome_detail
    repo = stack.github().get_repo(repository)
    assert not repo.get_pull(state.pending_approval.pr_number).merged
    assert final.ticket is not None and final.ticket.comment_id is not None
    assert "outcome: **rejected" in repo.get_issue(issue).get_comment(final.ticket.comment_id).body
    assert owned_processes(wf) == []
    record_history(await client.get_workflow_handle(wf).fetch_history(), "drafted-procedure-rejected")


def chat_requests(log_url: str) -> int:
    """The chat completions the scripted model server answered: what asking the model is (a worker's start
    probes ``GET /v1/models``, which asks nothing)."""
    return sum(r["path"] == "/v1/chat/completions" for r in httpx.get(log_url, timeout=10).json())


@dataclass
class RecipeRun:
    """A run of a fresh repository whose recipe was changed, once it ended: what the tests of a broken recipe
    read back (the ticket from the forge, whether the model was asked since the report was opened)."""

    stack: E2EStack
    client: Client
    repository: str
    issue: int
    wf: str
    final: RunState
    model_requests: str
    asked_before: int

    def tickets(self) -> list[str]:
        """The bodies of the run's ticket comments on the report, as the forge has them."""
        comments = self.stack.github().get_repo(self.repository).get_issue(self.issue).get_comments()
        return [c.body for c in comments if self.wf in (c.body or "")]

    def model_asked(self) -> bool:
        """Whether the model server answered a chat request since the report was opened (the tests of this
        module run one at a time on one worker: every request since is this run's)."""
        return chat_requests(self.model_requests) != self.asked_before


async def run_with_recipe(stack: E2EStack, recipe: str, message: str) -> RecipeRun:
    """Push ``recipe`` as a fresh repository's ``durafix.yaml``, open a report and wait for the run to end."""
    repository = stack.new_repository()
    stack.push_files(repository, {"durafix.yaml": recipe}, message)
    model_requests = f"{stack.config.model_base_url.removesuffix('/v1')}/_admin/requests"
    asked_before = chat_requests(model_requests)
    client = await runs.connect(stack.config)
    issue = stack.open_report(repository)
    wf = workflow_id_for(repository, issue)
    final = await state_when(client, wf, finished)
    return RecipeRun(stack, client, repository, issue, wf, final, model_requests, asked_before)


async def test_a_recipe_whose_tests_cannot_run_ends_in_triage_before_any_model_request(
    stack_with_worker: E2EStack,
) -> None:
    """The baseline finds a missing test command on the base revision: the reason is on the ticket, no repair
    attempt was made and the model was never asked."""
    stack = stack_with_worker
    recipe = (REPO_ROOT / "examples" / "cart" / "durafix.yaml").read_text()
    broken = re.sub(r"^test: .*$", "test: no-such-test-runner --all", recipe, flags=re.MULTILINE)
    assert broken != recipe
    run = await run_with_recipe(stack, broken, "Test runner renamed")
    final, wf = run.final, run.wf

    assert final.outcome == Outcome.NEEDS_HUMAN_TRIAGE, final.outcome_detail
    assert "cannot run on the base revision" in final.outcome_detail
    assert final.baseline is not None and not final.baseline.runnable and "exit 127" in final.baseline.summary
    assert final.candidates == [] and final.budgets.repair_attempts_used == 0
    ticket = run.tickets()
    assert len(ticket) == 1 and "cannot run on the base revision" in ticket[0], ticket
    # The environment reason, the command and the hint naming the program (a word of the recipe's command).
    assert final.triage is not None and final.triage.reason == TriageReason.ENVIRONMENT_NOT_SET_UP, final.triage
    assert final.triage.environment is not None and final.triage.environment.cause == "command-not-found"
    assert "`environment-not-set-up`" in ticket[0], ticket
    assert "failed: tests command `no-such-test-runner --all` exited 127" in ticket[0], ticket
    assert "hint: `no-such-test-runner` was not found" in ticket[0], ticket
    # What the shell printed is evidence in the store, never quoted on the public ticket.
    log = Services(stack.config).store.read_bytes(final.baseline.test_output_ref).decode()
    assert "no-such-test-runner" in log and "not found" in log
    assert "no-such-test-runner: not found" not in ticket[0] and "baseline-tests.log" in ticket[0]
    assert not run.model_asked(), "the model was asked"
    assert footprint(stack, run.repository, wf, run.issue).pull_requests == []
    record_history(await run.client.get_workflow_handle(wf).fetch_history(), "baseline-cannot-run")


# Fails in the sandbox for real: with no network pip reaches no index, at once (no retries).
OFFLINE_SETUP = "python3 -m pip download --retries 0 --no-deps --dest .downloads six"


async def test_a_setup_without_network_ends_naming_its_cause_before_any_model_request(
    stack_with_worker: E2EStack,
) -> None:
    """A recipe whose setup downloads a package without `setup_network: true`: the run ends in triage with the
    environment reason (not "did not reproduce"), the failed command, a link to its stored log and the
    `setup_network` hint, on the ticket read back from the forge and in `durafix status`; the model was never
    asked and no procedure ran."""
    stack = stack_with_worker
    recipe = (REPO_ROOT / "examples" / "cart" / "durafix.yaml").read_text()
    offline = recipe.replace("setup: []", f"setup:\n  - {OFFLINE_SETUP}")
    assert offline != recipe and "setup_network" not in offline
    run = await run_with_recipe(stack, offline, "Download a package in setup")
    final, wf = run.final, run.wf

    assert final.outcome == Outcome.NEEDS_HUMAN_TRIAGE, final.outcome_detail
    assert final.triage is not None and final.triage.reason == TriageReason.ENVIRONMENT_NOT_SET_UP, final.triage
    failed = final.triage.environment
    assert failed is not None and (failed.stage, failed.command, failed.exit_code) == ("setup", OFFLINE_SETUP, 1)
    assert failed.cause == "no-setup-network" and failed.log_ref is not None and failed.log_url, failed
    assert final.reproduction is not None and final.reproduction.status == "app_not_ready"
    assert final.reproduction.trace_refs == [] and final.candidates == [] and final.baseline is None
    # The stored log holds what pip printed; the ticket links it and quotes none of it.
    log = Services(stack.config).store.read_bytes(failed.log_ref).decode()
    assert "(from versions: none)" in log, log
    ticket = run.tickets()
    assert len(ticket) == 1, ticket
    body = ticket[0]
    assert "needs human triage" in body and "`environment-not-set-up`" in body, body
    assert "did not reproduce" not in body, body
    assert (
        f"so the report was not tried: setup command `{OFFLINE_SETUP}` exited 1; its output is in environment.log"
        in body
    ), body
    assert f"failed: setup command `{OFFLINE_SETUP}` exited 1" in body, body
    assert f"[environment.log]({failed.log_url})" in body and failed.log_ref.sha256 in body, body
    assert "hint: setup has no network" in body and "`setup_network: true`" in body, body
    assert "from versions: none" not in body, body
    # The link opens the stored log (the evidence server, as the evidence comment's links do).
    assert "(from versions: none)" in httpx.get(failed.log_url, timeout=10).text
    # `durafix status` says the same.
    status = run_durafix(stack.state_dir, "status", wf)
    assert status.returncode == 0, status.stderr
    assert "reason     environment-not-set-up" in status.stdout, status.stdout
    assert f"failed     setup command `{OFFLINE_SETUP}` exited 1" in status.stdout, status.stdout
    assert "hint       setup has no network" in status.stdout and failed.log_ref.key in status.stdout
    assert not run.model_asked(), "the model was asked"
    assert footprint(stack, run.repository, wf, run.issue).pull_requests == []
    record_history(await run.client.get_workflow_handle(wf).fetch_history(), "setup-without-network")
