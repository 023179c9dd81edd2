"""The reconciler on the real Temporal dev server and the project's GitHub emulator over HTTP.

Each test gets a fresh repository owned by ``acme`` with ``durafix-bot`` (the reconciler's token, push),
``maintainer`` (push), ``triager`` (triage) and ``reader`` (read) as collaborators, the trigger label, and a
webhook pointing at a receiver that has stopped: every delivery the emulator makes for it fails, which is the
loss the reconciler recovers from (the lost-trigger test also hooks a running receiver, which answers 503
because the forge cannot tell it the labeller's role). The tests assert those failed deliveries through the
emulator's deliveries API, then run a pass.

A run that must be awaiting review is the real workflow, started the real way, with the recording activity
doubles of ``tests/integration/workflow/test_workflow_logic.py`` except that its PR is the bot's real PR on the emulator
(its number and head): the reviews, the PR's head and the issue the reconciler reads are the forge's own.
"""

from __future__ import annotations

import asyncio
import io
import math
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from infra.processes import free_port
from pipeline import client as runs
from pipeline import steps
from pipeline.cli import run_command
from pipeline.config import DurafixConfig
from pipeline.ids import branch_for
from pipeline.inputs import PinnedReport
from pipeline.ops import forge_setup
from pipeline.ops.reconciler import Reconciler, ReconcileReport, reconcile_once, start_in_background
from pipeline.policies import RunPolicy
from pipeline.receiver.webhooks import WebhookReceiver
from pipeline.services import Services
from pipeline.state import Approval, HeadPush, Outcome, Phase, Rejection, RunState
from pipeline.steps import PullInfo, ReadPullInput, TaskQueue, VerifyInput, VerifyResult
from pipeline.workflow import WORKFLOWS
from tests.integration.workflow.test_workflow_logic import Script, doubles
from tests.support import security_harness as harness
from tests.support.forge import branch_with, commit_files
from tests.support.forge_logins import BOT, MAINTAINER, OWNER, READER, TRIAGER, TRIGGER
from tests.support.metrics_text import scrape
from tests.support.run_history import started_input
from tests.support.security_harness import Forge, config, forge, hooked_repository, serving
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow]
__all__ = ["config", "forge"]  # fixtures shared with the security tests' harness

DECISIONS = (
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED,
)


class Site(harness.Site):
    """One fresh repository whose webhook goes to a stopped receiver, and the runs its test touched."""

    def failed_deliveries(self, event: str, action: str) -> list[dict[str, Any]]:
        """This repository's deliveries of ``event``/``action`` (all sent by now); each asserted failed."""
        found = self.deliveries(event, action)
        for d in found:
            assert not 200 <= d["status_code"] < 300, d
        return found

    def labelled_issue(self, opener: str, labeller: str | None = TRIAGER) -> int:
        issue = self.repo(opener).create_issue(title="Cart total is wrong", body="Add two items; see one price.")
        if labeller is not None:
            self.repo(labeller).get_issue(issue.number).add_to_labels(TRIGGER)
        return issue.number


@pytest.fixture(scope="module")
def stopped_receiver_url(config: DurafixConfig) -> str:
    """The URL of a receiver that ran and stopped: nothing answers there any more."""
    receiver = WebhookReceiver(config, "127.0.0.1", 0)
    receiver.start()
    url = receiver.url
    receiver.stop()
    return url


@pytest.fixture(scope="module")
def live_receiver(config: DurafixConfig) -> Iterator[WebhookReceiver]:
    with serving(config) as receiver:
        yield receiver


@pytest.fixture
async def site(
    forge: Forge, config: DurafixConfig, stopped_receiver_url: str, temporal_client: Client
) -> AsyncIterator[Site]:
    full_name = hooked_repository(forge, stopped_receiver_url, config.webhook_secret)
    s = Site(forge, config, stopped_receiver_url, temporal_client, full_name)
    try:
        yield s
    finally:
        forge.handle.clear_faults()
        for workflow_id in s.touched:
            if await status(temporal_client, workflow_id) == WorkflowExecutionStatus.RUNNING:
                await temporal_client.get_workflow_handle(workflow_id).terminate("reconciler test over")
            # Visibility lags the end on the dev server: a run it still lists as running would be the next
            # test's reconciler's to query (with no worker left to answer) and to look up on a forge now gone.
            await visible(temporal_client, workflow_id, running=False)


