"""The ``durafix`` command line, run as real subprocesses against the embedded stack with a real worker.

The report is opened without the trigger label, so the webhook receiver ignores it and only the CLI starts
the run. What the CLI prints is checked against external truth: the forge (ticket comment, merged PR), the
run's Temporal history, and the machine (processes the run owned).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from pipeline import client as runs
from pipeline.cli.runs import operator_identity
from pipeline.ids import workflow_id_for
from pipeline.state import Phase, RunState
from tests.e2e.test_pipeline import RUN_TIMEOUT_S, awaiting_review, finished, state_when
from tests.support.e2e_stack import REPO_ROOT, E2EStack, owned_processes, run_workspaces, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.browser]

# A setup command that outlasts the test that shows it in `durafix status`.
SLOW_SETUP = "sleep 600"

EXIT_FAIL, EXIT_NOT_FOUND = 1, 3


@dataclass(frozen=True)
class Cli:
    """``python -m pipeline --state-dir STATE ...`` in a fresh process, configured only by the state directory."""

    state_dir: Path

    def run(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DURAFIX_", "OPENAI_"))}
        env["PYTHONPATH"] = str(REPO_ROOT)
        try:
            return subprocess.run(
                [sys.executable, "-m", "pipeline", "--state-dir", str(self.state_dir), *args],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env=env,
                cwd=self.state_dir,
            )
        except subprocess.TimeoutExpired as err:
            # What the command printed before it stalled (a `--watch` prints each phase change) is the clue.
            pytest.fail(f"durafix {' '.join(args)} still running after {timeout_s} s; it printed: {err.stderr!r}")

    def ok(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        done = self.run(*args, timeout_s=timeout_s)
        assert done.returncode == 0, f"durafix {' '.join(args)} exited {done.returncode}: {done.stderr}"
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json").stdout)


def reproducing(state: RunState, status: WorkflowExecutionStatus | None) -> bool:
    """Provisioning or later: the run provisions the app it reproduces the bug on (or it already ended)."""
    return state.phase not in (Phase.INTAKE, Phase.TICKET, Phase.PROCEDURE) or finished(state, status)


async def test_cli_starts_attaches_reports_and_merges_only_the_reviewed_head(stack_with_worker: E2EStack) -> None:
    stack = stack_with_worker
    cli = Cli(stack.state_dir)
    client, repository, issue, wf = await stack.open_run(labelled=False)

    # Not attached: nothing (the receiver included) had started a run for the unlabelled report before.
    started = cli.json("start", "--repo", repository, "--issue", str(issue))
    assert started["workflow_id"] == wf and started["attached"] is False
    again = cli.json("start", "--repo", repository, "--issue", str(issue))
    assert again == {**started, "attached": True}

    listed = wait_for(
        lambda: [r for r in cli.json("list") if r["workflow_id"] == wf], 30, f"{wf} in `durafix list --json`", 1
    )
    assert [(r["run_id"], r["status"]) for r in listed] == [(started["run_id"], "running")]

    state = await state_when(client, wf, awaiting_review)
    assert state.pending_approval is not None, state.outcome_detail
    status = cli.json("status", wf)
    assert (status["status"], status["phase"], status["run_id"]) == ("running", "awaiting-review", started["run_id"])
    assert status["ticket"]["issue_number"] == issue and status["ticket"]["op_id"] == f"{wf}:ticket"
    head = status["pending_approval"]["head_sha"]
    pr_number = status["pending_approval"]["pr_number"]
    assert head == state.pending_approval.head_sha
    repo = stack.github().get_repo(repository)
    assert "durafix:ticket" in repo.get_issue(issue).get_comment(status["ticket"]["comment_id"]).body
    assert repo.get_pull(pr_number).head.sha == head

    text = cli.ok("status", wf).stdout
    assert f"run        {wf}  (run {started['run_id'][:8]}" in text
    assert "status     running; phase awaiting-review" in text
    assert f"ticket     {status['ticket']['url']}" in text
    assert f"awaiting   approval of PR #{pr_number} head {head}" in text

    wrong = "0" * 40
    assert wrong != head
    refused = cli.run("approve", wf, "--sha", wrong)
    assert refused.returncode == EXIT_FAIL, refused
    assert "approval refused" in refused.stderr and head in refused.stderr
    # The stack allows operator approvals (tests/support/e2e_stack.py); the approval records who ran the command.
    approved = cli.ok("approve", wf, "--sha", head)
    assert f"approved {head} by operator:{operator_identity()}" in approved.stdout

    watched = cli.ok("status", wf, "--watch", timeout_s=RUN_TIMEOUT_S)
    assert "; outcome merged" in watched.stdout, watched.stdout
    assert "-> merged" in watched.stderr
    final = cli.json("status", wf)
    assert (final["status"], final["outcome"]) == ("completed", "merged")
    assert final["pending_activities"] == []
    assert final["approval"]["head_sha"] == head and final["approval"]["source"] == "cli"
    assert f"merged     {final['merged_sha']}" in watched.stdout
    pr = repo.get_pull(pr_number)
    assert pr.merged and pr.merge_commit_sha == final["merged_sha"] and pr.head.sha == head

    history = cli.json("history", wf)
    assert {"event": "activity_task_completed", "detail": "forge.merge"} in [
        {"event": r["event"], "detail": r["detail"]} for r in history
    ]
    # The refused approval never entered the history: only the approval of the reviewed head is there.
    updates = [r["detail"] for r in history if r["event"] == "workflow_execution_update_accepted"]
    assert updates == [f"approve id=approve:{head}"]

    assert owned_processes(wf) == []


async def test_cli_cancel_ends_a_run_cancelled_and_leaves_nothing_to_clean_up(stack_with_worker: E2EStack) -> None:
    stack = stack_with_worker
    cli = Cli(stack.state_dir)
    client, repository, issue, wf = await stack.open_run(labelled=False)
    assert cli.json("start", "--repo", repository, "--issue", str(issue))["attached"] is False
    await state_when(client, wf, reproducing)

    cancelled = cli.ok("cancel", wf, "--wait", timeout_s=RUN_TIMEOUT_S - 90)
    assert f"cancellation requested for {wf}" in cancelled.stdout
    assert "; outcome cancelled" in cancelled.stdout, cancelled.stdout
    status = cli.json("status", wf)
    assert (status["status"], status["outcome"]) == ("canceled", "cancelled")
    assert status["cleanup"]["complete"] is True and status["cleanup"]["remaining"] == []
    assert owned_processes(wf) == []
    assert run_workspaces(stack, wf) == []

    inventory = cli.json("resources")
    assert inventory["unavailable"] == []
    assert [r for r in inventory["resources"] if r["run_id"] == wf] == []
    mine = cli.run("resources", "--run", wf, "--json")
    assert mine.returncode == EXIT_NOT_FOUND, mine
    assert json.loads(mine.stdout)["resources"] == []

    dry = cli.run("cleanup", "--run", wf)
    assert dry.returncode == EXIT_NOT_FOUND, dry
    assert f"{wf} owns no resources here" in dry.stderr
    dry_json = cli.run("cleanup", "--run", wf, "--json")
    assert dry_json.returncode == EXIT_NOT_FOUND, dry_json
    assert json.loads(dry_json.stdout) == {
        "run_id": wf,
        "temporal_status": "canceled",
        "dry_run": True,
        "unavailable": [],
        "resources": [],
    }


def test_cli_commands_on_an_unknown_run_exit_not_found(e2e_stack: E2EStack) -> None:
    cli = Cli(e2e_stack.state_dir)
    unknown = workflow_id_for("acme/never-seen", 424242)
    for args in (["status", unknown], ["status", unknown, "--json"], ["history", unknown], ["cancel", unknown]):
        done = cli.run(*args)
        assert done.returncode == EXIT_NOT_FOUND, (args, done)
        assert "not found" in done.stderr, (args, done.stderr)
    approve = cli.run("approve", unknown, "--sha", "0" * 40)
    assert approve.returncode == EXIT_NOT_FOUND, approve


async def test_cli_status_shows_the_base_provisioning_and_its_setup_sub_state(stack_with_worker: E2EStack) -> None:
    """A setup command that takes a while is what `durafix status` says the run is doing, with its time."""
    stack = stack_with_worker
    cli = Cli(stack.state_dir)
    repository = stack.new_repository()
    recipe = (REPO_ROOT / "examples" / "cart" / "durafix.yaml").read_text()
    # Far longer than the test looks: the run is cancelled while it sleeps, so a loaded host never sees the
    # setup end (and the phase move on) between two `durafix status` calls.
    slow = recipe.replace("setup: []", f'setup: ["echo preparing", "{SLOW_SETUP}"]')
    assert slow != recipe
    stack.push_files(repository, {"durafix.yaml": slow}, "Setup takes a while")
    issue = stack.open_report(repository, labelled=False)
    wf = workflow_id_for(repository, issue)
    client = await runs.connect(stack.config)
    assert cli.json("start", "--repo", repository, "--issue", str(issue))["attached"] is False

    def provisioning_shown() -> str | None:
        text = cli.ok("status", wf).stdout
        shown = "phase provision" in text and re.search(rf"env\.provision .*setup: {SLOW_SETUP} \((\d+) s\)", text)
        return text if shown else None

    text = wait_for(provisioning_shown, 90, f"`durafix status {wf}` to show the base provisioning's setup", 1)
    first = _setup_seconds(text)

    def time_passing() -> bool:
        again = provisioning_shown()
        return again is not None and _setup_seconds(again) > first

    # The sub-state's clock is the heartbeat's: it moves while the command runs.
    wait_for(time_passing, 20, "the setup's seconds to grow in `durafix status`", 1)
    shown = cli.json("status", wf)
    assert shown["phase"] == "provision"
    assert any(
        a["activity_type"] == "env.provision" and f"setup: {SLOW_SETUP}" in a["detail"]
        for a in shown["pending_activities"]
    ), shown["pending_activities"]

    cli.ok("cancel", wf, "--wait", timeout_s=RUN_TIMEOUT_S - 90)
    final = await state_when(client, wf, finished)
    assert final.outcome is not None and final.outcome.value == "cancelled"
    assert owned_processes(wf) == []


def _setup_seconds(status_text: str) -> int:
    found = re.search(rf"setup: {SLOW_SETUP} \((\d+) s\)", status_text)
    assert found, status_text
    return int(found[1])
