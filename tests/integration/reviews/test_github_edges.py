"""The adapter at GitHub's edges, against the emulator over HTTP through unmodified PyGithub: an empty
repository, a token without push access, merge methods a repository disallows, a base that moves during the
merge, `mergeable` before GitHub has computed it, and conditional reads."""

from __future__ import annotations

import pytest

from reviews.adapter import GitHubForge
from reviews.errors import (
    ForgeEmptyRepositoryError,
    ForgeMergeMethodError,
    ForgePermanentError,
    ForgeTransientError,
)
from reviews.markers import run_branch_prefix
from tests.support.forge import push_lands_during_merge
from tests.support.review_site import Site, make_config

RUN = "repair-bot-shop-9"
BASE_MOVED = "Base branch was modified. Review and try the merge again."


def _ready_pr(site: Site, name: str, content: str = "total = sum(prices)\n") -> tuple[int, str]:
    """A PR from a run branch `name` (one new commit on main), ready for review; its number and head."""
    branch = run_branch_prefix(RUN) + name
    sha = site.commit(f"{name}.py", content)
    site.adapter.publish_branch(branch, sha, None, site.workdir)
    ref = site.adapter.ensure_draft_pr(RUN, branch, "main", name, "Body")
    site.adapter.mark_ready_for_review(ref.number)
    return ref.number, sha


# --- an empty repository ------------------------------------------------------------------------------------


def test_an_empty_repository_has_no_branches_refuses_claims_and_takes_a_first_push(site: Site) -> None:
    site.handle.create_repo(site.token, "blank", auto_init=False)
    blank = GitHubForge(make_config(site.handle, site.token, "bot/blank", site.handle.clone_url("bot/blank")))

    assert blank.get_branch_sha("main") is None
    footprint = blank.footprint(RUN, None)
    assert (footprint.branches, footprint.claims, footprint.pull_requests) == ([], [], [])
    with pytest.raises(ForgeEmptyRepositoryError) as raised:
        blank.ensure_ticket(f"{RUN}:ticket", None, "Cart total", "Status")
    assert raised.value.status == 409 and raised.value.github_message == "Git Repository is empty."
    assert isinstance(raised.value, ForgePermanentError)
    assert list(site.github().get_repo("bot/blank").get_issues(state="all")) == []

    first = site.commit("cart.py", "total = 0\n")
    assert blank.publish_branch("main", first, None, site.workdir).status == "pushed"
    assert blank.get_branch_sha("main") == first
    assert blank.ensure_ticket(f"{RUN}:ticket", None, "Cart total", "Status").created


# --- a token without push access ----------------------------------------------------------------------------


def test_reading_permissions_with_a_token_without_push_access_is_permanent_403(site: Site) -> None:
    reader = site.handle.create_user("reader")
    site.handle.add_collaborator(site.token, site.full_name, "reader", "pull")
    with pytest.raises(ForgePermanentError) as raised:
        site.new_adapter(token=reader).get_permission("bot")
    assert raised.value.status == 403
    assert raised.value.github_message == "Must have push access to view collaborator permission."
    assert "no push access to bot/shop" in str(raised.value)


# --- merge methods the repository disallows -----------------------------------------------------------------


def test_a_repository_without_merge_commits_is_merged_by_squash(site: Site) -> None:
    site.repo().edit(allow_merge_commit=False)
    number, head = _ready_pr(site, "squashed")
    main_before = site.adapter.get_branch_sha("main")

    result = site.adapter.merge(number, head)

    assert (result.status, result.method) == ("merged", "squash")
    squash = site.repo().get_commit(result.merge_commit_sha or "")
    assert [p.sha for p in squash.parents] == [main_before]
    assert site.adapter.get_pr(number).merged


def test_a_method_named_by_the_caller_is_never_swapped(site: Site) -> None:
    site.repo().edit(allow_squash_merge=False)
    number, head = _ready_pr(site, "named")

    with pytest.raises(ForgeMergeMethodError) as raised:
        site.adapter.merge(number, head, method="squash")

    assert raised.value.status == 405
    assert raised.value.github_message == "Squash merges are not allowed on this repository."
    assert site.adapter.get_pr(number).state == "open"
    assert site.adapter.merge(number, head).method == "merge"


# --- the base moves while GitHub merges ----------------------------------------------------------------------


def test_a_push_to_the_base_during_the_merge_is_read_again_and_retried(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    number, head = _ready_pr(site, "raced")
    main = site.adapter.get_branch_sha("main")
    assert main is not None
    pushed = site.commit("pushed.txt", "landed during the merge\n", parent=main)
    site.push_as_someone_else(site.workdir, pushed, "elsewhere")
    armed = push_lands_during_merge(monkeypatch, site.handle.server.forge.repos_root / "bot" / "shop.git", pushed, main)
    result = site.adapter.merge(number, head)

    assert (result.status, result.reconciled) == ("merged", False) and not armed
    merge_commit = site.repo().get_commit(result.merge_commit_sha or "")
    assert [p.sha for p in merge_commit.parents] == [pushed, head]


def test_a_base_that_keeps_moving_is_transient_never_not_mergeable(site: Site) -> None:
    number, head = _ready_pr(site, "busy")
    site.fault("PUT", rf"/pulls/{number}/merge$", "error", status=405, message=BASE_MOVED, count=3)

    with pytest.raises(ForgeTransientError) as raised:
        site.new_adapter(merge_attempts=3).merge(number, head)

    assert raised.value.status == 405 and raised.value.github_message == BASE_MOVED
    assert site.handle.faults() == []
    assert site.adapter.get_pr(number).state == "open"
    assert site.adapter.merge(number, head).status == "merged"


# --- mergeable right after a push ----------------------------------------------------------------------------


def test_get_pr_reads_again_while_mergeable_is_still_being_computed(site: Site) -> None:
    number, head = _ready_pr(site, "computed")
    branch = run_branch_prefix(RUN) + "computed"

    second = site.commit("computed.py", "total = 2\n", parent=head)
    site.adapter.publish_branch(branch, second, head, site.workdir)
    assert site.new_adapter(mergeable_reads=1).get_pr(number).mergeable is None

    third = site.commit("computed.py", "total = 3\n", parent=second)
    site.adapter.publish_branch(branch, third, second, site.workdir)
    state = site.adapter.get_pr(number)
    assert (state.head_sha, state.mergeable) == (third, True)

    main = site.adapter.get_branch_sha("main")
    assert main is not None
    conflicting = site.commit("computed.py", "total = -1\n", parent=main)
    site.adapter.publish_branch("main", conflicting, main, site.workdir)
    assert site.adapter.get_pr(number).mergeable is False
