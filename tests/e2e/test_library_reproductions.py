"""Command and test reproductions, end to end: two libraries of our own with no server at all
(:mod:`tests.support.library_projects`: a pip library with ``humanize``, an npm library with ``is-number``, both
installed from the registries by the recipe's setup), onboarded with ``durafix dev onboard`` and sent five reports
each through the webhooks on the embedded stack:

1. a bug shown by a ``command`` block and 2. a bug shown by a ``test`` block (the reporter's test file in its
   ``files``): each reproduced in the sandbox on the base (no app provisioned), repaired by the scripted model,
   verified (the recipe's tests, then the reproduction replayed on the candidate: the command's output right,
   the named test passing), approved by the reviewer through the review API and merged: one ticket, one branch,
   one PR, the fix on ``main`` (read through PyGithub and a real clone);
3. a ``command`` block whose two runs disagree: inconclusive, triage, no model request;
4. the first bug reported again once its fix is merged: it passes on the base, so the run ends in honest triage
   and its ticket, read from the forge, says it did not reproduce;
5. a bug reported in prose only (no block), on a second copy of the library run beside the first (its runs are
   independent of the others'): the scripted model drafts a ``test`` reproduction, the first draft passes on the
   base and is refused with what its run found, the second fails there and is accepted; the repair keeps the
   drafted test, which is the regression proof of the fix, travels in the PR and lands on ``main``, and the
   evidence report shows it failing on the base and passing on the candidate.

And a command report on a recipe whose setup has no network ends naming that cause, as a browser run's does.

One stack and one worker serve both libraries, whose runs go side by side; the worker's dependency cache is built
once per repository.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from temporalio.client import Client

from environments.command_repro import SandboxReproduction
from environments.regression import ProofStatus
from environments.reproduction import TestProcedure, extract_reproduction, parse_reproduction
from environments.spec import load_recipe
from pipeline import client as runs
from pipeline.ids import branch_for, workflow_id_for
from pipeline.services import Services
from pipeline.state import Outcome, RunState, TriageReason
from tests.conftest import require
from tests.e2e.test_cli import Cli
from tests.e2e.test_pipeline import awaiting_review, file_on_main, finished, state_when
from tests.e2e.test_real_projects import entries_of, model_requests, ticket_of
from tests.support.e2e_stack import E2EStack, footprint, owned_processes, running_e2e_stack
from tests.support.library_projects import (
    LIBRARIES,
    STAT_RECIPE,
    STAT_SETUP,
    STATKIT_LIBRARY,
    Bug,
    DraftedBug,
    Library,
    build_library,
    draft_conversation,
    model_script,
)
from tests.support.real_projects import Report

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EStack]:
    """One embedded stack for both libraries, answering from their model script, with one worker."""
    for tool in ("git", "node", "npm", "python3"):
        require(shutil.which(tool) is not None, f"{tool} is not installed")
    state = tmp_path_factory.mktemp("durafix-libraries")
    with running_e2e_stack(state, model_script=model_script(state / "model-script.yaml")) as e2e:
        e2e.spawn_worker()
        yield e2e


async def open_report(stack: E2EStack, owner_token: str, repository: str, report: Report) -> tuple[int, str]:
    """The report opened by the owner with the trigger label: its issue number and its run's workflow ID."""
    owner = stack.github(owner_token).get_repo(repository)
    issue = owner.create_issue(title=report.title, body=report.body, labels=[stack.config.trigger_label]).number
    return issue, workflow_id_for(repository, issue)


def sandbox_record(stack: E2EStack, state: RunState) -> SandboxReproduction:
    """The base reproduction's stored record (``reproduce-base-reproduction.json``)."""
    assert state.reproduction is not None and state.reproduction.log_ref is not None
    assert state.reproduction.log_ref.name == "reproduce-base-reproduction.json"
    return SandboxReproduction.model_validate_json(Services(stack.config).store.read_bytes(state.reproduction.log_ref))


