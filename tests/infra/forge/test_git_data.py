"""Git data over REST: blobs, trees, commits, refs as atomic claims, repository commits and statuses."""

from __future__ import annotations

import base64

import httpx
import pytest
from github import GithubException, InputGitAuthor, InputGitTreeElement, UnknownObjectException
from github.Repository import Repository

from tests.support.forge import Team


def _commit_file(repo: Repository, parent_sha: str, path: str, content: str, message: str) -> str:
    blob = repo.create_git_blob(content, "utf-8")
    base = repo.get_git_tree(parent_sha)
    tree = repo.create_git_tree([InputGitTreeElement(path, "100644", "blob", sha=blob.sha)], base_tree=base)
    return repo.create_git_commit(message, tree, [repo.get_git_commit(parent_sha)]).sha


def test_blob_round_trips_in_utf8_and_base64(team: Team) -> None:
    repo = team.shop
    text = repo.create_git_blob("héllo\n", "utf-8")
    binary = repo.create_git_blob(base64.b64encode(b"\x00\xff").decode(), "base64")
    assert base64.b64decode(repo.get_git_blob(text.sha).content) == "héllo\n".encode()
    assert base64.b64decode(repo.get_git_blob(binary.sha).content) == b"\x00\xff"
    assert repo.get_git_blob(binary.sha).size == 2


def test_tree_with_base_tree_keeps_existing_files_and_nests_paths(team: Team) -> None:
    repo = team.shop
    main = repo.get_branch("main").commit.sha
    tree = repo.create_git_tree(
        [InputGitTreeElement("src/app/main.py", "100644", "blob", content="print(1)\n")],
        base_tree=repo.get_git_tree(main),
    )
    paths = {e.path for e in repo.get_git_tree(tree.sha, recursive=True).tree}
    assert paths == {"README.md", "src", "src/app", "src/app/main.py"}


def test_tree_entry_with_null_sha_deletes_the_file(team: Team) -> None:
    repo = team.shop
    main = repo.get_branch("main").commit.sha
    tree = repo.create_git_tree(
        [InputGitTreeElement("README.md", "100644", "blob", sha=None)], base_tree=repo.get_git_tree(main)
    )
    assert repo.get_git_tree(tree.sha).tree == []


def test_commit_keeps_given_author_and_parents(team: Team) -> None:
    repo = team.shop
    main = repo.get_branch("main").commit.sha
    tree = repo.get_git_tree(main)
    author = InputGitAuthor("Ada", "ada@example.com", "2024-05-01T10:00:00Z")
    commit = repo.create_git_commit("msg\n", tree, [repo.get_git_commit(main)], author=author)
    fetched = repo.get_git_commit(commit.sha)
    assert (fetched.author.name, fetched.author.email) == ("Ada", "ada@example.com")
    assert fetched.author.date.isoformat() == "2024-05-01T10:00:00+00:00"
    assert [p.sha for p in fetched.parents] == [main]
    assert fetched.message == "msg\n"


def test_creating_an_existing_ref_is_422_reference_already_exists(team: Team) -> None:
    repo = team.shop
    main = repo.get_branch("main").commit.sha
    repo.create_git_ref("refs/heads/feature", main)
    with pytest.raises(GithubException) as err:
        repo.create_git_ref("refs/heads/feature", main)
    assert (err.value.status, err.value.data["message"]) == (422, "Reference already exists")


def test_claim_refs_outside_heads_are_exclusive(team: Team) -> None:
    repo = team.shop
    main = repo.get_branch("main").commit.sha
    claim = repo.create_git_ref("refs/durafix/claims/wf-1", main)
    assert claim.ref == "refs/durafix/claims/wf-1"
    bob_repo = team.gh(team.bob).get_repo("alice/shop")
    with pytest.raises(GithubException) as err:
        bob_repo.create_git_ref("refs/durafix/claims/wf-1", main)
    assert err.value.status == 422
    assert [r.ref for r in repo.get_git_matching_refs("durafix/claims/")] == ["refs/durafix/claims/wf-1"]
    assert repo.get_git_ref("durafix/claims/wf-1").object.sha == main
    claim.delete()
    with pytest.raises(UnknownObjectException):
        repo.get_git_ref("durafix/claims/wf-1").object  # noqa: B018 - the property fetches


def test_non_fast_forward_update_is_422_unless_forced(team: Team) -> None:
    repo = team.shop
    main = repo.get_branch("main").commit.sha
    first = _commit_file(repo, main, "a.txt", "a\n", "a")
    sibling = _commit_file(repo, main, "b.txt", "b\n", "b")
    ref = repo.create_git_ref("refs/heads/topic", first)
    with pytest.raises(GithubException) as err:
        ref.edit(sibling)
    assert (err.value.status, err.value.data["message"]) == (422, "Update is not a fast forward")
    assert repo.get_git_ref("heads/topic").object.sha == first
    ref.edit(sibling, force=True)
    assert repo.get_git_ref("heads/topic").object.sha == sibling


def test_fast_forward_update_moves_the_ref(team: Team) -> None:
    repo = team.shop
    main = repo.get_branch("main").commit.sha
    child = _commit_file(repo, main, "c.txt", "c\n", "c")
    repo.get_git_ref("heads/main").edit(child)
    assert repo.get_branch("main").commit.sha == child


def test_ref_to_unknown_object_is_422(team: Team) -> None:
    with pytest.raises(GithubException) as err:
        team.shop.create_git_ref("refs/heads/x", "1" * 40)
    assert err.value.status == 422


def test_repository_commit_lists_files_and_stats(team: Team) -> None:
    repo = team.shop
    main = repo.get_branch("main").commit.sha
    child = _commit_file(repo, main, "notes.txt", "one\ntwo\n", "notes")
    commit = repo.get_commit(child)
    assert [(f.filename, f.status, f.additions) for f in commit.files] == [("notes.txt", "added", 2)]
    assert commit.stats.additions == 2
    assert commit.parents[0].sha == main
    assert [c.sha for c in repo.get_commits(sha=child)] == [child, main]


def test_statuses_combine_to_the_latest_per_context(team: Team) -> None:
    repo = team.shop
    commit = repo.get_commit(repo.get_branch("main").commit.sha)
    commit.create_status("pending", context="ci")
    commit.create_status("success", target_url="http://ci.example/1", description="ok", context="ci")
    commit.create_status("success", context="lint")
    combined = commit.get_combined_status()
    assert combined.state == "success"
    assert {s.context for s in combined.statuses} == {"ci", "lint"}
    assert [s.state for s in commit.get_statuses()] == ["success", "success", "pending"]
    commit.create_status("failure", context="lint")
    assert commit.get_combined_status().state == "failure"


def test_status_for_unknown_commit_is_422(team: Team) -> None:
    resp = httpx.post(
        f"{team.forge.api_url}/repos/alice/shop/statuses/{'2' * 40}",
        json={"state": "success"},
        headers={"Authorization": f"token {team.alice}"},
    )
    assert resp.status_code == 422
    assert resp.json()["message"] == f"No commit found for SHA: {'2' * 40}"
