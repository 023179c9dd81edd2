"""Pull requests, reviews, draft state over GraphQL, and merges that write real commits."""

from __future__ import annotations

import pytest
from github import GithubException
from github.GithubObject import NotSet, Opt
from github.PullRequest import PullRequest

from tests.support.forge import Team, branch_with, commit_files


def refused_merge(pull: PullRequest, sha: str, merge_method: Opt[str] = NotSet) -> tuple[int, str]:
    """The status and message the forge refuses the merge of ``pull`` at ``sha`` with."""
    with pytest.raises(GithubException) as err:
        pull.merge(sha=sha, merge_method=merge_method)
    return err.value.status, err.value.data["message"]


def test_draft_pull_request_reads_back_with_head_base_and_mergeability(team: Team) -> None:
    repo = team.shop
    head = branch_with(repo, "fix-cart", {"cart.py": "total = 1\n"})
    created = repo.create_pull(title="Fix cart", body="Fixes #1", head="fix-cart", base="main", draft=True)
    pull = repo.get_pull(created.number)
    assert (pull.draft, pull.state, pull.merged) == (True, "open", False)
    assert (pull.head.ref, pull.head.sha, pull.head.label) == ("fix-cart", head, "alice:fix-cart")
    assert (pull.base.ref, pull.base.sha) == ("main", repo.get_branch("main").commit.sha)
    assert pull.mergeable is True
    assert (pull.commits, pull.additions, pull.changed_files) == (1, 1, 1)
    assert pull.html_url == f"{team.forge.base_url}/alice/shop/pull/{pull.number}"
    assert [f.filename for f in pull.get_files()] == ["cart.py"]
    assert [c.sha for c in pull.get_commits()] == [head]


def test_second_open_pull_for_same_head_and_base_is_422(team: Team) -> None:
    repo = team.shop
    branch_with(repo, "dup", {"a.txt": "a\n"})
    repo.create_pull(title="one", body="", head="dup", base="main")
    with pytest.raises(GithubException) as err:
        repo.create_pull(title="two", body="", head="alice:dup", base="main")
    assert (err.value.status, err.value.data["message"]) == (422, "Validation Failed")
    assert err.value.data["errors"][0]["message"] == "A pull request already exists for alice:dup."


def test_pull_without_new_commits_is_422(team: Team) -> None:
    repo = team.shop
    repo.create_git_ref("refs/heads/same", repo.get_branch("main").commit.sha)
    with pytest.raises(GithubException) as err:
        repo.create_pull(title="nothing", body="", head="same", base="main")
    assert err.value.status == 422
    assert err.value.data["errors"][0]["message"] == "No commits between main and same"


def test_pull_against_missing_branch_is_422_invalid_field(team: Team) -> None:
    with pytest.raises(GithubException) as err:
        team.shop.create_pull(title="x", body="", head="nope", base="main")
    assert err.value.data["errors"] == [{"resource": "PullRequest", "code": "invalid", "field": "head"}]


def test_list_filters_by_head_base_and_state(team: Team) -> None:
    repo = team.shop
    branch_with(repo, "a", {"a.txt": "a\n"})
    branch_with(repo, "b", {"b.txt": "b\n"})
    pull_a = repo.create_pull(title="A", body="", head="a", base="main")
    repo.create_pull(title="B", body="", head="b", base="main")
    assert [p.title for p in repo.get_pulls(head="alice:a")] == ["A"]
    assert [p.title for p in repo.get_pulls(base="main", sort="created", direction="asc")] == ["A", "B"]
    assert list(repo.get_pulls(head="someone:a")) == []
    # Without the owner GitHub ignores the filter: every pull request comes back.
    assert sorted(p.title for p in repo.get_pulls(head="a")) == ["A", "B"]
    pull_a.edit(state="closed")
    assert [p.title for p in repo.get_pulls(state="closed")] == ["A"]
    assert [p.title for p in repo.get_pulls(state="open")] == ["B"]


def test_edit_title_body_and_reopen(team: Team) -> None:
    repo = team.shop
    branch_with(repo, "e", {"e.txt": "e\n"})
    pull = repo.create_pull(title="t", body="b", head="e", base="main")
    pull.edit(title="t2", body="b2", state="closed")
    assert (repo.get_pull(pull.number).title, repo.get_pull(pull.number).state) == ("t2", "closed")
    pull.edit(state="open")
    assert repo.get_pull(pull.number).state == "open"


def test_ready_for_review_goes_through_graphql(team: Team) -> None:
    repo = team.shop
    branch_with(repo, "d", {"d.txt": "d\n"})
    pull = repo.create_pull(title="draft", body="", head="d", base="main", draft=True)
    result = pull.mark_ready_for_review()
    assert result["pullRequest"]["isDraft"] is False
    assert repo.get_pull(pull.number).draft is False
    pull.convert_to_draft()
    assert repo.get_pull(pull.number).draft is True


