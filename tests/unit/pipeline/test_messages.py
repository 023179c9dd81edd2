"""The texts a run writes to the forge: subjects end on a word, the PR closes its issue, the ticket's
first line matches whether the run is still working."""

from __future__ import annotations

import pytest

from pipeline import messages
from pipeline.state import Budgets, CandidateFact, EnvironmentFailureFact, Outcome, RunState, TriageFact, TriageReason
from tests.integration.workflow.test_workflow_logic import ref


def state(**update: object) -> RunState:
    base = RunState(
        workflow_id="repair:acme/shop#12",
        run_id="r",
        repository="acme/shop",
        issue_number=12,
        base_branch="main",
        budgets=Budgets(repair_attempts_max=3, model_token_budget=1000),
    )
    return base.model_copy(update=update)


@pytest.mark.parametrize(
    ("title", "subject"),
    [
        ("Cart total ignores quantities", "Fix #12: Cart total ignores quantities"),
        (
            "The cart total shown at checkout ignores the quantity of every line item entirely",
            "Fix #12: The cart total shown at checkout ignores the quantity of every",
        ),
        ("x" * 100, "Fix #12: " + "x" * 63),
        ("A  title\nwith\tbreaks", "Fix #12: A title with breaks"),
    ],
)
def test_commit_subjects_are_one_line_of_at_most_72_characters_ending_on_a_word(title: str, subject: str) -> None:
    first = messages.commit_message(state(), title, "summary").splitlines()[0]
    assert first == subject
    assert len(first) <= messages.SUBJECT_LIMIT


def test_the_pr_body_closes_the_issue_unless_the_keyword_is_empty() -> None:
    candidate = CandidateFact(attempt=1, op_id="o", patch_ref=ref("patch"), summary="fixed", commit_timestamp=0)
    assert messages.pr_body(state(), candidate).startswith("Fixes #12\n\n")
    assert messages.pr_body(state(), candidate, "Closes").startswith("Closes #12\n\n")
    assert "#12\n\nAutomated" not in messages.pr_body(state(), candidate, "")


def test_the_ticket_says_working_until_an_outcome_and_finished_after() -> None:
    assert "is working on this report" in messages.ticket_body(state())
    done = messages.ticket_body(state(outcome=Outcome.MERGED, merged_sha="m" * 40))
    assert "has finished with this report" in done and "working" not in done


def test_a_triage_reason_is_said_with_the_failed_command_its_log_and_the_hint() -> None:
    log = ref("environment.log")
    failure = EnvironmentFailureFact(
        stage="start",
        command="node `which server`.js",
        log_ref=log,
        log_url="https://evidence.example/a/log",
        cause="not-listening",
        hint="nothing answered on the app's port",
    )
    ended = state(
        outcome=Outcome.NEEDS_HUMAN_TRIAGE,
        triage=TriageFact(reason=TriageReason.ENVIRONMENT_NOT_SET_UP, environment=failure),
    )
    body = messages.ticket_body(ended)
    assert "- reason: **the environment could not be set up, so the report was not tried**" in body
    # A command holding backticks stays one code span.
    assert "- failed: start command ``node `which server`.js`` never became ready" in body
    assert f"- log: [environment.log](https://evidence.example/a/log) (sha256 `{log.sha256}`)" in body
    assert "- hint: nothing answered on the app's port" in body
    timed_out = failure.model_copy(update={"stage": "setup", "command": "npm ci", "log_url": ""})
    assert messages.failed_command_text(timed_out) == "setup command `npm ci` timed out"
    # No command named: the recipe declares none (an app needed from a recipe without `start`).
    undeclared = EnvironmentFailureFact(stage="start", command="", cause="no-app", hint="add `start`")
    assert messages.failed_command_text(undeclared) == "durafix.yaml declares no `start`"
    no_app = messages.ticket_body(
        state(
            outcome=Outcome.NEEDS_HUMAN_TRIAGE,
            triage=TriageFact(reason=TriageReason.ENVIRONMENT_NOT_SET_UP, environment=undeclared),
        )
    )
    assert "- failed: durafix.yaml declares no `start`" in no_app and "- hint: add `start`" in no_app
    assert "- log:" not in no_app
    plain = messages.ticket_body(
        state(outcome=Outcome.NEEDS_HUMAN_TRIAGE, triage=TriageFact(reason=TriageReason.NOT_REPRODUCED))
    )
    assert "(`not-reproduced`)" in plain and "- failed:" not in plain and "- hint:" not in plain
