"""Two projects of our own, shaped like real ones (:mod:`tests.support.real_projects`: an npm app with ``is-number``,
a pip app with ``humanize``, each with 55 tagged commits), onboarded with ``durafix dev onboard`` as a new user
would, and each sent two reports through the webhooks on the embedded stack:

1. the bug, which reproduces in Chromium: the scripted model's first fix is wrong (its own regression test fails),
   and its failing tests cancel the reproduction replayed beside them; its second fix (with the same regression
   test) is verified on a rebuilt workspace, the reviewer approves the draft PR through the review API, and the
   run merges it;
2. after the maintainer pulled the fix, committed on top and onboarded again (``main`` moved), the same bug
   reported again from the new release: the procedure checks it runs on the moved ``main`` and finds the
   behaviour correct, so the run ends in triage, honestly "not reproduced", with no PR and no model request.

What is asserted is read back from the forge through PyGithub and real git (PRs, ``main``'s files, tickets),
from the evidence store (the setup and test logs), from the worker's dependency cache (one entry per project,
built once: every later workspace restored it instead of running ``npm ci`` / ``pip install`` again), from the
worker's log (each setup it did, so setup ran once per revision) and from the run's history on the server (the
baseline ran beside the base reproduction; the first candidate's tests failed and its reproduction was cancelled).

Which of a candidate's two checks ends first is, left to itself, a race: its tests take 1.0-1.5 s here and its
reproduction (environment and browser) 1.7-2.0 s, a margin a loaded host erases. So the worker is started through
the fault launcher (``tests/support/workers/faulty.py hold-until-cancelled``) for that one ordering and nothing
else: the first candidate's ``browser.reproduce`` does none of its work and holds until the workflow cancels it,
and every candidate's verification starts its tests only once that hold began (its environment is provisioned by
then). The tests' failure therefore always comes first and always finds the reproduction running; what is asserted
is what the run did about it, read from the server's history and the worker's log, never from how long anything
took. Every other activity runs as the product's.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from environments.depcache import BuildRecord, DependencyCache
from environments.files import path_key
from environments.interface import AppRecipe
from environments.spec import load_recipe
from pipeline import client as runs
from pipeline.ids import workflow_id_for
from pipeline.services import Services
from pipeline.state import Outcome, RunState
from tests.conftest import require
from tests.e2e.test_cli import Cli
from tests.e2e.test_pipeline import awaiting_review, file_on_main, finished, state_when
from tests.support.e2e_stack import E2EStack, owned_processes, scripted_stack
from tests.support.real_projects import (
    HISTORY_COMMITS,
    PROJECTS,
    Project,
    build_checkout,
    mirror_clone_request_encodings,
    pull_and_commit,
    wrong_first_model_script,
)
from tests.support.run_history import ActivitySpan, activity_spans

pytestmark = [pytest.mark.slow, pytest.mark.browser]


HELD = "reproduce-candidate-1"
"""The step the worker holds until the workflow cancels it: the first candidate's reproduction (its browser step)."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EStack]:
    """One embedded stack for both projects, answering from their model script (a wrong fix first), with one
    worker holding each run's first candidate's reproduction until it is cancelled (see the module docstring)."""
    for tool in ("node", "npm"):
        require(shutil.which(tool) is not None, f"{tool} is not installed")
    with scripted_stack(tmp_path_factory, "durafix-real-projects", model_script=wrong_first_model_script) as e2e:
        e2e.spawn_worker(
            fault="hold-until-cancelled",
            kill_dir=e2e.state_dir / "test-holds",
            extra_env={"DURAFIX_TEST_HOLD": HELD, "DURAFIX_TEST_AFTER_HOLD": "verify"},
        )
        yield e2e


def entries_of(cache: DependencyCache, repository: str) -> list[tuple[Path, BuildRecord]]:
    """The repository's dependency cache entries with their build records."""
    found = []
    for entry in cache.entries():
        record = cache.read_record(entry)
        assert record is not None, f"{entry} has no readable build record"
        if record.repository == repository:
            found.append((entry, record))
    return found


def model_requests(stack: E2EStack) -> int:
    """How many chat completions the scripted model server has answered so far (a worker's start probes
    ``GET /v1/models``, which is not a request to the model)."""
    answer = httpx.get(f"{stack.config.model_base_url.removesuffix('/v1')}/_admin/requests", timeout=10)
    return sum(r["path"] == "/v1/chat/completions" for r in answer.json())


