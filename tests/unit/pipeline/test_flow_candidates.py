"""The kinds of candidate and what depends on the kind (pipeline/flow/candidates.py).

Operation IDs and environment labels are written into workflow histories and into the forge's and the
environments' idempotency keys: these tests pin them per kind, as the workflow used before they had one place.
"""

from __future__ import annotations

import pytest

from evidence.interface import ArtifactRef
from pipeline.flow import candidates
from pipeline.flow.candidates import CandidateKind
from pipeline.state import Budgets, CandidateFact, RunState, VerificationStatus
from tests.support.artifacts import artifact_ref

WF = "repair:acme/shop#7"
HEAD = "d" * 40
BASE = "b" * 40


def patch() -> ArtifactRef:
    return artifact_ref("patch", key="sha256/" + "0" * 64, media_type="text/x-diff")


def candidate(**fields: object) -> CandidateFact:
    base = {"attempt": 2, "op_id": "op", "patch_ref": patch(), "summary": "  fix the total  ", "commit_timestamp": 1}
    return CandidateFact.model_validate(base | fields)


def state() -> RunState:
    budgets = Budgets(repair_attempts_max=3, model_token_budget=1000)
    return RunState(
        workflow_id=WF, run_id="r", repository="acme/shop", issue_number=7, base_branch="main", budgets=budgets
    )


@pytest.mark.parametrize(
    ("fields", "kind", "verify_op", "label"),
    [
        ({}, CandidateKind.ATTEMPT, f"{WF}:verify:2", "candidate-2"),
        ({"revision": 3, "reviewer": "rev"}, CandidateKind.REVISION, f"{WF}:revision-verify:3", "revision-3"),
        ({"pushed_head": HEAD}, CandidateKind.PUSHED_HEAD, f"{WF}:head-verify:{HEAD}", f"head-{HEAD[:12]}"),
        ({"base_revision": BASE}, CandidateKind.REBUILT_ON_BASE, f"{WF}:base-verify:{BASE}", f"base-{BASE[:12]}"),
    ],
)
def test_each_kind_has_its_operation_id_and_label(
    fields: dict[str, object], kind: CandidateKind, verify_op: str, label: str
) -> None:
    c = candidate(**fields)
    assert candidates.kind_of(c) == kind
    assert candidates.verify_op(WF, c) == verify_op
    assert candidates.label(c) == label


def test_a_revision_wins_over_the_other_marks_as_it_always_did() -> None:
    c = candidate(revision=1, pushed_head=HEAD, base_revision=BASE)
    assert candidates.kind_of(c) == CandidateKind.REVISION
    assert candidates.verify_op(WF, c) == f"{WF}:revision-verify:1"


def test_commit_messages_by_kind() -> None:
    s = state()
    assert candidates.commit_message(s, "Cart total", candidate(pushed_head=HEAD, summary="their own")) == "their own"
    revision = candidates.commit_message(s, "Cart total", candidate(revision=2, reviewer="rev"))
    assert revision.startswith("Revise the fix for #7 as rev asked (revision 2)") and f"Run: {WF}" in revision
    attempt = candidates.commit_message(s, "Cart total", candidate())
    rebuilt = candidates.commit_message(s, "Cart total", candidate(base_revision=BASE))
    assert attempt == rebuilt and attempt.startswith("Fix #7: Cart total\n\nfix the total\n")


def test_the_verdict_is_recorded_in_one_place() -> None:
    c = candidate()
    assert candidates.record_verdict(c, None) is True
    assert (c.verification, c.failure) == (VerificationStatus.PASSED, None)
    assert candidates.record_verdict(c, "tests failed: 1 failed") is False
    assert (c.verification, c.failure) == (VerificationStatus.FAILED, "tests failed: 1 failed")