async def status(client: Client, workflow_id: str) -> WorkflowExecutionStatus | None:
    try:
        return await runs.status_of(client, workflow_id)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


async def visible(client: Client, workflow_id: str, *, running: bool = True) -> None:
    """Until Temporal's visibility lists ``workflow_id`` as running (it lags a start on the dev server), or, with
    ``running=False``, no longer lists it so (it lags an end too)."""
    query = f'WorkflowId="{workflow_id}" AND ExecutionStatus="Running"'

    async def as_wanted() -> bool:
        return any([wf.id async for wf in client.list_workflows(query)]) == running

    await eventually(as_wanted, 30, f"{workflow_id} {'' if running else 'no longer '}listed as running")


async def decisions(client: Client, workflow_id: str) -> list[Any]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [ev for ev in history.events if ev.event_type in DECISIONS]


async def signals(client: Client, workflow_id: str, name: str, kind: type[Any]) -> list[Any]:
    found: list[Any] = []
    for event in await decisions(client, workflow_id):
        attrs = event.workflow_execution_signaled_event_attributes
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED and attrs.signal_name == name:
            found += await client.data_converter.decode(attrs.input.payloads, [kind])
    return found


async def approvals(client: Client, workflow_id: str) -> list[Approval]:
    found: list[Approval] = []
    for event in await decisions(client, workflow_id):
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            found += await client.data_converter.decode(request.input.args.payloads, [Approval])
    return found


# ---- a run awaiting review of the bot's real PR -----------------------------------------------------------


def pr_doubles(script: Script, pr_number: int, head: str) -> dict[TaskQueue, list[Callable[..., Any]]]:
    """The recording doubles, except that the run's PR is ``pr_number`` at ``head`` (the forge's)."""
    queues = doubles(script)
    by_name = {fn.__name__: fn for acts in queues.values() for fn in acts}

    @activity.defn(name=steps.VERIFY_CANDIDATE.name)
    async def verify(i: VerifyInput) -> VerifyResult:
        result: VerifyResult = await by_name["verify"](i)
        return result if ":revision-verify:" in i.op_id else result.model_copy(update={"commit": head})

    @activity.defn(name=steps.ENSURE_DRAFT_PR.name)
    async def ensure_draft_pr(i: Any) -> PullInfo:
        result: PullInfo = await by_name["ensure_draft_pr"](i)
        return result.model_copy(update={"number": pr_number, "head_sha": head})

    @activity.defn(name=steps.READ_PR.name)
    async def read_pr(i: ReadPullInput) -> PullInfo:
        result: PullInfo = await by_name["read_pr"](i)
        return result.model_copy(update={"number": pr_number, "head_sha": head})

    ours: dict[str, Callable[..., Any]] = {"verify": verify, "ensure_draft_pr": ensure_draft_pr, "read_pr": read_pr}
    return {queue: [ours.get(fn.__name__, fn) for fn in acts] for queue, acts in queues.items()}


@asynccontextmanager
async def workers(client: Client, queues: dict[TaskQueue, list[Callable[..., Any]]]) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(
            Worker(client, task_queue=TaskQueue.ORCHESTRATION.value, workflows=list(WORKFLOWS))
        )
        for queue, acts in queues.items():
            await stack.enter_async_context(Worker(client, task_queue=queue.value, activities=acts))
        yield


@dataclass(frozen=True)
class Parked:
    workflow_id: str
    issue: int
    pr: int
    head: str
    script: Script


@asynccontextmanager
async def parked_run(site: Site) -> AsyncIterator[Parked]:
    """A triager-labelled issue, the bot's ready PR for its run, and the run awaiting review of its head."""
    issue = site.labelled_issue(MAINTAINER, TRIAGER)
    workflow_id = site.run_id(issue)
    branch = branch_for(workflow_id)
    head = branch_with(site.repo(BOT), branch, {"cart.py": "total = sum(p * q for p, q in items)\n"})
    with Services(site.config).forge(site.repository) as adapter:
        pr = adapter.ensure_draft_pr(workflow_id, branch, "main", "Fix the cart total", "The fix.")
        adapter.mark_ready_for_review(pr.number)
    script = Script(head=head)
    async with workers(site.client, pr_doubles(script, pr.number, head)):
        report = PinnedReport(title="Cart total is wrong", body="", author=MAINTAINER, triggered_by=TRIAGER)
        await runs.start_run(
            site.client, site.config, site.repository, issue, trigger="test", policy=RunPolicy.fast(), report=report
        )

        async def awaiting() -> RunState | None:
            state = await runs.get_state(site.client, workflow_id)
            return state if state.phase == Phase.AWAITING_REVIEW else None

        state = await eventually(awaiting, 30, f"{workflow_id} to await review")
        assert state.pending_approval is not None and state.pending_approval.head_sha == head
        await visible(site.client, workflow_id)
        yield Parked(workflow_id, issue, pr.number, head, script)


