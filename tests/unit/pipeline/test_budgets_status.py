"""Budgets: how the workflow counts a run's model spending (:mod:`pipeline.accounting`), what it costs with a
price table (:mod:`pipeline.pricing`, the ``DURAFIX_MODEL_PRICES`` setting), and what ``durafix status``
says of them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError

from environments.reproduction import ReproductionKind
from pipeline import accounting
from pipeline.cli.spending import budget_lines, cost_json
from pipeline.cli.status import state_summary
from pipeline.config import load_config
from pipeline.failures import FailureClass
from pipeline.policies import RunPolicy
from pipeline.pricing import ModelPrice, run_cost
from pipeline.state import (
    RECENT_CALLS,
    Budgets,
    CandidateFact,
    DeliveryKind,
    DeliveryRecord,
    DraftingFact,
    DraftRoundFact,
    HeadPushFact,
    HeadPushStatus,
    Phase,
    ReproductionFact,
    ReproductionOutcome,
    ReproductionSeedFact,
    RunState,
    VerificationStatus,
)
from pipeline.steps import AgentToolsResult, AgentTurnResult
from tests.support.artifacts import artifact_ref

TRANSCRIPT = artifact_ref(
    "t.json", key="other/00/t.json", media_type="application/json", created_at="2026-05-09T12:00:00Z"
)
PRICES = {"m": ModelPrice(prompt=2.0, completion=8.0)}


def answer(prompt: int, completion: int, retries: int = 0, model: str = "m") -> AgentTurnResult:
    return AgentTurnResult(
        transcript_ref=TRANSCRIPT,
        calls=[],
        prompt_tokens=prompt,
        completion_tokens=completion,
        model=model,
        transport_retries=retries,
    )


def budgets() -> Budgets:
    return Budgets(repair_attempts_max=3, model_token_budget=200_000)


def spent_run() -> Budgets:
    """Attempt 1: two turns (the second retried twice on the transport), one invalid call, a refusal;
    attempt 2: one turn."""
    b = budgets()
    b.repair_attempts_used = 2
    accounting.charge_turn(b, 1, 1, answer(1000, 100))
    accounting.charge_turn(b, 1, 2, answer(2000, 200, retries=2))
    accounting.count_tools(b, 1, AgentToolsResult(transcript_ref=TRANSCRIPT, invalid_calls=1))
    accounting.count_no_patch(b, FailureClass.NO_PATCH.error("no patch", {}, {"no_patch": "refused"}))
    accounting.charge_turn(b, 2, 1, answer(500_000, 50_000))
    return b


def test_tokens_are_kept_per_call_per_attempt_and_per_run_and_the_counts_apart() -> None:
    b = spent_run()

    assert (b.model_prompt_tokens, b.model_completion_tokens) == (503_000, 50_300)
    assert [(u.attempt, u.calls, u.prompt_tokens, u.completion_tokens) for u in b.attempts] == [
        (1, 2, 3000, 300),
        (2, 1, 500_000, 50_000),
    ]
    assert [(c.attempt, c.turn, c.transport_retries) for c in b.recent_calls] == [(1, 1, 0), (1, 2, 2), (2, 1, 0)]
    assert (b.transport_retries, b.invalid_tool_calls, b.refusals, b.no_op_patches) == (2, 1, 1, 0)
    assert b.attempts[0].invalid_tool_calls == 1 and b.attempts[0].transport_retries == 2
    assert b.repair_attempts_used == 2 and b.model == "m"


def test_only_the_latest_calls_are_kept_while_the_attempt_totals_keep_every_call() -> None:
    b = budgets()
    for turn in range(1, RECENT_CALLS + 6):
        accounting.charge_turn(b, 1, turn, answer(10, 1))

    assert [c.turn for c in b.recent_calls] == list(range(6, RECENT_CALLS + 6))
    assert b.attempts[0].calls == RECENT_CALLS + 5 and b.model_prompt_tokens == 10 * (RECENT_CALLS + 5)


def test_a_final_failure_charges_its_tokens_and_transport_failures_and_names_its_no_patch_kind() -> None:
    b = budgets()
    storm = FailureClass.TRANSIENT.error(
        "model: 503", {"prompt_tokens": 40, "completion_tokens": 4, "transport_failures": 6}
    )
    accounting.charge_failure(b, storm, attempt=1)
    accounting.charge_failure(b, FailureClass.PERMANENT.error("recorded before the count", {"prompt_tokens": 1}))
    accounting.count_no_patch(b, FailureClass.NO_PATCH.error("unchanged", {}, {"no_patch": "no-op"}))
    accounting.count_no_patch(b, ApplicationError("recorded before kinds", {}, type="NoPatch"))

    assert (b.model_prompt_tokens, b.model_completion_tokens, b.transport_retries) == (41, 4, 6)
    assert (b.attempts[0].prompt_tokens, b.attempts[0].transport_retries) == (40, 6)
    assert (b.no_op_patches, b.refusals) == (1, 1)
    assert accounting.is_transport_failure(storm)
    assert not accounting.is_transport_failure(FailureClass.NO_PATCH.error("no"))


def test_the_outage_wait_doubles_up_to_its_maximum_and_the_allowance_bounds_one_outage() -> None:
    policy = RunPolicy(outage_backoff_s=30, outage_backoff_max_s=100, model_outage_allowance_s=300)

    assert [accounting.outage_wait(policy, n) for n in range(5)] == [30, 60, 100, 100, 100]
    assert accounting.outage_wait(policy, 10_000) == 100
    assert not accounting.outage_spent(policy, down_s=200, wait_s=100)
    assert accounting.outage_spent(policy, down_s=201, wait_s=100)


def test_a_price_table_gives_the_cost_of_the_run_and_of_each_attempt() -> None:
    cost = run_cost(spent_run(), PRICES)

    # 503,000 prompt tokens at 2 per million, 50,300 completion tokens at 8 per million.
    assert cost.run == pytest.approx(1.006 + 0.4024)
    assert cost.attempts == {1: pytest.approx(0.006 + 0.0024), 2: pytest.approx(1.0 + 0.4)}
    assert cost.unknown == ""


def test_without_a_table_or_a_price_for_the_model_the_cost_is_unknown_and_says_why() -> None:
    assert run_cost(spent_run(), None).model_dump() == {
        "run": None,
        "attempts": {},
        "unknown": "no price table (DURAFIX_MODEL_PRICES)",
    }
    other = run_cost(spent_run(), {"gpt-4o": ModelPrice(prompt=1, completion=1)})
    assert other.run is None and other.unknown == "no price for model m in the price table"
    assert run_cost(budgets(), PRICES).run == 0.0  # nothing spent costs nothing


def test_the_price_table_is_read_from_the_setting_and_a_misspelt_price_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURAFIX_MODEL_PRICES", '{"m": {"prompt": 2.0, "completion": 8.0}}')
    assert load_config(tmp_path).model_prices == PRICES

    monkeypatch.setenv("DURAFIX_MODEL_PRICES", '{"m": {"prompt": 2.0, "completions": 8.0}}')
    with pytest.raises(ValidationError, match="completions"):
        load_config(tmp_path)

    monkeypatch.delenv("DURAFIX_MODEL_PRICES")
    assert load_config(tmp_path).model_prices == {}


def test_status_shows_every_budget_the_calls_and_the_cost() -> None:
    b = spent_run()
    b.outage_waits, b.outage_wait_s = 1, 30.0

    assert budget_lines(b, PRICES) == [
        "budgets    repair 2/3; tokens 553300/200000 (503000 prompt + 50300 completion)",
        "model      m; transport retries 2 (1 outage wait(s), 30 s); refusals 1; no-op patches 0; invalid tool calls 1",
        "tokens a1   3300 (3000 prompt + 300 completion) over 2 call(s); transport retries 2; "
        "invalid tool calls 1; cost 0.0084",
        "tokens a2   550000 (500000 prompt + 50000 completion) over 1 call(s); transport retries 0; "
        "invalid tool calls 0; cost 1.4000",
        "calls      latest first: a2/t1 500000+50000, a1/t2 2000+200 (2 retried), a1/t1 1000+100",
        "cost       1.4084",
    ]
    assert cost_json(b, PRICES)["run"] == pytest.approx(1.4084)


def test_status_of_a_run_without_a_price_table_says_the_cost_is_unknown() -> None:
    state = RunState(
        workflow_id="repair:acme/shop#1", run_id="r" * 16, repository="acme/shop", issue_number=1,
        base_branch="main", budgets=budgets(),
    )  # fmt: skip

    summary = state_summary(state, None)

    assert "budgets    repair 0/3; tokens 0/200000 (0 prompt + 0 completion)" in summary
    assert "model      no answer yet; transport retries 0; refusals 0; no-op patches 0; invalid tool calls 0" in summary
    assert "cost       unknown: no price table (DURAFIX_MODEL_PRICES)" in summary
    assert "\ncalls " not in summary and "\ntokens a" not in summary
    assert cost_json(state.budgets) == {"run": None, "attempts": {}, "unknown": "no price table (DURAFIX_MODEL_PRICES)"}


def test_status_says_which_checks_run_side_by_side_beside_the_phase() -> None:
    state = RunState(
        workflow_id="repair:acme/shop#1", run_id="r" * 16, repository="acme/shop", issue_number=1,
        base_branch="main", budgets=budgets(), phase=Phase.REPRODUCE,
        checks_beside=["base reproduction", "baseline"],
    )  # fmt: skip

    assert "; phase reproduce (side by side: base reproduction, baseline)\n" in state_summary(state, None)
    state.checks_beside = []
    assert "side by side" not in state_summary(state, None)


def test_status_names_each_pushed_head_and_its_verdict_and_the_webhooks_the_run_handled() -> None:
    at = datetime(2026, 5, 9, 12, 0, tzinfo=UTC)
    state = RunState(
        workflow_id="repair:acme/shop#1", run_id="r" * 16, repository="acme/shop", issue_number=1,
        base_branch="main", budgets=budgets(),
    )  # fmt: skip
    state.head_pushes.append(
        HeadPushFact(
            head_sha="a" * 40, pusher="maint", source="webhook:g-1", seen_at=at,
            status=HeadPushStatus.FAILED, detail="tests failed: 1 failed",
        )
    )  # fmt: skip
    state.deliveries.append(
        DeliveryRecord(
            delivery="g-2", attempt="x", kind=DeliveryKind.APPROVAL, what="approved b by rev", at=at,
            phase=Phase.AWAITING_REVIEW,
        )
    )  # fmt: skip

    summary = state_summary(state, None)

    assert "pushed     aaaaaaaaaaaa by maint (webhook:g-1): failed; tests failed: 1 failed" in summary
    assert "webhooks   1 delivered; last approval: approved b by rev" in summary


def test_status_says_how_the_report_was_reproduced_and_what_each_candidate_is() -> None:
    """The reproduction's kind and whether the model drafted it; the test it seeded into the repair; a rebuilt
    head and a pushed head by what they are, not as an "attempt 0"."""
    state = RunState(
        workflow_id="repair:acme/lib#3", run_id="r" * 16, repository="acme/lib", issue_number=3,
        base_branch="main", budgets=budgets(), reproduction_kind=ReproductionKind.TEST,
    )  # fmt: skip
    state.reproduction = ReproductionFact(
        op_id="o", revision="a" * 40, status=ReproductionOutcome.REPRODUCED, procedure_ref=TRANSCRIPT
    )
    draft = DraftRoundFact(round=2, procedure_ref=TRANSCRIPT, kind=ReproductionKind.TEST)
    state.drafting = DraftingFact(rounds=[draft], max_rounds=3, accepted=2)
    state.reproduction_seed = ReproductionSeedFact(op_id="s", patch_ref=TRANSCRIPT, files=["tests/test_issue.py"])
    state.candidates = [
        CandidateFact(attempt=1, op_id="a1", patch_ref=TRANSCRIPT, summary="fix", commit_timestamp=0,
                      commit="c" * 40, verification=VerificationStatus.PASSED),
        CandidateFact(attempt=0, op_id="b", patch_ref=TRANSCRIPT, summary="fix", commit_timestamp=0,
                      commit="d" * 40, verification=VerificationStatus.PASSED, rebuilt_from="c" * 40,
                      base_revision="e" * 40),
        CandidateFact(attempt=0, op_id="h", patch_ref=TRANSCRIPT, summary="theirs", commit_timestamp=0,
                      pushed_head="f" * 40, pushed_by="maint"),
    ]  # fmt: skip

    summary = state_summary(state, None)

    assert (
        "reproduce  reproduced on aaaaaaaaaaaa (a test reproduction, drafted from the report: round 2 of 3)" in summary
    )
    assert "seeded     tests/test_issue.py: the reproduction's test, in every attempt and the PR" in summary
    assert f"attempt 1  passed; commit {'c' * 40}" in summary
    assert f"rebuilt    cccccccccccc on the moved base eeeeeeeeeeee: passed; commit {'d' * 40}" in summary
    assert "head       ffffffffffff pushed by maint: pending; commit -" in summary
    assert "attempt 0" not in summary

    # While no draft has shown the bug, each round says what its run on the base found.
    state.reproduction, state.reproduction_seed, state.candidates = None, None, []
    refused = DraftRoundFact(
        round=1, procedure_ref=TRANSCRIPT, kind=ReproductionKind.COMMAND,
        status=ReproductionOutcome.NOT_REPRODUCED, detail="every check held in no run",
    )  # fmt: skip
    state.drafting = DraftingFact(rounds=[refused], max_rounds=3)
    assert "draft 1    a command reproduction: not_reproduced; every check held in no run" in state_summary(state, None)
