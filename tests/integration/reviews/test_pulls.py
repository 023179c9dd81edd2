"""Draft PRs keyed by head, readiness, reviews tied to heads, and merges enforcing the approved SHA."""

from __future__ import annotations

import pytest

from reviews.errors import ForgeConflictError, ForgePermanentError
from reviews.markers import run_branch_prefix
from tests.support.review_site import Site

RUN = "repair-bot-shop-1"
BRANCH = run_branch_prefix(RUN) + "attempt-1"


def _published(site: Site, content: str = "total = sum(prices)\n") -> str:
    sha = site.commit("cart.py", content)
    site.adapter.publish_branch(BRANCH, sha, None, site.workdir)
    return sha


def _open_prs(site: Site) -> list[int]:
    return [p.number for p in site.repo().get_pulls(state="all")]


def _reviewer(site: Site) -> str:
    token = site.handle.create_user("reviewer")
    site.handle.add_collaborator(site.token, site.full_name, "reviewer")
    return token


def test_draft_pr_is_created_once_with_the_run_marker_and_found_again(site: Site) -> None:
    sha = _published(site)

    first = site.adapter.ensure_draft_pr(RUN, BRANCH, "main", "Fix cart total", "Evidence below.")
    again = site.adapter.ensure_draft_pr(RUN, BRANCH, "main", "Fix cart total", "Evidence below.")

    assert first.created and not again.created and first.number == again.number
    assert first.draft and first.head_sha == sha and first.base_ref == "main"
    state = site.adapter.get_pr(first.number)
    assert state.run_id == RUN and state.draft and state.state == "open" and not state.merged
    assert _open_prs(site) == [first.number]


def test_pr_created_but_response_dropped_ends_with_exactly_one_pr(site: Site) -> None:
    _published(site)
    site.fault("POST", r"/repos/bot/shop/pulls$", "drop_after_apply")

    ref = site.adapter.ensure_draft_pr(RUN, BRANCH, "main", "Fix cart total", "Evidence.")

    assert site.handle.faults() == []
    assert _open_prs(site) == [ref.number]
    assert site.adapter.get_pr(ref.number).run_id == RUN


def test_overlapping_creates_resolve_already_exists_to_the_same_pr(site: Site) -> None:
    _published(site)
    # The first create is held back so the second one's lookup sees nothing and also creates.
    site.fault("POST", r"/repos/bot/shop/pulls$", "delay", seconds=1.0)
    refs = site.race(2, lambda adapter: adapter.ensure_draft_pr(RUN, BRANCH, "main", "Fix", "Body"))

    assert refs[0].number == refs[1].number
    assert _open_prs(site) == [refs[0].number]


def test_an_open_pr_for_the_branch_without_this_runs_marker_is_a_conflict(site: Site) -> None:
    _published(site)
    site.repo().create_pull(base="main", head=BRANCH, title="Someone's PR", body="by hand")

    with pytest.raises(ForgeConflictError):
        site.adapter.ensure_draft_pr(RUN, BRANCH, "main", "Fix", "Body")


def test_pr_without_commits_over_base_is_a_permanent_error(site: Site) -> None:
    main = site.adapter.get_branch_sha("main")
    assert main is not None
    site.adapter.publish_branch(BRANCH, main, None, site.workdir)

    with pytest.raises(ForgePermanentError) as raised:
        site.adapter.ensure_draft_pr(RUN, BRANCH, "main", "Fix", "Body")

    assert raised.value.status == 422 and "No commits between" in (raised.value.github_message or "")


def test_mark_ready_for_review_goes_through_graphql_and_is_idempotent(site: Site) -> None:
    _published(site)
    ref = site.adapter.ensure_draft_pr(RUN, BRANCH, "main", "Fix", "Body")

    site.adapter.mark_ready_for_review(ref.number)
    site.adapter.mark_ready_for_review(ref.number)

    assert site.adapter.get_pr(ref.number).draft is False


def test_reviews_are_reported_with_the_head_they_were_made_on(site: Site) -> None:
    first = _published(site)
    ref = site.adapter.ensure_draft_pr(RUN, BRANCH, "main", "Fix", "Body")
    site.adapter.mark_ready_for_review(ref.number)
    reviewer = _reviewer(site)
    pr_as_reviewer = site.repo(reviewer).get_pull(ref.number)
    pr_as_reviewer.create_review(commit=site.repo(reviewer).get_commit(first), body="ok", event="APPROVE")
    second = site.commit("cart.py", "total = sum(prices)  # reviewed\n", parent=first)
    site.adapter.publish_branch(BRANCH, second, first, site.workdir)

    state = site.adapter.get_pr(ref.number)

    assert state.head_sha == second
    assert [(r.user, r.state, r.commit_id) for r in state.reviews] == [("reviewer", "APPROVED", first)]
    assert state.reviews[0].submitted_at is not None


def test_merge_refuses_a_draft_then_a_moved_head_then_merges_at_the_approved_sha(site: Site) -> None:
    first = _published(site)
    ref = site.adapter.ensure_draft_pr(RUN, BRANCH, "main", "Fix", "Body")

    draft = site.adapter.merge(ref.number, first)
    site.adapter.mark_ready_for_review(ref.number)
    second = site.commit("cart.py", "total = sum(prices)  # v2\n", parent=first)
    site.adapter.publish_branch(BRANCH, second, first, site.workdir)
    stale = site.adapter.merge(ref.number, first)
    merged = site.adapter.merge(ref.number, second)
    again = site.adapter.merge(ref.number, second)

    assert draft.status == "not_mergeable" and "draft" in draft.message
    assert stale.status == "head_moved" and stale.head_sha == second
    assert merged.status == "merged" and merged.merge_commit_sha
    assert again.status == "already_merged" and again.merge_commit_sha == merged.merge_commit_sha
    assert site.adapter.get_branch_sha("main") == merged.merge_commit_sha


def test_merge_applied_but_response_dropped_reconciles_to_one_merge(site: Site) -> None:
    sha = _published(site)
    ref = site.adapter.ensure_draft_pr(RUN, BRANCH, "main", "Fix", "Body")
    site.adapter.mark_ready_for_review(ref.number)
    main_before = site.adapter.get_branch_sha("main")
    site.fault("PUT", rf"/pulls/{ref.number}/merge$", "drop_after_apply")

    result = site.adapter.merge(ref.number, sha)

    assert site.handle.faults() == []
    assert result.status == "merged" and result.reconciled and result.merge_commit_sha
    merge_commit = site.repo().get_commit(result.merge_commit_sha)
    assert [p.sha for p in merge_commit.parents] == [main_before, sha]
    assert site.adapter.get_branch_sha("main") == result.merge_commit_sha
    pull = site.repo().get_pull(ref.number)
    assert pull.merged and pull.merge_commit_sha == result.merge_commit_sha
    assert site.repo().get_branch("main").commit.sha == result.merge_commit_sha


def test_merge_by_someone_else_at_another_head_is_reported_as_such(site: Site) -> None:
    first = _published(site)
    ref = site.adapter.ensure_draft_pr(RUN, BRANCH, "main", "Fix", "Body")
    site.adapter.mark_ready_for_review(ref.number)
    second = site.commit("cart.py", "total = sum(prices)  # v2\n", parent=first)
    site.adapter.publish_branch(BRANCH, second, first, site.workdir)
    site.repo().get_pull(ref.number).merge(sha=second)

    result = site.adapter.merge(ref.number, first)

    assert result.status == "merged_at_other_head" and result.head_sha == second