def test_merge_with_stale_sha_is_409_and_changes_nothing(team: Team) -> None:
    repo = team.shop
    head = branch_with(repo, "s", {"s.txt": "s\n"})
    pull = repo.create_pull(title="s", body="", head="s", base="main")
    main_before = repo.get_branch("main").commit.sha
    assert refused_merge(pull, "f" * 40) == (409, "Head branch was modified. Review and try the merge again.")
    assert repo.get_branch("main").commit.sha == main_before
    assert repo.get_pull(pull.number).merged is False
    assert pull.merge(sha=head).merged is True


def test_merging_a_draft_is_405(team: Team) -> None:
    repo = team.shop
    head = branch_with(repo, "dr", {"x.txt": "x\n"})
    pull = repo.create_pull(title="d", body="", head="dr", base="main", draft=True)
    assert refused_merge(pull, head) == (405, "Pull Request is still a draft")


def test_conflicting_pull_is_unmergeable_and_merge_is_405(team: Team) -> None:
    repo = team.shop
    head = branch_with(repo, "conflict", {"README.md": "theirs\n"})
    main = repo.get_branch("main").commit.sha
    repo.get_git_ref("heads/main").edit(commit_files(repo, main, {"README.md": "ours\n"}, "ours"))
    pull = repo.create_pull(title="c", body="", head="conflict", base="main")
    fetched = repo.get_pull(pull.number)
    assert (fetched.mergeable, fetched.mergeable_state) == (False, "dirty")
    assert refused_merge(pull, head) == (405, "Pull Request is not mergeable")


def test_merge_writes_a_real_merge_commit_and_moves_base(team: Team) -> None:
    repo = team.shop
    main = repo.get_branch("main").commit.sha
    repo.get_git_ref("heads/main").edit(commit_files(repo, main, {"other.txt": "o\n"}, "other"))
    base_before = repo.get_branch("main").commit.sha
    head = commit_files(repo, main, {"feature.txt": "f\n"}, "feature")
    repo.create_git_ref("refs/heads/feature", head)
    pull = repo.create_pull(title="Feature", body="", head="feature", base="main")
    status = pull.merge(sha=head, merge_method="merge")
    assert status.merged is True
    merge = repo.get_commit(status.sha)
    assert [p.sha for p in merge.parents] == [base_before, head]
    assert merge.commit.message.startswith(f"Merge pull request #{pull.number} from alice/feature")
    assert repo.get_branch("main").commit.sha == status.sha
    tree = {e.path for e in repo.get_git_tree(status.sha).tree}
    assert tree == {"README.md", "other.txt", "feature.txt"}
    merged = repo.get_pull(pull.number)
    assert (merged.merged, merged.state, merged.merge_commit_sha, merged.merged_by.login) == (
        True,
        "closed",
        status.sha,
        "alice",
    )
    assert refused_merge(pull, head) == (405, "Pull Request is not mergeable")


def test_squash_merge_writes_one_commit_with_a_single_parent(team: Team) -> None:
    repo = team.shop
    main = repo.get_branch("main").commit.sha
    first = commit_files(repo, main, {"one.txt": "1\n"}, "one")
    head = commit_files(repo, first, {"two.txt": "2\n"}, "two")
    repo.create_git_ref("refs/heads/squashy", head)
    pull = repo.create_pull(title="Squash me", body="", head="squashy", base="main")
    status = pull.merge(sha=head, merge_method="squash")
    squashed = repo.get_commit(status.sha)
    assert [p.sha for p in squashed.parents] == [main]
    assert squashed.commit.message.startswith(f"Squash me (#{pull.number})")
    assert {f.filename for f in squashed.files} == {"one.txt", "two.txt"}


def test_rebase_merge_is_refused_with_405(team: Team) -> None:
    repo = team.shop
    head = branch_with(repo, "rb", {"r.txt": "r\n"})
    pull = repo.create_pull(title="r", body="", head="rb", base="main")
    status, _ = refused_merge(pull, head, merge_method="rebase")
    assert status == 405


def test_reader_cannot_merge(team: Team) -> None:
    repo = team.shop
    head = branch_with(repo, "m", {"m.txt": "m\n"})
    pull = repo.create_pull(title="m", body="", head="m", base="main")
    status, _ = refused_merge(team.gh(team.carol).get_repo("alice/shop").get_pull(pull.number), head)
    assert status == 403


