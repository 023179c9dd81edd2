"""publish_branch: conditional pushes through the git CLI, reconciled by reading the remote ref."""

from __future__ import annotations

import pytest

from reviews.errors import ForgeAmbiguousError, ForgeConflictError, ForgePermanentError
from reviews.markers import run_branch_prefix
from tests.support.review_site import Site, git

BRANCH = run_branch_prefix("repair-bot-shop-1") + "attempt-1"


def _remote_branches(site: Site) -> dict[str, str]:
    return {b.name: b.commit.sha for b in site.repo().get_branches()}


def test_publish_creates_the_branch_and_a_second_call_pushes_nothing(site: Site) -> None:
    sha = site.commit("cart.py", "total = sum(prices)\n")

    first = site.adapter.publish_branch(BRANCH, sha, None, site.workdir)
    second = site.adapter.publish_branch(BRANCH, sha, None, site.workdir)

    assert (first.status, second.status) == ("pushed", "already_current")
    assert not first.reconciled
    assert site.adapter.get_branch_sha(BRANCH) == sha
    assert _remote_branches(site)[BRANCH] == sha


def test_publish_moves_the_branch_from_the_expected_commit(site: Site) -> None:
    first = site.commit("cart.py", "total = 0\n")
    site.adapter.publish_branch(BRANCH, first, None, site.workdir)
    second = site.commit("cart.py", "total = sum(prices)\n", parent=first)

    result = site.adapter.publish_branch(BRANCH, second, first, site.workdir)

    assert result.status == "pushed"
    assert site.adapter.get_branch_sha(BRANCH) == second
    assert _remote_branches(site)[BRANCH] == second


def test_publish_refuses_when_the_remote_moved_since_the_expected_commit(site: Site) -> None:
    ours = site.commit("cart.py", "total = 0\n")
    site.adapter.publish_branch(BRANCH, ours, None, site.workdir)
    other_clone = site.clone("other")
    theirs = site.commit("cart.py", "total = -1\n", into=other_clone)
    site.push_as_someone_else(other_clone, theirs, BRANCH)
    next_commit = site.commit("cart.py", "total = sum(prices)\n", parent=ours)

    with pytest.raises(ForgeConflictError):
        site.adapter.publish_branch(BRANCH, next_commit, ours, site.workdir)
    with pytest.raises(ForgeConflictError):
        site.adapter.publish_branch(BRANCH, next_commit, None, site.workdir)

    assert site.adapter.get_branch_sha(BRANCH) == theirs
    assert _remote_branches(site)[BRANCH] == theirs


def test_push_applied_but_response_dropped_ends_with_one_branch_at_the_commit(site: Site) -> None:
    sha = site.commit("cart.py", "total = sum(prices)\n")
    site.fault("POST", r"/bot/shop\.git/git-receive-pack$", "drop_after_apply")

    result = site.adapter.publish_branch(BRANCH, sha, None, site.workdir)

    assert site.handle.faults() == []
    assert result.status == "pushed" and result.reconciled
    branches = _remote_branches(site)
    assert branches[BRANCH] == sha
    assert sorted(branches) == sorted(["main", BRANCH])


def test_push_failing_before_it_applied_is_sent_again(site: Site) -> None:
    sha = site.commit("cart.py", "total = sum(prices)\n")
    site.fault("POST", r"/bot/shop\.git/git-receive-pack$", "status", status=502)

    result = site.adapter.publish_branch(BRANCH, sha, None, site.workdir)

    assert result.status == "pushed" and result.reconciled
    assert site.adapter.get_branch_sha(BRANCH) == sha
    assert _remote_branches(site)[BRANCH] == sha


def test_push_failing_every_time_is_ambiguous_not_silently_dropped(site: Site) -> None:
    sha = site.commit("cart.py", "total = sum(prices)\n")
    site.fault("POST", r"/bot/shop\.git/git-receive-pack$", "status", status=503, count=5)

    with pytest.raises(ForgeAmbiguousError):
        site.new_adapter(push_attempts=2).publish_branch(BRANCH, sha, None, site.workdir)

    assert site.adapter.get_branch_sha(BRANCH) is None
    assert BRANCH not in _remote_branches(site)


def test_push_without_permission_is_permanent_and_the_token_is_never_written_or_echoed(site: Site) -> None:
    # mallory can read the public repository over REST but may not push to it.
    mallory = site.handle.create_user("mallory")
    sha = site.commit("cart.py", "total = sum(prices)\n")

    with pytest.raises(ForgePermanentError) as raised:
        site.new_adapter(token=mallory).publish_branch(BRANCH, sha, None, site.workdir)

    assert mallory not in str(raised.value)
    config_text = (site.workdir / ".git" / "config").read_text()
    assert mallory not in config_text and site.token not in config_text
    assert site.adapter.get_branch_sha(BRANCH) is None
    assert BRANCH not in _remote_branches(site)


def test_a_commit_missing_from_the_local_repository_is_permanent(site: Site) -> None:
    with pytest.raises(ForgePermanentError):
        site.adapter.publish_branch(BRANCH, "1" * 40, None, site.workdir)


def test_successful_push_leaves_no_token_in_the_local_repository(site: Site) -> None:
    sha = site.commit("cart.py", "total = sum(prices)\n")
    site.adapter.publish_branch(BRANCH, sha, None, site.workdir)

    assert site.token not in (site.workdir / ".git" / "config").read_text()
    assert site.token not in git(site.workdir, "config", "--list", "--show-origin")
