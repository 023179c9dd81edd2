"""The kinds of candidate a run verifies, and what depends on the kind: its operation IDs, its label, its
commit message, and the one place its verdict is recorded."""

from __future__ import annotations

from enum import StrEnum

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pipeline import messages, revisions
    from pipeline.ids import op_id
    from pipeline.state import CandidateFact, RunState, VerificationStatus


class CandidateKind(StrEnum):
    """Where a candidate came from. The order of :func:`kind_of`'s tests is the order of precedence."""

    REVISION = "revision"  # a revision on review (``revision`` >= 1)
    PUSHED_HEAD = "pushed-head"  # a head pushed to the run's branch by someone else
    REBUILT_ON_BASE = "rebuilt-on-base"  # the head under review rebuilt on the base branch's new head
    ATTEMPT = "attempt"  # a repair attempt's patch


def kind_of(candidate: CandidateFact) -> CandidateKind:
    if candidate.revision:
        return CandidateKind.REVISION
    if candidate.pushed_head:
        return CandidateKind.PUSHED_HEAD
    if candidate.base_revision:
        return CandidateKind.REBUILT_ON_BASE
    return CandidateKind.ATTEMPT


def verify_op(wf: str, candidate: CandidateFact) -> str:
    """The operation ID of ``candidate``'s verification (recorded in histories: never change one)."""
    kind = kind_of(candidate)
    if kind == CandidateKind.REVISION:
        return op_id(wf, "revision-verify", candidate.revision)
    if kind == CandidateKind.PUSHED_HEAD:
        return f"{op_id(wf, 'head-verify')}:{candidate.pushed_head}"
    if kind == CandidateKind.REBUILT_ON_BASE:
        return f"{op_id(wf, 'base-verify')}:{candidate.base_revision}"
    return op_id(wf, "verify", candidate.attempt)


def label(candidate: CandidateFact) -> str:
    """The label of ``candidate``'s replay environment (part of its operation IDs)."""
    kind = kind_of(candidate)
    if kind == CandidateKind.REVISION:
        return f"revision-{candidate.revision}"
    if kind == CandidateKind.PUSHED_HEAD:
        return f"head-{(candidate.pushed_head or '')[:12]}"
    if kind == CandidateKind.REBUILT_ON_BASE:
        return f"base-{(candidate.base_revision or '')[:12]}"
    return f"candidate-{candidate.attempt}"


def commit_message(state: RunState, title: str, candidate: CandidateFact) -> str:
    """The message of the commit made of ``candidate``."""
    kind = kind_of(candidate)
    # A pushed head keeps its own message (its verification commit is not pushed); a rebuilt head and a
    # repair attempt share the run's message. The pushed head is tested first, as it always was.
    if candidate.pushed_head:
        return candidate.summary
    if kind == CandidateKind.REVISION:
        return revisions.revision_commit_message(
            state.issue_number,
            state.workflow_id,
            candidate.revision,
            candidate.reviewer or "a reviewer",
            candidate.summary,
        )
    return messages.commit_message(state, title, candidate.summary)


def record_verdict(candidate: CandidateFact, failure: str | None) -> bool:
    """The one place a candidate's verdict is recorded: passed when ``failure`` is None. Returns whether it passed."""
    candidate.verification = VerificationStatus.PASSED if failure is None else VerificationStatus.FAILED
    candidate.failure = failure
    return failure is None