def test_reviews_are_tied_to_the_head_they_were_made_on(team: Team) -> None:
    repo = team.shop
    first_head = branch_with(repo, "rv", {"r.txt": "1\n"})
    pull = repo.create_pull(title="review me", body="", head="rv", base="main")
    bob_pull = team.gh(team.bob).get_repo("alice/shop").get_pull(pull.number)
    approval = bob_pull.create_review(body="lgtm", event="APPROVE")
    assert (approval.state, approval.commit_id, approval.user.login) == ("APPROVED", first_head, "bob")
    new_head = commit_files(repo, first_head, {"r.txt": "2\n"}, "more")
    repo.get_git_ref("heads/rv").edit(new_head)
    assert repo.get_pull(pull.number).head.sha == new_head
    reviews = list(repo.get_pull(pull.number).get_reviews())
    assert [(r.id, r.commit_id, r.state) for r in reviews] == [(approval.id, first_head, "APPROVED")]
    changes = bob_pull.create_review(body="one more thing", event="REQUEST_CHANGES")
    assert (changes.state, changes.commit_id) == ("CHANGES_REQUESTED", new_head)
    assert pull.get_review(changes.id).body == "one more thing"


def test_review_line_comments_are_read_back_per_review_and_per_pull(team: Team) -> None:
    repo = team.shop
    head = branch_with(repo, "lc", {"l.txt": "one\ntwo\n"})
    pull = repo.create_pull(title="line comments", body="", head="lc", base="main")
    bob_pull = team.gh(team.bob).get_repo("alice/shop").get_pull(pull.number)
    review = bob_pull.create_review(
        body="two things",
        event="REQUEST_CHANGES",
        comments=[{"path": "l.txt", "line": 2, "body": "say three"}, {"path": "l.txt", "body": "and end well"}],
    )
    assert (review.state, review.commit_id) == ("CHANGES_REQUESTED", head)
    read = list(pull.get_single_review_comments(review.id))
    assert [(c.path, c.line, c.body, c.pull_request_review_id) for c in read] == [
        ("l.txt", 2, "say three", review.id),
        ("l.txt", None, "and end well", review.id),
    ]
    assert [c.user.login for c in read] == ["bob", "bob"]
    assert [c.body for c in pull.get_review_comments()] == ["say three", "and end well"]
    with pytest.raises(GithubException) as err:
        bob_pull.create_review(body="x", event="COMMENT", comments=[{"path": "nope.txt", "line": 1, "body": "?"}])
    assert err.value.status == 422
    assert err.value.data["errors"] == ["Path could not be resolved"]
    assert [r.id for r in pull.get_reviews()] == [review.id]


def test_a_reviewer_is_asked_again_after_reviewing(team: Team) -> None:
    repo = team.shop
    branch_with(repo, "again", {"a.txt": "a\n"})
    pull = repo.create_pull(title="again", body="", head="again", base="main")
    pull.create_review_request(reviewers=["bob"])
    team.gh(team.bob).get_repo("alice/shop").get_pull(pull.number).create_review(body="no", event="REQUEST_CHANGES")
    assert [u.login for u in pull.get_review_requests()[0]] == []
    pull.create_review_request(reviewers=["bob"])
    pull.create_review_request(reviewers=["bob"])
    assert [u.login for u in pull.get_review_requests()[0]] == ["bob"]


def test_author_cannot_approve_own_pull(team: Team) -> None:
    repo = team.shop
    branch_with(repo, "own", {"o.txt": "o\n"})
    pull = repo.create_pull(title="mine", body="", head="own", base="main")
    with pytest.raises(GithubException) as err:
        pull.create_review(body="", event="APPROVE")
    assert err.value.status == 422
    assert err.value.data["errors"] == ["Can not approve your own pull request"]
    assert pull.create_review(body="note to self", event="COMMENT").state == "COMMENTED"


def test_dismissed_review_keeps_its_commit_and_changes_state(team: Team) -> None:
    repo = team.shop
    branch_with(repo, "dis", {"d.txt": "d\n"})
    pull = repo.create_pull(title="dismiss", body="", head="dis", base="main")
    review = team.gh(team.bob).get_repo("alice/shop").get_pull(pull.number).create_review(body="", event="APPROVE")
    pull.get_review(review.id).dismiss("stale approval")
    assert pull.get_review(review.id).state == "DISMISSED"
    comment = (
        team.gh(team.bob)
        .get_repo("alice/shop")
        .get_pull(pull.number)
        .create_review(body="just a note", event="COMMENT")
    )
    with pytest.raises(GithubException) as err:
        pull.get_review(comment.id).dismiss("nope")
    assert err.value.status == 422


def test_review_requests_accept_collaborators_only(team: Team) -> None:
    repo = team.shop
    branch_with(repo, "req", {"q.txt": "q\n"})
    pull = repo.create_pull(title="req", body="", head="req", base="main")
    pull.create_review_request(reviewers=["bob"])
    users, _ = pull.get_review_requests()
    assert [u.login for u in users] == ["bob"]
    with pytest.raises(GithubException) as err:
        pull.create_review_request(reviewers=["carol"])
    assert err.value.status == 422
    assert err.value.data["message"].startswith("Reviews may only be requested from collaborators.")
    team.gh(team.bob).get_repo("alice/shop").get_pull(pull.number).create_review(body="ok", event="APPROVE")
    users, _ = pull.get_review_requests()
    assert list(users) == []
