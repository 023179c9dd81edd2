"""GitHub's answers at the edges real repositories meet, through unmodified PyGithub (and httpx where the wire
itself is the point): empty repositories, who may read permissions, merge settings, a base that moves during a
merge, ``mergeable`` before GitHub has computed it, and conditional GETs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from github import GithubException, InputGitTreeElement
from github.PullRequest import PullRequest
from github.Repository import Repository

from tests.support.forge import Team, branch_with, commit_files, git, push_lands_during_merge

EMPTY = (409, "Git Repository is empty.")


def _answer(call: Callable[[], Any]) -> tuple[int, str]:
    with pytest.raises(GithubException) as err:
        call()
    return err.value.status, err.value.data["message"]


# --- an empty repository ------------------------------------------------------------------------------------

EMPTY_CALLS: dict[str, Callable[[Repository], Any]] = {
    "get ref": lambda r: r.get_git_ref("heads/main"),
    "list refs": lambda r: list(r.get_git_refs()),
    "matching refs": lambda r: list(r.get_git_matching_refs("heads/")),
    "create blob": lambda r: r.create_git_blob("x", "utf-8"),
    "create tree": lambda r: r.create_git_tree([InputGitTreeElement("a", "100644", "blob", content="a")]),
    "get tree": lambda r: r.get_git_tree("main"),
    "create ref": lambda r: r.create_git_ref("refs/heads/x", "0" * 40),
    "get git commit": lambda r: r.get_git_commit("0" * 40),
    "list commits": lambda r: list(r.get_commits()),
    "get commit": lambda r: r.get_commit("main"),
}


@pytest.mark.parametrize("call", sorted(EMPTY_CALLS))
def test_git_data_on_an_empty_repository_is_409(team: Team, call: str) -> None:
    team.forge.create_repo(team.alice, "blank", auto_init=False)
    repo = team.gh(team.alice).get_repo("alice/blank")
    assert _answer(lambda: EMPTY_CALLS[call](repo)) == EMPTY


def test_an_empty_repository_lists_no_branches_and_works_once_something_is_pushed(team: Team, tmp_path: Path) -> None:
    team.forge.create_repo(team.alice, "blank", auto_init=False)
    repo = team.gh(team.alice).get_repo("alice/blank")
    assert list(repo.get_branches()) == []
    wc = tmp_path / "wc"
    git("init", "-q", "-b", "main", str(wc))
    (wc / "a.txt").write_text("a\n")
    git("add", "a.txt", cwd=wc)
    git("commit", "-q", "-m", "first", cwd=wc)
    git("push", "-q", team.forge.clone_url("alice/blank", team.alice), "main", cwd=wc)
    head = git("rev-parse", "HEAD", cwd=wc).stdout.strip()
    assert repo.get_git_ref("heads/main").object.sha == head
    assert [c.sha for c in repo.get_commits()] == [head]


# --- who may read collaborator permissions -------------------------------------------------------------------


def _permission_of(team: Team, token: str, login: str) -> Callable[[], str]:
    repo = team.gh(token).get_repo("alice/shop")
    return lambda: repo.get_collaborator_permission(login)


def test_reading_a_permission_needs_push_access(team: Team) -> None:
    team.forge.create_user("rita")
    team.forge.add_collaborator(team.alice, "alice/shop", "rita", "pull")
    reader = team.forge.create_token("rita")
    message = "Must have push access to view collaborator permission."
    for token in (team.carol, reader):
        assert _answer(_permission_of(team, token, "bob")) == (403, message)
    assert team.gh(team.bob).get_repo("alice/shop").get_collaborator_permission("rita") == "read"
    anonymous = httpx.get(f"{team.forge.api_url}/repos/alice/shop/collaborators/bob/permission")
    assert anonymous.status_code == 401


def test_listing_collaborators_needs_push_access(team: Team) -> None:
    repo = team.gh(team.carol).get_repo("alice/shop")
    assert _answer(lambda: list(repo.get_collaborators())) == (
        403,
        "Must have push access to view repository collaborators.",
    )


# --- merge settings ------------------------------------------------------------------------------------------


def _pull(repo: Repository, branch: str) -> tuple[int, str]:
    head = branch_with(repo, branch, {f"{branch}.txt": "x\n"})
    return repo.create_pull(title=branch, body="", head=branch, base="main").number, head


def test_a_merge_method_the_repository_disallows_is_405(team: Team) -> None:
    repo = team.shop
    repo.edit(allow_merge_commit=False)
    settings = team.shop
    assert (settings.allow_merge_commit, settings.allow_squash_merge, settings.allow_rebase_merge) == (
        False,
        True,
        False,
    )
    number, head = _pull(repo, "squash-only")
    pull = repo.get_pull(number)
    assert _answer(lambda: pull.merge(sha=head, merge_method="merge")) == (
        405,
        "Merge commits are not allowed on this repository.",
    )
    assert _answer(lambda: pull.merge(sha=head, merge_method="rebase")) == (
        405,
        "Rebase merges are not allowed on this repository.",
    )
    assert repo.get_pull(number).state == "open"
    squashed = pull.merge(sha=head, merge_method="squash")
    assert squashed.merged and len(repo.get_commit(squashed.sha).parents) == 1

    repo.edit(allow_merge_commit=True, allow_squash_merge=False)
    number, head = _pull(repo, "merge-only")
    assert _answer(lambda: repo.get_pull(number).merge(sha=head, merge_method="squash")) == (
        405,
        "Squash merges are not allowed on this repository.",
    )


def test_merge_settings_keep_one_method_need_admin_and_can_be_set_at_creation(team: Team) -> None:
    repo = team.shop
    with pytest.raises(GithubException) as none_left:
        repo.edit(allow_merge_commit=False, allow_squash_merge=False)
    assert none_left.value.status == 422
    assert "at least one merge strategy" in none_left.value.data["errors"][0]["message"]
    with pytest.raises(GithubException) as rebase:
        repo.edit(allow_rebase_merge=True)
    assert rebase.value.status == 422
    with pytest.raises(GithubException) as writer:
        team.gh(team.bob).get_repo("alice/shop").edit(allow_squash_merge=False)
    assert (writer.value.status, writer.value.data["message"]) == (403, "Must have admin rights to Repository.")
    created = team.gh(team.alice).get_user().create_repo("squashy", allow_merge_commit=False, auto_init=True)
    assert (created.allow_merge_commit, created.allow_squash_merge) == (False, True)


# --- the base moves while GitHub merges ----------------------------------------------------------------------


def test_a_push_to_the_base_during_a_merge_is_405_base_branch_modified_and_changes_nothing(
    team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = team.shop
    number, head = _pull(repo, "raced")
    main = repo.get_branch("main").commit.sha
    pushed = commit_files(repo, main, {"pushed.txt": "p\n"}, "pushed while merging")
    push_lands_during_merge(monkeypatch, team.forge.server.forge.repos_root / "alice" / "shop.git", pushed, main)
    pull = repo.get_pull(number)
    assert _answer(lambda: pull.merge(sha=head)) == (405, "Base branch was modified. Review and try the merge again.")
    assert repo.get_branch("main").commit.sha == pushed and repo.get_pull(number).state == "open"

    merged = repo.get_pull(number).merge(sha=head)
    assert [p.sha for p in repo.get_commit(merged.sha).parents] == [pushed, head]


# --- mergeable before GitHub has computed it -----------------------------------------------------------------


def _mergeable(pull: PullRequest) -> tuple[bool | None, str]:
    """``mergeable`` as sent (PyGithub types it as a plain bool) and ``mergeable_state``."""
    return pull.raw_data["mergeable"], pull.mergeable_state


def _two_reads(repo: Repository, number: int) -> list[tuple[bool | None, str]]:
    return [_mergeable(repo.get_pull(number).complete()) for _ in range(2)]


def test_mergeable_is_null_until_computed_after_each_push_to_head_or_base(team: Team) -> None:
    repo = team.shop
    head = branch_with(repo, "topic", {"topic.txt": "1\n"})
    created = repo.create_pull(title="t", body="", head="topic", base="main")
    assert _mergeable(created) == (None, "unknown")
    assert _mergeable(repo.get_pull(created.number).complete()) == (True, "clean")

    repo.get_git_ref("heads/topic").edit(commit_files(repo, head, {"topic.txt": "2\n"}, "second"))
    assert _two_reads(repo, created.number) == [(None, "unknown"), (True, "clean")]

    main = repo.get_branch("main").commit.sha
    repo.get_git_ref("heads/main").edit(commit_files(repo, main, {"topic.txt": "base\n"}, "conflicting base"))
    assert _two_reads(repo, created.number) == [(None, "unknown"), (False, "dirty")]


def test_webhook_payloads_carry_mergeable_as_known_when_they_are_sent(team: Team) -> None:
    repo = team.shop
    repo.create_hook("web", {"url": "http://127.0.0.1:9/", "content_type": "json"}, ["pull_request"], active=True)
    head = branch_with(repo, "hooked", {"h.txt": "1\n"})
    pull = repo.create_pull(title="h", body="", head="hooked", base="main")
    repo.get_pull(pull.number)
    repo.get_git_ref("heads/hooked").edit(commit_files(repo, head, {"h.txt": "2\n"}, "second"))
    sent = team.forge.wait_for_deliveries()
    pulls = {d["action"]: json.loads(d["request"]["body"]) for d in sent if d["event"] == "pull_request"}
    assert pulls["opened"]["pull_request"]["mergeable"] is None
    assert pulls["synchronize"]["pull_request"]["mergeable"] is None


# --- conditional GETs ----------------------------------------------------------------------------------------


def test_a_get_carries_an_etag_and_if_none_match_answers_304_without_counting(team: Team) -> None:
    url = f"{team.forge.api_url}/repos/alice/shop/issues?state=all"
    auth = {"Authorization": f"token {team.alice}"}
    first = httpx.get(url, headers=auth)
    etag = first.headers["etag"]
    assert etag.startswith('W/"') and first.headers["cache-control"].startswith("private")
    assert "Authorization" in first.headers["vary"]

    again = httpx.get(url, headers={**auth, "If-None-Match": etag})
    assert (again.status_code, again.content, again.headers["etag"]) == (304, b"", etag)
    assert again.headers["x-ratelimit-used"] == first.headers["x-ratelimit-used"]
    assert httpx.get(url, headers={**auth, "If-None-Match": f'"other", {etag.removeprefix("W/")}'}).status_code == 304
    assert httpx.get(url, headers={**auth, "If-None-Match": "*"}).status_code == 304

    team.shop.create_issue("new")
    changed = httpx.get(url, headers={**auth, "If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag
    assert int(changed.headers["x-ratelimit-used"]) > int(first.headers["x-ratelimit-used"])


def test_pygithub_update_is_a_conditional_get(team: Team) -> None:
    issue = team.shop.create_issue("watched")
    watched = team.shop.get_issue(issue.number)
    assert watched.etag is not None
    assert watched.update() is False
    issue.edit(title="watched, renamed")
    assert watched.update() is True and watched.title == "watched, renamed"


def test_mutations_and_errors_carry_no_etag(team: Team) -> None:
    auth = {"Authorization": f"token {team.alice}"}
    created = httpx.post(f"{team.forge.api_url}/repos/alice/shop/issues", json={"title": "x"}, headers=auth)
    missing = httpx.get(f"{team.forge.api_url}/repos/alice/shop/issues/99", headers=auth)
    assert created.status_code == 201 and "etag" not in created.headers
    assert missing.status_code == 404 and "etag" not in missing.headers