async def merge_fix(
    stack: E2EStack, client: Client, onboarded: dict[str, object], repository: str, bug: Bug, kind: str
) -> RunState:
    """Report ``bug``, see it reproduced in the sandbox, approve the draft PR, and check what was merged."""
    tokens = onboarded["tokens"]
    assert isinstance(tokens, dict)
    issue, wf = await open_report(stack, tokens["owner"]["token"], repository, bug.report)
    state = await state_when(client, wf, awaiting_review, timeout_s=600)
    assert state.pending_approval is not None, state.outcome_detail
    assert state.reproduction_kind == kind
    assert state.reproduction is not None and state.reproduction.status == "reproduced", state.reproduction
    assert state.environment is None, "a command or test reproduction provisions no app"
    record = sandbox_record(stack, state)
    assert record.kind == kind and record.status == "reproduced"
    reproduction = extract_reproduction(bug.report.body)
    if isinstance(reproduction, TestProcedure):
        # The recipe's test_subset ran the reporter's test file, written by the reproduction, and it failed.
        assert record.command.endswith(" ".join(reproduction.tests)), record.command
        assert record.runs[0].steps[0].exit_code not in (None, 0), record
    assert state.baseline is not None and state.baseline.passed, state.baseline
    [candidate] = state.candidates
    assert candidate.replay is not None and candidate.replay.status == "not_reproduced", candidate.replay
    assert candidate.replay.log_ref is not None and candidate.replay.log_ref.name.endswith("-reproduction.json")

    head = state.pending_approval.head_sha
    reviewer = stack.github(tokens["reviewer"]["token"]).get_repo(repository)
    pr = reviewer.get_pull(state.pending_approval.pr_number)
    assert pr.head.sha == head and pr.draft
    pr.create_review(commit=reviewer.get_commit(head), event="APPROVE", body="The reproduction passes now.")
    merged = await state_when(client, wf, finished)
    assert merged.outcome == Outcome.MERGED, merged.outcome_detail

    repo = stack.github().get_repo(repository)
    assert repo.get_pull(pr.number).merged and repo.get_pull(pr.number).merge_commit_sha == merged.merged_sha
    assert repo.get_branch("main").commit.sha == merged.merged_sha
    assert [p.number for p in repo.get_pulls(state="all") if p.head.ref == branch_for(wf)] == [pr.number]
    assert repo.get_branch(branch_for(wf)).commit.sha == head
    fp = footprint(stack, repository, wf, issue)
    assert len(fp.tickets) == 1 and fp.pull_requests == [pr.number] and fp.branches == [branch_for(wf)], fp
    path, fixed = bug.fixed
    assert fixed in file_on_main(stack, repository, path)
    assert file_on_main(stack, repository, bug.added_test)
    ticket = ticket_of(stack, repository, issue, merged)
    assert "merged" in ticket and f"(a {kind} reproduction, run in the sandbox): `reproduced`" in ticket, ticket
    assert owned_processes(wf) == []
    return merged


async def triaged(
    stack: E2EStack, client: Client, owner_token: str, repository: str, report: Report, status: str
) -> tuple[RunState, str]:
    """Report ``report`` and see the run end in triage with the base reproduction ``status``; its state and ticket."""
    issue, wf = await open_report(stack, owner_token, repository, report)
    state = await state_when(client, wf, finished, timeout_s=600)
    assert state.outcome == Outcome.NEEDS_HUMAN_TRIAGE, state.outcome_detail
    assert state.reproduction is not None and state.reproduction.status == status, state.reproduction
    assert state.candidates == [] and state.budgets.repair_attempts_used == 0
    fp = footprint(stack, repository, wf, issue)
    assert len(fp.tickets) == 1 and fp.pull_requests == [] and fp.branches == [], fp
    assert owned_processes(wf) == []
    return state, ticket_of(stack, repository, issue, state)


def draft_requests(stack: E2EStack, wf: str) -> list[dict[str, Any]]:
    """The chat requests the scripted model answered for ``wf``'s drafts (their operation ID names the run's
    ``draft-procedure`` step), in the order it answered them."""
    answer = httpx.get(f"{stack.config.model_base_url.removesuffix('/v1')}/_admin/requests", timeout=10)
    return [
        r
        for r in answer.json()
        if r["path"] == "/v1/chat/completions"
        and str(r["headers"].get("x-durafix-op-id", "")).startswith(f"{wf}:draft-procedure:")
    ]