def review(site: Site, parked: Parked, login: str, event: str) -> int:
    repo = site.repo(login)
    return int(repo.get_pull(parked.pr).create_review(commit=repo.get_commit(parked.head), event=event, body="ok").id)


def delivered_to(report: ReconcileReport, workflow_id: str) -> list[str]:
    return [d.kind for d in report.delivered if d.workflow_id == workflow_id]


async def reconciled_after_a_lost(site: Site, parked: Parked, event: str, action: str) -> list[str]:
    """The forge's ``event``/``action`` delivery for the parked run is lost; one pass of the reconciler then
    delivers what it finds: the decisions it sent to the run."""
    site.failed_deliveries(event, action)
    report = await reconcile_once(site.client, site.config)
    return delivered_to(report, parked.workflow_id)


# ---- approvals, requests for changes, moved heads, closed PRs --------------------------------------------


async def test_an_approval_whose_webhook_failed_reaches_the_run_in_one_pass_and_the_run_merges(site: Site) -> None:
    async with parked_run(site) as parked:
        review_id = review(site, parked, MAINTAINER, "APPROVE")
        [lost] = site.failed_deliveries("pull_request_review", "submitted")
        assert lost["status_code"] == 0 and lost["status"].startswith("failed to connect"), lost
        assert await approvals(site.client, parked.workflow_id) == []

        report = await reconcile_once(site.client, site.config)

        [delivered] = [d for d in report.delivered if d.workflow_id == parked.workflow_id]
        assert (delivered.kind, delivered.review_id, delivered.head_sha) == ("approve", str(review_id), parked.head)
        # Runs other modules left open on this test process's Temporal server name repositories not on this forge.
        assert [e for e in report.errors if e.repository in (None, site.repository)] == []
        final: RunState = await site.client.get_workflow_handle(parked.workflow_id, result_type=RunState).result()
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    assert final.approval == Approval(
        reviewer=MAINTAINER, head_sha=parked.head, source="reconciler", review_id=str(review_id), pr_number=parked.pr
    )
    assert [m.approved_sha for n, m in parked.script.calls if n == "merge"] == [parked.head]


async def test_a_pass_run_twice_records_one_decision(site: Site) -> None:
    async with parked_run(site) as parked:
        review(site, parked, MAINTAINER, "APPROVE")
        first = await reconcile_once(site.client, site.config)
        second = await reconcile_once(site.client, site.config)
        assert delivered_to(first, parked.workflow_id) == ["approve"]
        assert "cancel" not in delivered_to(second, parked.workflow_id)
        await site.client.get_workflow_handle(parked.workflow_id).result()
    assert [a.review_id for a in await approvals(site.client, parked.workflow_id)] == [first.delivered[0].review_id]
    assert len(await decisions(site.client, parked.workflow_id)) == 1


async def test_reviews_that_do_not_count_deliver_nothing(site: Site) -> None:
    async with parked_run(site) as parked:
        review(site, parked, READER, "APPROVE")  # read permission: below write
        review(site, parked, TRIAGER, "REQUEST_CHANGES")  # triage is read permission
        report = await reconcile_once(site.client, site.config)
        assert delivered_to(report, parked.workflow_id) == []
        reasons = [s.reason for s in report.skipped if s.workflow_id == parked.workflow_id]
        assert any(f"{READER} has read permission; write is required" in r for r in reasons), reasons
        assert any(f"{TRIAGER} has read permission; write is required" in r for r in reasons), reasons
        assert await decisions(site.client, parked.workflow_id) == []