def ticket_of(stack: E2EStack, repository: str, issue: int, state: RunState) -> str:
    assert state.ticket is not None and state.ticket.comment_id is not None
    return str(stack.github().get_repo(repository).get_issue(issue).get_comment(state.ticket.comment_id).body)


@dataclass(frozen=True)
class RealRuns:
    """What one project's two runs left (:func:`merge_then_find_fixed`): the repository, its recipe, the first
    run (merged) and the second (ended in triage), and when each report was opened."""

    repository: str
    recipe: AppRecipe
    wf: str
    merged: RunState
    wf2: str
    triaged: RunState
    started: float
    second_started: float


async def merge_then_find_fixed(stack: E2EStack, project: Project, tmp_path: Path) -> RealRuns:
    """Onboard ``project`` as a new user would, have its first report merged (asserted from the forge), move
    ``main``, and have the second report end honestly in triage on the moved ``main`` without asking the model;
    whatever the stack's environment provider. What setup's reuse looks like is the caller's to assert."""
    cli = Cli(stack.state_dir)
    checkout = build_checkout(project, tmp_path)
    recipe = load_recipe(checkout)

    onboarded = cli.json("dev", "onboard", str(checkout), "--receiver-url", stack.receiver.url)
    repository = onboarded["repository"]
    assert (repository, onboarded["created"]) == (f"maintainer/{project.name}", True)
    assert onboarded["pushed"]["commits"] == HISTORY_COMMITS
    assert len(onboarded["pushed"]["tags"]) == HISTORY_COMMITS
    assert onboarded["receiver"]["answering"] is True
    owner_token = onboarded["tokens"]["owner"]["token"]
    # The history is big enough for git to gzip its requests, as it does on real repositories (the worker's
    # first mirror clone of it below sends the same request).
    encodings = mirror_clone_request_encodings(onboarded["clone_url"], owner_token, tmp_path / "mirror.git")
    assert "gzip" in encodings, encodings
    owner = stack.github(owner_token).get_repo(repository)
    client = await runs.connect(stack.config)

    # 1. The bug as first reported: reproduced, repaired, reviewed, merged.
    started = time.time()
    issue = owner.create_issue(
        title=project.first.title, body=project.first.body, labels=[stack.config.trigger_label]
    ).number
    wf = workflow_id_for(repository, issue)
    state = await state_when(client, wf, awaiting_review, timeout_s=600)
    assert state.pending_approval is not None, state.outcome_detail
    assert state.reproduction is not None and state.reproduction.status == "reproduced"
    assert state.reproduction.revision == onboarded["pushed"]["head"]
    assert state.baseline is not None and state.baseline.passed, state.baseline
    head = state.pending_approval.head_sha
    reviewer = stack.github(onboarded["tokens"]["reviewer"]["token"]).get_repo(repository)
    pr = reviewer.get_pull(state.pending_approval.pr_number)
    assert pr.head.sha == head and pr.draft
    pr.create_review(commit=reviewer.get_commit(head), event="APPROVE", body="The evidence shows the fix.")
    merged = await state_when(client, wf, finished)
    assert merged.outcome == Outcome.MERGED, merged.outcome_detail
    assert merged.approval is not None and (merged.approval.head_sha, merged.approval.source) == (head, "webhook")

    repo = stack.github().get_repo(repository)
    assert [(p.number, p.merged) for p in repo.get_pulls(state="all")] == [(pr.number, True)]
    assert repo.get_pull(pr.number).merge_commit_sha == merged.merged_sha == repo.get_branch("main").commit.sha
    path, fixed = project.fixed
    assert fixed in file_on_main(stack, repository, path)
    assert file_on_main(stack, repository, project.added_test)
    ticket = ticket_of(stack, repository, issue, merged)
    assert "merged" in ticket and str(merged.merged_sha) in ticket, ticket
    assert owned_processes(wf) == []

    # 2. main moves: the maintainer pulls the merged fix, commits on top, onboards again.
    files, message = project.move
    moved = pull_and_commit(checkout, onboarded["clone_url"], files, message, "v1.1.0")
    again = cli.json("dev", "onboard", str(checkout), "--receiver-url", stack.receiver.url)
    assert again["created"] is False and again["pushed"]["head"] == moved
    assert again["pushed"]["commits"] > HISTORY_COMMITS + 1 and "v1.1.0" in again["pushed"]["tags"]
    assert repo.get_branch("main").commit.sha == moved

    # The same bug reported again from the new release: it runs on the moved main, and the page is right.
    asked = model_requests(stack)
    second_started = time.time()
    issue2 = owner.create_issue(
        title=project.again.title, body=project.again.body, labels=[stack.config.trigger_label]
    ).number
    wf2 = workflow_id_for(repository, issue2)
    triaged = await state_when(client, wf2, finished)
    assert triaged.outcome == Outcome.NEEDS_HUMAN_TRIAGE, triaged.outcome_detail
    assert triaged.reproduction is not None and triaged.reproduction.status == "not_reproduced"
    assert triaged.reproduction.revision == moved
    assert triaged.candidates == [] and triaged.budgets.repair_attempts_used == 0
    assert model_requests(stack) == asked, "the model was asked about a report that did not reproduce"
    assert [(p.number, p.merged) for p in repo.get_pulls(state="all")] == [(pr.number, True)]
    assert repo.get_branch("main").commit.sha == moved
    ticket = ticket_of(stack, repository, issue2, triaged)
    assert "needs human triage" in ticket and f"did not reproduce on {moved[:12]}" in ticket, ticket
    assert owned_processes(wf2) == []
    return RealRuns(repository, recipe, wf, merged, wf2, triaged, started, second_started)