def exit_status_cells(report_html: str) -> dict[str, str]:
    """The evidence report's "the test command's exit status" row: each side's cell text, by role."""
    row = re.search(r'<tr class="test-exit">(.*?)</tr>', report_html, re.DOTALL)
    assert row is not None, report_html
    return {
        role: html.unescape(re.sub(r"<[^>]+>", "", text)).strip()
        for role, text in re.findall(r'<td data-role="(\w+)">(.*?)</td>', row.group(1), re.DOTALL)
    }


async def merge_drafted_fix(
    stack: E2EStack, client: Client, onboarded: dict[str, Any], library: Library, bug: DraftedBug
) -> RunState:
    """Report ``bug`` in prose, see its second drafted test accepted after the first was refused, approve the PR
    and check what was merged, the ticket and the evidence report."""
    repository = onboarded["repository"]
    tokens = onboarded["tokens"]
    issue, wf = await open_report(stack, tokens["owner"]["token"], repository, bug.report)
    assert "```durafix-repro" not in bug.report.body
    state = await state_when(client, wf, awaiting_review, timeout_s=600)
    assert state.pending_approval is not None, state.outcome_detail

    # Two drafts, both test reproductions, each run on the base: the first passed there and was refused, the
    # second failed there and is the run's reproduction (no app provisioned for either).
    drafting = state.drafting
    assert drafting is not None and drafting.accepted == 2, drafting
    refused, accepted = drafting.rounds
    assert [r.round for r in drafting.rounds] == [1, 2]
    assert refused.kind == accepted.kind == "test"
    assert refused.status == "not_reproduced" and accepted.status == "reproduced", drafting
    assert accepted.described == f"the test {bug.added_test}"
    assert state.reproduction_kind == "test" and state.environment is None
    assert state.reproduction is not None and state.reproduction.status == "reproduced", state.reproduction
    assert state.reproduction.procedure_ref == accepted.procedure_ref
    assert state.reproduction.revision == state.target_revision
    store = Services(stack.config).store
    stored = [store.read_bytes(r.procedure_ref).decode() for r in drafting.rounds]
    assert [parse_reproduction(text) for text in stored] == [parse_reproduction(d) for d in bug.drafts]

    # The second request to the model held the first draft and what its run on the base found.
    asked = draft_requests(stack, wf)
    assert [(r["conversation"], r["turn"], r["status"]) for r in asked] == [
        (draft_conversation(library), 0, 200),
        (draft_conversation(library), 1, 200),
    ], asked
    messages = asked[1]["body"]["messages"]
    [submitted] = [m for m in messages if m["role"] == "assistant"]
    assert json.loads(submitted["tool_calls"][0]["function"]["arguments"]) == {"yaml": bug.drafts[0]}
    [refusal] = [m["content"] for m in messages if m["role"] == "tool"]
    assert refusal.startswith(f"error: ran on the base revision {state.target_revision[:12]}: not_reproduced"), refusal

    # The drafted test was seeded into the repair: the candidate keeps it, and it proves the fix.
    assert state.reproduction_seed is not None and state.reproduction_seed.files == [bug.added_test]
    [candidate] = state.candidates
    assert candidate.replay is not None and candidate.replay.status == "not_reproduced", candidate.replay
    assert candidate.regression is not None and candidate.regression.status == ProofStatus.PROVEN, candidate
    assert bug.added_test in candidate.regression.test_files, candidate.regression

    head = state.pending_approval.head_sha
    reviewer = stack.github(tokens["reviewer"]["token"]).get_repo(repository)
    pr = reviewer.get_pull(state.pending_approval.pr_number)
    assert pr.head.sha == head and pr.draft
    assert sorted(f.filename for f in pr.get_files()) == sorted({bug.fixed[0], bug.added_test})
    pr.create_review(commit=reviewer.get_commit(head), event="APPROVE", body="The drafted test passes now.")
    merged = await state_when(client, wf, finished)
    assert merged.outcome == Outcome.MERGED, merged.outcome_detail

    repo = stack.github().get_repo(repository)
    assert repo.get_pull(pr.number).merged and repo.get_branch("main").commit.sha == merged.merged_sha
    fp = footprint(stack, repository, wf, issue)
    assert len(fp.tickets) == 1 and fp.pull_requests == [pr.number] and fp.branches == [branch_for(wf)], fp
    path, fixed = bug.fixed
    assert fixed in file_on_main(stack, repository, path)
    accepted_test = parse_reproduction(bug.drafts[-1])
    assert isinstance(accepted_test, TestProcedure)
    assert file_on_main(stack, repository, bug.added_test) == accepted_test.files[bug.added_test]
    [merged_candidate] = merged.candidates
    assert merged_candidate.commit == head and merged_candidate.regression == candidate.regression

    ticket = ticket_of(stack, repository, issue, merged)
    assert "merged" in ticket, ticket
    assert (
        f"reproduced with the test {bug.added_test}, drafted from your report after 1 draft(s) that did not "
        "show the bug" in ticket
    ), ticket
    assert "(a test reproduction, run in the sandbox): `reproduced`" in ticket, ticket

    # The evidence report, from the evidence server as the PR's evidence comment links it: the drafted test
    # named and run on both revisions; the recipe names no test_report, so each side is judged by the test
    # command's exit status: failing on the base, passing on the candidate.
    assert merged.publish is not None and merged.publish.report_url is not None
    answer = httpx.get(merged.publish.report_url, timeout=30)
    assert answer.status_code == 200, answer.text[:300]
    report = answer.text
    assert "Reproduced with <strong>tests</strong>" in report
    command = re.search(r'<code id="test-command">(.*?)</code>', report)
    assert command is not None and html.unescape(command.group(1)).endswith(f" {bug.added_test}"), command
    assert f"<li><code>{html.escape(bug.added_test)}</code></li>" in report, "the drafted test is not named"
    assert "judged by the test command's exit status" in html.unescape(report)
    cells = exit_status_cells(report)
    assert cells.get("base") not in (None, "exit status 0") and str(cells.get("base")).startswith("exit status"), cells
    assert cells.get("candidate") == "exit status 0", cells
    assert owned_processes(wf) == []
    return merged