async def test_a_request_for_changes_reaches_the_run_as_one_and_is_not_sent_again(site: Site) -> None:
    async with parked_run(site) as parked:
        review_id = review(site, parked, MAINTAINER, "REQUEST_CHANGES")
        first = await reconcile_once(site.client, site.config)
        assert delivered_to(first, parked.workflow_id) == ["changes_requested"]

        async def revised() -> bool:
            state = await runs.get_state(site.client, parked.workflow_id)
            return any(c.review_id == str(review_id) for c in state.candidates)

        await eventually(revised, 30, "the run to revise on the review")
        second = await reconcile_once(site.client, site.config)
        assert "changes_requested" not in delivered_to(second, parked.workflow_id)
        [rejection] = await signals(site.client, parked.workflow_id, "reject", Rejection)
    assert (rejection.changes_requested, rejection.review_id, rejection.head_sha) == (True, str(review_id), parked.head)
    assert rejection.source == "reconciler"


async def test_a_head_pushed_by_someone_else_is_told_to_the_run(site: Site) -> None:
    async with parked_run(site) as parked:
        repo = site.repo(MAINTAINER)
        moved = commit_files(repo, parked.head, {"cart.py": "total = 0\n"}, "a push the run did not make")
        repo.get_git_ref(f"heads/{branch_for(parked.workflow_id)}").edit(moved, force=True)
        assert await reconciled_after_a_lost(site, parked, "pull_request", "synchronize") == ["head_moved"]
        pushes = await signals(site.client, parked.workflow_id, "head_moved", HeadPush)
    assert pushes == [HeadPush(pr_number=parked.pr, head_sha=moved, before=parked.head, source="reconciler")]


async def test_a_pr_closed_without_merging_rejects_the_run(site: Site) -> None:
    async with parked_run(site) as parked:
        site.repo(MAINTAINER).get_pull(parked.pr).edit(state="closed")
        assert await reconciled_after_a_lost(site, parked, "pull_request", "closed") == ["reject"]
        final: RunState = await site.client.get_workflow_handle(parked.workflow_id, result_type=RunState).result()
        [rejection] = await signals(site.client, parked.workflow_id, "reject", Rejection)
    assert rejection == Rejection(
        reviewer=MAINTAINER, reason="the PR was closed without merging", source="reconciler", pr_number=parked.pr
    )
    assert final.outcome == Outcome.REJECTED
    assert final.outcome_detail == f"rejected by {MAINTAINER}: the PR was closed without merging"


# ---- the issue: closed or unlabelled cancels; a lost trigger starts ---------------------------------------


async def test_a_closed_issue_cancels_its_run(site: Site) -> None:
    async with parked_run(site) as parked:
        site.repo(MAINTAINER).get_issue(parked.issue).edit(state="closed")
        assert await reconciled_after_a_lost(site, parked, "issues", "closed") == ["cancel"]
        with pytest.raises(WorkflowFailureError):
            await site.client.get_workflow_handle(parked.workflow_id).result()
        final = await runs.get_state(site.client, parked.workflow_id)
    assert await status(site.client, parked.workflow_id) == WorkflowExecutionStatus.CANCELED
    assert final.outcome == Outcome.CANCELLED


async def test_a_removed_trigger_label_cancels_its_run(site: Site) -> None:
    async with parked_run(site) as parked:
        site.repo(TRIAGER).get_issue(parked.issue).remove_from_labels(TRIGGER)
        assert await reconciled_after_a_lost(site, parked, "issues", "unlabeled") == ["cancel"]
        events = await decisions(site.client, parked.workflow_id)
    assert [e.event_type for e in events] == [EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED]


