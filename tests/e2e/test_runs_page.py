"""What an operator sees of runs: one trace from a webhook delivery to the activities it caused, and the runs
page of ``durafix serve`` in Chromium.

One scene for both, on the session's stack: a ``durafix serve`` and a ``durafix worker`` exporting their spans
over OTLP to a collector in this test (:mod:`tests.support.otlp`), and four runs their webhooks start or a
client starts: merged (its recipe has a setup command), awaiting review, failed in triage (its setup command
fails), and one whose name and repository are HTML.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import yaml
from playwright.sync_api import Dialog, Locator, Page
from temporalio.client import WorkflowExecutionStatus

from infra import processes
from infra.cli.demo import seed_repository
from pipeline import client as runs
from pipeline.cli.runs_page import signed_runs_link
from pipeline.ids import workflow_id_for
from pipeline.state import Outcome, Phase, RunState
from pipeline.steps import TaskQueue
from pipeline.workflow import RepairBugWorkflow
from tests.support.chromium import launched
from tests.support.e2e_stack import REPO_ROOT, E2EStack
from tests.support.otlp import Collector, Span, collecting, exporting_to
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.browser]

RUN_TIMEOUT_S = 300
CART_RECIPE = REPO_ROOT / "examples" / "cart" / "durafix.yaml"
HTML_NAME = "<img src=x onerror=alert(document.title)>"


@dataclass(frozen=True)
class Scene:
    stack: E2EStack
    collector: Collector
    base_url: str
    merged: RunState
    awaiting: RunState
    failed: RunState
    html_id: str


def _recipe(setup: list[str]) -> str:
    recipe = yaml.safe_load(CART_RECIPE.read_text())
    recipe["setup"] = setup
    return yaml.safe_dump(recipe)


async def _settle(stack: E2EStack, merged: str, awaiting: str, failed: str) -> tuple[RunState, RunState, RunState]:
    """Drive the runs to their scene: the first approved on the forge once it awaits review, then merged; the
    second awaiting review; the third ended."""
    client = await runs.connect(stack.config)
    approved = False
    deadline = time.monotonic() + RUN_TIMEOUT_S
    states: dict[str, RunState] = {}
    while time.monotonic() < deadline:
        for workflow_id in (merged, awaiting, failed):
            try:
                status, states[workflow_id] = await runs.status_and_state(client, workflow_id)
            except Exception:  # the webhook may not have started it yet
                continue
            state = states[workflow_id]
            if workflow_id == merged and not approved and state.pending_approval is not None:
                stack.approve_on_forge(
                    state.repository, state.pending_approval.pr_number, state.pending_approval.head_sha
                )
                approved = True
            if status != WorkflowExecutionStatus.RUNNING:
                states[workflow_id] = state
        done = (
            merged in states
            and states[merged].outcome is not None
            and awaiting in states
            and states[awaiting].pending_approval is not None
            and failed in states
            and states[failed].outcome is not None
        )
        if done:
            return states[merged], states[awaiting], states[failed]
        await asyncio.sleep(1)
    raise AssertionError(f"the runs did not settle: { ({k: (v.phase, v.outcome) for k, v in states.items()}) }")


async def _start_html_run(stack: E2EStack) -> str:
    """A run started straight through Temporal under an ID and a repository that are HTML."""
    client = await runs.connect(stack.config)
    workflow_id = f"repair:maintainer/{HTML_NAME}#{uuid.uuid4().int % 10_000}"
    await client.start_workflow(
        RepairBugWorkflow.run,
        runs.repair_input(stack.config, f"maintainer/{HTML_NAME}", 1, "cli"),
        id=workflow_id,
        task_queue=TaskQueue.ORCHESTRATION.value,
    )
    return workflow_id


@pytest.fixture(scope="module")
def scene(e2e_stack: E2EStack) -> Iterator[Scene]:
    stack = e2e_stack
    with collecting() as collector:
        port = processes.free_port()
        receiver = processes.spawn(
            "traced-receiver",
            [
                sys.executable,
                "-m",
                "pipeline",
                "--state-dir",
                str(stack.state_dir),
                "serve",
                "--port",
                str(port),
                "--no-reconcile",
            ],
            log=stack.state_dir / "logs" / "traced-receiver.log",
            port=port,
            url=f"http://127.0.0.1:{port}/webhook",
            env={"PYTHONPATH": str(REPO_ROOT), **exporting_to(collector, "durafix-receiver")},
        )
        try:
            processes.wait_ready(receiver, lambda: processes.tcp_open("127.0.0.1", port), 120)
            stack.spawn_worker(extra_env=exporting_to(collector, "durafix-worker"))

            def repository(setup: list[str] | None) -> str:
                name = f"runs-{uuid.uuid4().hex[:8]}"
                repo = seed_repository(stack.config, stack.admin_token, "reviewer", receiver.url, name=name)
                if setup is not None:
                    stack.push_files(repo, {"durafix.yaml": _recipe(setup)}, "setup")
                return repo

            merged_repo = repository(["python3 -c \"print('set up')\""])
            awaiting_repo = repository(None)
            failed_repo = repository(["exit 3"])
            ids = [workflow_id_for(repo, stack.open_report(repo)) for repo in (merged_repo, awaiting_repo, failed_repo)]
            html_id = asyncio.run(_start_html_run(stack))
            merged, awaiting, failed = asyncio.run(_settle(stack, *ids))
            yield Scene(stack, collector, f"http://127.0.0.1:{port}", merged, awaiting, failed, html_id)
        finally:
            stack.stop_workers()
            processes.stop(receiver)


# ---- traces ---------------------------------------------------------------------------------------------


def _trace_of(spans: list[Span], workflow_id: str) -> list[Span]:
    runs_ = [
        s for s in spans if s.name == "RunWorkflow:repair_bug" and s.attributes.get("temporalWorkflowID") == workflow_id
    ]
    assert runs_, f"no RunWorkflow span of {workflow_id}; names: {sorted({s.name for s in spans})}"
    return [s for s in spans if s.trace_id == runs_[0].trace_id]


def _ancestors(span: Span, by_id: dict[str, Span]) -> list[str]:
    names = []
    while span.parent_id and span.parent_id in by_id:
        span = by_id[span.parent_id]
        names.append(span.name)
    return names


def test_one_trace_runs_from_the_webhook_delivery_through_the_workflow_to_its_activities(scene: Scene) -> None:
    workflow_id = scene.merged.workflow_id

    def merged_trace() -> list[Span] | None:
        trace = _trace_of(scene.collector.spans(), workflow_id)
        # The merge is the run's last step: once its activity's span is exported, the steps before it are too.
        return trace if any(s.name == "RunActivity:forge.merge" for s in trace) else None

    trace = wait_for(merged_trace, 60, "the merge activity's span")
    by_id = {s.span_id: s for s in trace}
    names = {s.name for s in trace}
    roots = [s for s in trace if not s.parent_id]
    assert [(r.name, r.service) for r in roots] == [("webhook delivery", "durafix-receiver")]
    assert roots[0].attributes["github.event"] == "issues"
    assert "StartWorkflow:repair_bug" in names
    for step in ("env.provision", "browser.reproduce", "env.verify_candidate", "forge.ensure_draft_pr", "forge.merge"):
        assert f"StartActivity:{step}" in names, step
        assert f"RunActivity:{step}" in names, step
    assert {"browser run", "model call"} <= names
    # Every span of the run's trace descends from the delivery.
    assert all(s is roots[0] or roots[0].name in _ancestors(s, by_id) for s in trace)
    setup = [s for s in trace if s.name == "setup command"]
    assert setup, "the recipe's setup command has no span"
    for span in setup:
        assert span.service == "durafix-worker" and span.attributes["exit"] == "exited 0"
        # Setup runs wherever a workspace is set up: provision, baseline, verification; always inside a step.
        assert any(name.startswith("RunActivity:env.") for name in _ancestors(span, by_id)), _ancestors(span, by_id)
    assert any("RunActivity:env.provision" in _ancestors(span, by_id) for span in setup)
    assert {s.service for s in trace} == {"durafix-receiver", "durafix-worker"}


def test_a_failing_setup_command_is_a_failed_span_in_its_run_s_trace(scene: Scene) -> None:
    trace = wait_for(
        lambda: [s for s in _trace_of(scene.collector.spans(), scene.failed.workflow_id) if s.name == "setup command"],
        60,
        "the failing setup command's span",
    )
    assert {s.attributes["exit"] for s in trace} == {"exited 3"}


def test_the_worker_logs_each_step_of_a_run_as_json_naming_run_step_attempt_and_host(scene: Scene) -> None:
    log = Path(scene.stack.workers[0].log).read_text(errors="replace").splitlines()
    mine = [json.loads(line) for line in log if scene.merged.workflow_id in line]
    assert mine, "the worker logged nothing for the run"
    steps = {(line["step"], line["msg"].split(" ")[1]) for line in mine if line["msg"].startswith("step ")}
    for step in ("env.provision", "browser.reproduce", "forge.merge"):
        assert {(step, "started"), (step, "finished")} <= steps, step
    assert {line["run"] for line in mine} == {scene.merged.workflow_id}
    assert {line["host"] for line in mine} == {socket.gethostname()}
    assert all(isinstance(line["attempt"], int) and line["attempt"] >= 1 for line in mine)


# ---- the runs page --------------------------------------------------------------------------------------


def _refuse(dialog: Dialog, seen: list[str]) -> None:
    seen.append(dialog.message)
    dialog.dismiss()


def _row(page: Page, workflow_id: str) -> Locator:
    return page.locator("tr", has=page.locator(f'a:text-is("{workflow_id}")'))


def test_the_runs_page_shows_each_run_with_its_phase_and_links_escapes_html_and_filters(scene: Scene) -> None:
    link = signed_runs_link(scene.stack.config, scene.base_url)
    dialogs: list[str] = []
    with launched() as browser:
        page = browser.new_page()
        page.on("dialog", lambda dialog: _refuse(dialog, dialogs))
        answer = page.goto(link)
        assert answer is not None and answer.status == 200
        assert "default-src 'none'" in answer.headers["content-security-policy"]

        merged = _row(page, scene.merged.workflow_id)
        cells = merged.locator("td").all_inner_texts()
        assert cells[3] == Phase.DONE.value and cells[6].startswith(Outcome.MERGED.value), cells
        publish = scene.merged.publish
        assert publish is not None and scene.merged.ticket is not None
        hrefs = {a.inner_text(): a.get_attribute("href") for a in merged.locator("td:last-child a").all()}
        assert hrefs["ticket"] == scene.merged.ticket.url
        assert hrefs["PR"] == publish.pr_url
        assert hrefs["evidence"] == publish.report_url
        assert hrefs["Temporal"] == (
            f"{scene.stack.config.temporal_ui_url}/namespaces/default/workflows/"
            f"{quote(scene.merged.workflow_id, safe='')}/{scene.merged.run_id}/history"
        )

        awaiting = _row(page, scene.awaiting.workflow_id).locator("td").all_inner_texts()
        assert awaiting[3] == Phase.AWAITING_REVIEW.value and awaiting[6] == "running", awaiting
        assert scene.awaiting.publish is not None
        assert _row(page, scene.awaiting.workflow_id).locator("a", has_text="PR").get_attribute("href") == (
            scene.awaiting.publish.pr_url
        )

        failed = _row(page, scene.failed.workflow_id).locator("td").all_inner_texts()
        assert failed[3] == Phase.DONE.value and failed[6].startswith(Outcome.NEEDS_HUMAN_TRIAGE.value), failed

        # The HTML is text on the page: no element was made of it, nothing ran.
        assert page.get_by_text(scene.html_id, exact=True).count() == 1
        assert page.locator("img").count() == 0 and dialogs == []

        page.select_option("select[name=outcome]", Outcome.MERGED.value)
        page.click("button[type=submit]")
        page.wait_for_url("**/runs?**outcome=merged**")
        shown = page.locator("td:first-child a").all_inner_texts()
        assert scene.merged.workflow_id in shown
        assert not {scene.awaiting.workflow_id, scene.failed.workflow_id, scene.html_id} & set(shown)

        page.select_option("select[name=outcome]", "")
        page.select_option("select[name=repository]", scene.awaiting.repository)
        page.click("button[type=submit]")
        page.wait_for_url(f"**repository={quote(scene.awaiting.repository, safe='')}**")
        assert page.locator("td:first-child a").all_inner_texts() == [scene.awaiting.workflow_id]

        page.goto(link)
        page.click(f'a:text-is("{scene.merged.workflow_id}")')
        page.wait_for_selector("h2:text-is('phases')")
        text = page.inner_text("body")
        for phase in (Phase.PROVISION, Phase.AWAITING_REVIEW, Phase.MERGE, Phase.DONE):
            assert phase.value in text
        assert "env.provision" in text and publish.commit in text and "pushed by the run" in text

        page.goto(link)
        page.click(f'a:text-is("{scene.html_id}")')
        page.wait_for_selector("h2:text-is('steps')")
        assert page.inner_text("h1") == scene.html_id
        assert page.locator("img").count() == 0
        assert dialogs == []


def test_the_runs_page_answers_401_without_the_token(scene: Scene) -> None:
    link = signed_runs_link(scene.stack.config, scene.base_url)
    with launched() as browser:
        page = browser.new_page()
        answer = page.goto(f"{scene.base_url}/runs")
        assert answer is not None and answer.status == 401
        assert scene.merged.workflow_id not in page.content()
        tampered = link.replace("exp=", "exp=1")
        answer = page.goto(tampered)
        assert answer is not None and answer.status == 401
        detail = f"{scene.base_url}/runs/{quote(scene.merged.workflow_id, safe='')}"
        answer = page.goto(detail)
        assert answer is not None and answer.status == 401
    token = scene.stack.config.operator_token
    assert httpx.get(f"{scene.base_url}/runs", headers={"Authorization": "Bearer not-the-token"}).status_code == 401
    assert httpx.get(f"{scene.base_url}/runs", headers={"Authorization": f"Bearer {token}"}).status_code == 200