async def command_and_test_reports(
    stack: E2EStack, client: Client, onboarded: dict[str, Any], library: Library
) -> None:
    """Steps 1 to 4 of the module docstring on ``library``'s first copy."""
    repository = onboarded["repository"]
    owner_token = onboarded["tokens"]["owner"]["token"]
    repo = stack.github().get_repo(repository)

    # The command report is merged while a report whose runs disagree is tried beside it (no model request).
    asked = model_requests(stack)
    first, (flaky, flaky_ticket) = await asyncio.gather(
        merge_fix(stack, client, onboarded, repository, library.command_bug, "command"),
        triaged(stack, client, owner_token, repository, library.flaky, "inconclusive"),
    )
    assert flaky.reproduction is not None and "runs disagree" in flaky.reproduction.detail
    assert flaky.triage is not None and flaky.triage.reason == TriageReason.INCONCLUSIVE
    assert "needs human triage" in flaky_ticket and "disagreed" in flaky_ticket, flaky_ticket
    assert model_requests(stack) > asked

    # The test report is merged on the moved main, while the first bug is reported again: fixed, it passes.
    moved = repo.get_branch("main").commit.sha
    assert moved == first.merged_sha
    second, (again, again_ticket) = await asyncio.gather(
        merge_fix(stack, client, onboarded, repository, library.test_bug, "test"),
        triaged(stack, client, owner_token, repository, library.again, "not_reproduced"),
    )
    assert again.reproduction is not None and again.reproduction.revision == moved
    assert again.triage is not None and again.triage.reason == TriageReason.NOT_REPRODUCED
    assert "needs human triage" in again_ticket and f"did not reproduce on {moved[:12]}" in again_ticket
    assert "(a command reproduction, run in the sandbox): `not_reproduced`" in again_ticket, again_ticket
    assert second.reproduction is not None and second.reproduction.revision == moved

    assert [p.merged for p in repo.get_pulls(state="all")] == [True, True]
    path, fixed = library.test_bug.fixed
    assert fixed in file_on_main(stack, repository, path)
    assert library.command_bug.fixed[1] in file_on_main(stack, repository, library.command_bug.fixed[0])