def checks_logs(stack: E2EStack, merged: RunState) -> list[str]:
    """The stored logs of the first run's baseline and of its verified candidate's checks."""
    store = Services(stack.config).store
    [candidate] = [c for c in merged.candidates if c.verification == "passed"]
    assert merged.baseline is not None and candidate.test_output_ref is not None
    return [store.read_bytes(ref).decode() for ref in (merged.baseline.test_output_ref, candidate.test_output_ref)]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("project", PROJECTS, ids=lambda p: p.name)
async def test_an_onboarded_project_merges_a_fix_then_finds_the_report_again_fixed_on_the_moved_main(
    stack: E2EStack, project: Project, tmp_path: Path
) -> None:
    cache = Services(stack.config).setup.cache
    assert cache is not None, "the stack's workers cache dependencies by default"
    done = await merge_then_find_fixed(stack, project, tmp_path)
    recipe = done.recipe

    # Setup ran once for the base and stored its result. The base environment and the baseline run side by side:
    # whichever took the cache key's build lock first ran setup and stored the entry (in the run's workspaces);
    # the other waited for the lock and restored it. The candidate's verification (its log is evidence) restored
    # it, and so did the second run's environment (the entry was not rebuilt, and it was used since).
    [(entry, record)] = entries_of(cache, done.repository)
    assert record.setup == recipe.setup and record.paths == [project.cached_path]
    assert record.provider == "local" and set(record.lock_files) == set(recipe.lock_files)
    assert done.started <= record.created < done.second_started
    assert Path(record.built_in).is_relative_to(stack.state_dir / "workspaces" / path_key(done.wf)), record.built_in
    baseline_log, verify_log = checks_logs(stack, done.merged)
    baseline_built = any(f"$ {command}" in baseline_log for command in recipe.setup)
    assert baseline_built != ("# dependency cache: restored entry" in baseline_log), baseline_log
    assert "# dependency cache: restored entry" in verify_log, verify_log
    assert not any(f"$ {command}" in verify_log for command in recipe.setup), verify_log
    last_used, stamped = cache.last_used(entry)
    assert stamped and last_used >= done.second_started

    # Setup ran once per revision, by the worker's own account of every setup it did for the first run: the base
    # revision's tree set up by its commands once (by the baseline or the base environment, whichever built the
    # entry) and restored by the other; each of the two candidates' trees (their lock files unchanged) restored by
    # its environment and its verification, never set up again (the first candidate's environment was ready
    # before its verification's tests began, see the module docstring).
    setups = sorted(setups_of(stack, done.wf))
    assert setups == [("base", "ran"), ("base", "restored"), *[("candidate", "restored")] * 4], setups
    # The baseline ran beside the base reproduction (its environment provisioned, the page reproduced), as the
    # server recorded their activities.
    spans = await activity_spans(await runs.connect(stack.config), done.wf)
    by_op = {(span.step, span.op_id): span for span in spans}
    baseline = by_op[("env.run_baseline", f"{done.wf}:baseline")]
    provision = by_op[("env.provision", f"{done.wf}:env-base:1")]
    reproduce = by_op[("browser.reproduce", f"{done.wf}:reproduce-base:1")]
    assert {baseline.outcome, provision.outcome, reproduce.outcome} == {"completed"}, spans
    assert provision.started is not None and baseline.started is not None
    assert baseline.started < reproduce.ended and provision.started < baseline.ended, spans

    assert_first_candidate_cancelled(stack, done, by_op)


