"""Issues, labels and comments through PyGithub."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from github import GithubException, UnknownObjectException

from tests.support.forge import Team


def test_created_issue_reads_back_with_labels_and_urls(team: Team) -> None:
    repo = team.shop
    issue = repo.create_issue("Cart total wrong", body="Steps: add two items", labels=["bug"])
    fetched = repo.get_issue(issue.number)
    assert (fetched.title, fetched.body, fetched.state) == ("Cart total wrong", "Steps: add two items", "open")
    assert [label.name for label in fetched.labels] == ["bug"]
    assert fetched.user.login == "alice"
    assert fetched.html_url == f"{team.forge.base_url}/alice/shop/issues/{issue.number}"


def test_issue_numbers_are_sequential_per_repository(team: Team) -> None:
    repo = team.shop
    assert [repo.create_issue(f"n{i}").number for i in range(3)] == [1, 2, 3]


def test_unknown_issue_is_404(team: Team) -> None:
    with pytest.raises(UnknownObjectException):
        team.shop.get_issue(99)


def test_list_filters_by_state_labels_creator_and_since(team: Team) -> None:
    repo = team.shop
    first = repo.create_issue("first", labels=["bug"])
    team.gh(team.bob).get_repo("alice/shop").create_issue("from bob", labels=["bug", "ui"])
    closed = repo.create_issue("closed one")
    closed.edit(state="closed")
    assert [i.title for i in repo.get_issues()] == ["from bob", "first"]
    assert [i.title for i in repo.get_issues(state="closed")] == ["closed one"]
    assert len(list(repo.get_issues(state="all"))) == 3
    assert [i.title for i in repo.get_issues(labels=["bug", "ui"])] == ["from bob"]
    assert [i.title for i in repo.get_issues(creator=team.gh(team.alice).get_user("bob"))] == ["from bob"]
    future = datetime.now(UTC) + timedelta(hours=1)
    assert list(repo.get_issues(since=future)) == []
    assert first.number in {i.number for i in repo.get_issues(since=datetime.now(UTC) - timedelta(hours=1))}


def test_close_and_reopen_track_state_reason_and_closer(team: Team) -> None:
    issue = team.shop.create_issue("flaky")
    issue.edit(state="closed", state_reason="not_planned")
    closed = team.shop.get_issue(issue.number)
    assert closed.closed_by is not None
    assert (closed.state, closed.state_reason, closed.closed_by.login) == ("closed", "not_planned", "alice")
    assert closed.closed_at is not None
    issue.edit(state="open")
    reopened = team.shop.get_issue(issue.number)
    assert (reopened.state, reopened.state_reason) == ("open", "reopened")
    assert reopened.closed_at is None


def test_edit_title_and_body(team: Team) -> None:
    issue = team.shop.create_issue("old", body="old body")
    issue.edit(title="new", body="new body")
    assert (team.shop.get_issue(issue.number).title, issue.body) == ("new", "new body")


def test_outsider_cannot_edit_someone_elses_issue(team: Team) -> None:
    issue = team.shop.create_issue("mine")
    with pytest.raises(GithubException) as err:
        team.gh(team.carol).get_repo("alice/shop").get_issue(issue.number).edit(title="theirs")
    assert err.value.status == 403


def test_labels_add_remove_and_replace(team: Team) -> None:
    issue = team.shop.create_issue("labels")
    issue.add_to_labels("bug", "triage")
    assert sorted(label.name for label in issue.get_labels()) == ["bug", "triage"]
    issue.remove_from_labels("bug")
    assert [label.name for label in issue.get_labels()] == ["triage"]
    issue.set_labels("durafix", "ready")
    assert sorted(label.name for label in issue.get_labels()) == ["durafix", "ready"]
    with pytest.raises(GithubException) as err:
        issue.remove_from_labels("absent")
    assert (err.value.status, err.value.data["message"]) == (404, "Label does not exist")
    issue.delete_labels()
    assert list(issue.get_labels()) == []
    assert {label.name for label in team.shop.get_labels()} >= {"bug", "triage", "durafix", "ready"}


def test_comments_create_list_get_edit_delete(team: Team) -> None:
    issue = team.shop.create_issue("talk")
    first = issue.create_comment("first")
    second = team.gh(team.bob).get_repo("alice/shop").get_issue(issue.number).create_comment("second")
    assert [c.body for c in issue.get_comments()] == ["first", "second"]
    assert issue.get_comment(second.id).user.login == "bob"
    first.edit("first, edited")
    assert issue.get_comment(first.id).body == "first, edited"
    assert team.shop.get_issue(issue.number).comments == 2
    first.delete()
    assert [c.body for c in issue.get_comments()] == ["second"]
    with pytest.raises(UnknownObjectException):
        issue.get_comment(first.id)


def test_only_the_author_or_a_writer_may_edit_a_comment(team: Team) -> None:
    issue = team.shop.create_issue("talk")
    comment = team.gh(team.carol).get_repo("alice/shop").get_issue(issue.number).create_comment("carol says")
    bob_view = team.gh(team.bob).get_repo("alice/shop").get_issue(issue.number).get_comment(comment.id)
    bob_view.edit("moderated")
    other = issue.create_comment("alice says")
    with pytest.raises(GithubException) as err:
        team.gh(team.carol).get_repo("alice/shop").get_issue(issue.number).get_comment(other.id).edit("hijack")
    assert err.value.status == 403