async def test_a_lost_trigger_is_started_by_durafix_reconcile_once_and_only_for_a_permitted_labeller(
    site: Site, config: DurafixConfig, live_receiver: WebhookReceiver
) -> None:
    # A running receiver hooked too, which cannot check the labeller's role (the forge answers 503 for it):
    # it answers 503 and starts nothing, as GitHub would then never deliver again.
    owner_api = forge_setup.ForgeApi(site.forge.handle.api_url, site.forge.tokens[OWNER])
    forge_setup.ensure_webhook(owner_api, site.repository, live_receiver.url, config.webhook_secret)
    site.fail_role_reads(TRIAGER, 2)
    # The emulator keeps no issue events, so who labelled is read as the issue's author (docs/runbooks).
    permitted = site.labelled_issue(TRIAGER, TRIAGER)
    unlabelled = site.labelled_issue(MAINTAINER, None)
    below = site.labelled_issue(READER, TRIAGER)
    lost = site.failed_deliveries("issues", "labeled")
    assert sorted(d["status_code"] for d in lost) == [0, 0, 503, 503], lost
    assert site.forge.handle.faults() == []
    assert await status(site.client, site.run_id(permitted)) is None
    watching = config.model_copy(update={"reconcile_repositories": [site.repository]})
    watching.save()
    out = io.StringIO()

    def cli() -> int:
        with redirect_stdout(out):
            return run_command(["--state-dir", str(watching.state_dir), "reconcile", "--once"])

    code = await asyncio.to_thread(cli)
    report = ReconcileReport.model_validate_json(out.getvalue())
    assert code == 0, report.errors
    started = site.run_id(permitted)
    assert [(d.workflow_id, d.kind) for d in report.delivered] == [(started, "start")]
    assert site.repository in report.repositories
    inp = await started_input(site.client, started)
    assert inp.trigger == "reconciler"
    assert inp.report == PinnedReport(
        title="Cart total is wrong", body="Add two items; see one price.", author=TRIAGER, triggered_by=TRIAGER
    )
    assert await status(site.client, site.run_id(unlabelled)) is None
    assert await status(site.client, site.run_id(below)) is None
    [skip] = [s for s in report.skipped if s.workflow_id == site.run_id(below)]
    assert skip.reason == f"labelled by {READER} (read); starting a run requires triage"

    # Run again, the run now exists: nothing is started twice.
    again = await reconcile_once(site.client, watching)
    assert [d for d in again.delivered if d.workflow_id == started] == []


# ---- failures ---------------------------------------------------------------------------------------------


async def test_a_forge_read_failure_is_reported_for_its_run_and_delivers_nothing(site: Site) -> None:
    async with parked_run(site) as parked:
        review(site, parked, MAINTAINER, "APPROVE")
        site.forge.handle.set_faults(
            {"method": "GET", "path_regex": rf"/repos/{site.repository}/pulls/{parked.pr}$", "action": "status"}
        )
        report = await reconcile_once(site.client, site.config)

        [error] = [e for e in report.errors if e.workflow_id == parked.workflow_id]
        assert (error.where, error.repository) == ("forge", site.repository)
        assert "503" in error.error, error
        assert report.model_dump(mode="json")["forge_read_failures"] == 1
        assert delivered_to(report, parked.workflow_id) == []
        assert await decisions(site.client, parked.workflow_id) == []

        # The fault fired once: the next pass delivers the approval.
        assert site.forge.handle.faults() == []
        later = await reconcile_once(site.client, site.config)
        assert delivered_to(later, parked.workflow_id) == ["approve"]


# ---- the loop -----------------------------------------------------------------------------------------------


async def test_the_loop_passes_at_start_and_again_exposes_its_last_pass_and_stops(config: DurafixConfig) -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    client = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(runs.connect(config), loop))
    reports: list[ReconcileReport] = []
    try:
        rec: Reconciler = start_in_background(loop, client, config, interval_s=0.2, on_pass=reports.append)
        await eventually(lambda: rec.passes >= 2, 30, "two passes")
        assert rec.last_pass_at is not None and rec.last_report is reports[-1]
        assert rec.lag_seconds() >= 0
        assert rec.running
        rec.stop()
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(rec.wait_stopped(), loop))
        assert not rec.running
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


async def test_durafix_reconcile_serves_its_lag_on_the_metrics_port(config: DurafixConfig, tmp_path: Path) -> None:
    """``durafix reconcile`` with ``DURAFIX_METRICS_PORT``: ``/metrics`` there says how far behind it is (what
    the ``DurafixReconcilerLag`` alert reads), a finite number once it has passed."""
    port = free_port()
    config.model_copy(update={"state_dir": tmp_path, "metrics_port": port}).save()
    argv = [sys.executable, "-m", "pipeline", "--state-dir", str(tmp_path), "reconcile", "--interval", "0.5"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:

        def lag() -> list[float]:
            try:
                values = scrape(f"http://127.0.0.1:{port}/metrics").values("durafix_reconciler_lag_seconds")
            except OSError:
                return []
            return [v for v in values if math.isfinite(v)]

        seen = await eventually(lag, 60, "a finite reconciler lag on /metrics")
        assert 0 <= seen[0] < 30
    finally:
        proc.terminate()
        proc.wait(timeout=30)
