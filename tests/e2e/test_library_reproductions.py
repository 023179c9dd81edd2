"""Command and test reproductions, end to end: two libraries of our own with no server at all
(:mod:`tests.support.library_projects`: a pip library with ``humanize``, an npm library with ``is-number``, both
installed from the registries by the recipe's setup), onboarded with ``durafix dev onboard`` and sent four reports
each through the webhooks on the embedded stack:

1. a bug shown by a ``command`` block and 2. a bug shown by a ``test`` block (the reporter's test file in its
   ``files``): each reproduced in the sandbox on the base (no app provisioned), repaired by the scripted model,
   verified (the recipe's tests, then the reproduction replayed on the candidate: the command's output right,
   the named test passing), approved by the reviewer through the review API and merged: one ticket, one branch,
   one PR, the fix on ``main`` (read through PyGithub and a real clone);
3. a ``command`` block whose two runs disagree: inconclusive, triage, no model request;
4. the first bug reported again once its fix is merged: it passes on the base, so the run ends in honest triage
   and its ticket, read from the forge, says it did not reproduce.

And a command report on a recipe whose setup has no network ends naming that cause, as a browser run's does.

One stack and one worker serve both libraries; the worker's dependency cache is built once per library.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from temporalio.client import Client

from environments.command_repro import SandboxReproduction
from environments.reproduction import TestProcedure, extract_reproduction
from environments.spec import load_recipe
from pipeline import client as runs
from pipeline.ids import branch_for, workflow_id_for
from pipeline.services import Services
from pipeline.state import Outcome, RunState, TriageReason
from tests.conftest import require
from tests.e2e.test_cli import Cli
from tests.e2e.test_pipeline import awaiting_review, file_on_main, finished, footprint, state_when
from tests.e2e.test_real_projects import entries_of, model_requests, ticket_of
from tests.support.e2e_stack import E2EStack, owned_processes, running_e2e_stack
from tests.support.library_projects import (
    LIBRARIES,
    STAT_RECIPE,
    STAT_SETUP,
    STATKIT_LIBRARY,
    Bug,
    Library,
    Report,
    build_library,
    model_script,
)

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


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("library", LIBRARIES, ids=lambda lib: lib.name)
async def test_a_library_merges_fixes_for_command_and_test_reports_and_triages_the_rest_honestly(
    stack: E2EStack, library: Library, tmp_path: Path
) -> None:
    cli = Cli(stack.state_dir)
    services = Services(stack.config)
    assert services.setup.cache is not None
    checkout = build_library(library, tmp_path)
    recipe = load_recipe(checkout)
    onboarded = cli.json("dev", "onboard", str(checkout), "--receiver-url", stack.receiver.url)
    repository = onboarded["repository"]
    owner_token = onboarded["tokens"]["owner"]["token"]
    client = await runs.connect(stack.config)
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

    # Setup ran once for the library (the first workspace that needed it); every later one restored it.
    [(_, record)] = entries_of(services.setup.cache, repository)
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