@pytest.mark.timeout(1500)
async def test_each_library_merges_fixes_for_command_test_and_prose_reports_and_triages_the_rest_honestly(
    stack: E2EStack, tmp_path: Path
) -> None:
    """Both libraries side by side (their runs are independent), each in two copies: the first copy gets steps 1
    to 4, the second the prose report (5), so its run and merge are independent of the first copy's (no main
    moved under it) and the copies' runs go side by side too."""
    cli = Cli(stack.state_dir)
    services = Services(stack.config)
    assert services.setup.cache is not None
    onboarded: dict[str, list[dict[str, Any]]] = {}
    for library in LIBRARIES:
        copies = (library, replace(library, name=f"{library.name}-prose"))
        checkouts = [build_library(copy, tmp_path) for copy in copies]
        onboarded[library.name] = [
            cli.json("dev", "onboard", str(c), "--receiver-url", stack.receiver.url) for c in checkouts
        ]
    client = await runs.connect(stack.config)

    await asyncio.gather(
        *(
            step
            for library in LIBRARIES
            for step in (
                command_and_test_reports(stack, client, onboarded[library.name][0], library),
                merge_drafted_fix(stack, client, onboarded[library.name][1], library, library.prose_bug),
            )
        )
    )

    # Setup ran once per copy of a library (the first workspace that needed it); every later one restored it.
    for library in LIBRARIES:
        recipe = load_recipe(tmp_path / library.name)
        for copy in onboarded[library.name]:
            [(_, record)] = entries_of(services.setup.cache, copy["repository"])
            assert record.setup == recipe.setup and record.paths == [library.cached_path]


@pytest.mark.timeout(600)
async def test_a_command_reproduction_whose_setup_has_no_network_ends_naming_its_cause(
    stack: E2EStack, tmp_path: Path
) -> None:
    """The pip library with a recipe that forgot `setup_network: true` (and a pin no cache holds): the sandboxed
    reproduction's setup fails, and the run ends as a provisioned app's failing setup does: the environment
    reason, the failed command and the `setup_network` hint on the ticket, no model request, no PR."""
    offline_recipe = {k: v for k, v in STAT_RECIPE.items() if k != "setup_network"}
    commits = [
        (message, {**files, "requirements.txt": "humanize==4.10.0\n"} if "requirements.txt" in files else files)
        for message, files in STATKIT_LIBRARY.commits
        if "durafix.yaml" not in files
    ]
    library = replace(
        STATKIT_LIBRARY,
        name="statkit-offline",
        commits=[*commits, ("durafix recipe", {"durafix.yaml": yaml.safe_dump(offline_recipe, sort_keys=False)})],
    )
    checkout = build_library(library, tmp_path)
    onboarded = Cli(stack.state_dir).json("dev", "onboard", str(checkout), "--receiver-url", stack.receiver.url)
    repository = onboarded["repository"]
    client = await runs.connect(stack.config)
    asked = model_requests(stack)

    state, ticket = await triaged(
        stack, client, onboarded["tokens"]["owner"]["token"], repository, library.command_bug.report, "app_not_ready"
    )
    assert state.reproduction_kind == "command" and state.environment is None
    assert state.triage is not None and state.triage.reason == TriageReason.ENVIRONMENT_NOT_SET_UP, state.triage
    failed = state.triage.environment
    assert failed is not None and failed.stage == "setup" and failed.cause == "no-setup-network", failed
    assert failed.command == STAT_SETUP[1] and failed.log_ref is not None
    assert "`environment-not-set-up`" in ticket and "did not reproduce" not in ticket, ticket
    assert "hint: setup has no network" in ticket and "`setup_network: true`" in ticket, ticket
    assert model_requests(stack) == asked, "the model was asked about a report that was never tried"