def assert_first_candidate_cancelled(
    stack: E2EStack, done: RealRuns, by_op: dict[tuple[str, str], ActivitySpan]
) -> None:
    """The first candidate's tests failed and that cancelled its reproduction, which ended cancelled and had its
    environment torn down; the second candidate verified (tests and reproduction) and was merged. Read from the
    run's state, the server's history of its activities and the worker's log."""
    wf = done.wf
    first, second = done.merged.candidates
    assert (first.attempt, first.verification, first.tests_passed) == (1, "failed", False), first
    assert first.failure is not None and first.failure.startswith("tests failed"), first.failure
    assert first.replay is None, first.replay
    assert (second.attempt, second.verification, second.tests_passed) == (2, "passed", True), second
    assert second.replay is not None and second.replay.status == "not_reproduced", second.replay
    assert done.merged.approval is not None and second.commit == done.merged.approval.head_sha
    assert done.merged.budgets.repair_attempts_used == 2

    # The server's record: the first verification completed (its tests failed: a result, not an error); then the
    # workflow asked to cancel the reproduction running beside it, which the worker acknowledged: closed
    # cancelled, on its first attempt, never completed nor failed. Its environment, provisioned, was torn down.
    verify = by_op[("env.verify_candidate", f"{wf}:verify:1")]
    provision = by_op[("env.provision", f"{wf}:env-candidate-1:1")]
    held = by_op[("browser.reproduce", f"{wf}:{HELD}:1")]
    teardown = by_op[("env.teardown", f"{wf}:env-candidate-1:1")]
    assert (verify.outcome, provision.outcome, teardown.outcome) == ("completed",) * 3, by_op
    assert (held.outcome, held.attempt) == ("canceled", 1), held
    assert held.cancel_requested is not None and verify.ended <= held.cancel_requested <= held.ended, held
    assert held.ended <= teardown.ended, (held, teardown)
    # Nothing else of the run was cancelled, and the second candidate's checks both completed.
    cancelled = [op for (step, op), span in by_op.items() if span.outcome != "completed" or span.cancel_requested]
    assert cancelled == [f"{wf}:{HELD}:1"], cancelled
    for step, op in [
        ("env.verify_candidate", f"{wf}:verify:2"),
        ("env.provision", f"{wf}:env-candidate-2:1"),
        ("browser.reproduce", f"{wf}:reproduce-candidate-2:1"),
    ]:
        assert by_op[(step, op)].outcome == "completed", by_op[(step, op)]

    # The worker's account: the held step began, the cancellation reached it, and it ended cancelled; it is the
    # one step of the run that did not finish.
    lines = worker_lines(stack, wf)
    reproduce = [message for step, message in lines if step == "browser.reproduce"]
    assert f"held by the test before its work until cancelled: {wf}:{HELD}:1" in reproduce, reproduce
    assert f"the cancellation reached the held step: {wf}:{HELD}:1" in reproduce, reproduce
    unfinished = [(step, m) for step, m in lines if m.startswith("step failed")]
    assert len(unfinished) == 1 and unfinished[0][0] == "browser.reproduce", unfinished
    assert unfinished[0][1].endswith(": CancelledError"), unfinished


def worker_lines(stack: E2EStack, wf: str) -> list[tuple[str, str]]:
    """Each line the stack's worker logged for run ``wf``: (its step, its message), in the order logged."""
    found = []
    for line in Path(stack.workers[0].log).read_text().splitlines():
        record = json.loads(line) if line.startswith("{") else {}
        if record.get("run") == wf:
            found.append((str(record.get("step")), str(record.get("msg", ""))))
    return found


def setups_of(stack: E2EStack, wf: str) -> list[tuple[str, str]]:
    """Each setup the stack's worker logged for run ``wf`` (:mod:`environments.checks`): (``base`` or ``candidate``,
    ``ran`` or ``restored``), in the order logged."""
    found = []
    for _, message in worker_lines(stack, wf):
        if message.startswith("setup of "):
            tree = "candidate" if "candidate's tree" in message else "base"
            found.append((tree, "ran" if "ran the recipe's setup commands" in message else "restored"))
    return found
