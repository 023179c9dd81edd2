"""Users, tokens, repositories, permissions, error bodies, pagination and rate-limit headers."""

from __future__ import annotations

import httpx
import pytest
from github import Auth, BadCredentialsException, Github, GithubException, UnknownObjectException

from infra.forge.testing import ForgeHandle
from tests.support.forge import Team, client


def test_token_identifies_its_user(forge: ForgeHandle) -> None:
    token = forge.create_user("dora", email="dora@example.org")
    me = client(forge, token).get_user()
    assert (me.login, me.email) == ("dora", "dora@example.org")


def test_bad_token_is_401_bad_credentials(forge: ForgeHandle) -> None:
    with pytest.raises(BadCredentialsException) as err:
        client(forge, "ghp_not_a_token").get_user().login  # noqa: B018 - the property fetches
    assert err.value.status == 401
    assert err.value.data["message"] == "Bad credentials"


def test_anonymous_caller_gets_requires_authentication(forge: ForgeHandle) -> None:
    resp = httpx.get(f"{forge.api_url}/user")
    assert resp.status_code == 401
    assert resp.json()["message"] == "Requires authentication"
    assert "documentation_url" in resp.json()


def test_admin_endpoints_need_the_admin_token(forge: ForgeHandle) -> None:
    token = forge.create_user("eve")
    resp = httpx.post(
        f"{forge.api_url}/admin/users", json={"login": "mallory"}, headers={"Authorization": f"token {token}"}
    )
    assert resp.status_code == 404


def test_creating_an_existing_user_is_422(forge: ForgeHandle) -> None:
    forge.create_user("dora")
    resp = httpx.post(
        f"{forge.api_url}/admin/users", json={"login": "dora"}, headers={"Authorization": f"Bearer {forge.admin_token}"}
    )
    assert resp.status_code == 422
    assert resp.json()["errors"] == [{"resource": "User", "code": "already_exists", "field": "login"}]


def test_auto_init_repo_has_readme_commit_on_main(team: Team) -> None:
    repo = team.shop
    assert repo.default_branch == "main"
    assert repo.html_url == f"{team.forge.base_url}/alice/shop"
    assert repo.clone_url == f"{team.forge.base_url}/alice/shop.git"
    readme = repo.get_git_tree(repo.get_branch("main").commit.sha).tree
    assert [e.path for e in readme] == ["README.md"]


def test_second_repo_with_same_name_is_422(team: Team) -> None:
    with pytest.raises(GithubException) as err:
        team.gh(team.alice).get_user().create_repo("shop")
    assert err.value.status == 422
    assert err.value.data["errors"][0]["message"] == "name already exists on this account"


def test_private_repo_is_404_for_outsiders_and_visible_to_collaborators(team: Team) -> None:
    team.forge.create_repo(team.alice, "secret", private=True)
    with pytest.raises(UnknownObjectException) as err:
        team.gh(team.carol).get_repo("alice/secret")
    assert err.value.status == 404
    assert httpx.get(f"{team.forge.api_url}/repos/alice/secret").status_code == 404
    team.forge.add_collaborator(team.alice, "alice/secret", "carol", "pull")
    assert team.gh(team.carol).get_repo("alice/secret").private is True


def test_reader_cannot_mutate_and_gets_403(team: Team) -> None:
    repo = team.gh(team.carol).get_repo("alice/shop")
    with pytest.raises(GithubException) as err:
        repo.create_git_ref("refs/heads/x", repo.get_branch("main").commit.sha)
    assert err.value.status == 403
    with pytest.raises(GithubException) as err:
        repo.create_hook("web", {"url": "http://127.0.0.1:9/", "content_type": "json"})
    assert err.value.status == 403
    assert err.value.data["message"] == "Must have admin rights to Repository."


def test_collaborator_permission_levels(team: Team) -> None:
    repo = team.shop
    assert repo.get_collaborator_permission("bob") == "write"
    assert repo.get_collaborator_permission("carol") == "none"
    repo.add_to_collaborators("carol", "admin")
    assert repo.get_collaborator_permission("carol") == "admin"
    assert repo.has_in_collaborators("carol")
    assert {c.login for c in repo.get_collaborators()} == {"alice", "bob", "carol"}
    repo.remove_from_collaborators("carol")
    assert not repo.has_in_collaborators("carol")


def test_org_repos_are_administered_by_org_owners(forge: ForgeHandle) -> None:
    token = forge.create_user("olga")
    forge.create_org("acme", admin="olga")
    created = forge.create_repo(token, "tool", owner="acme")
    assert created["full_name"] == "acme/tool"
    assert created["organization"]["login"] == "acme"
    repo = client(forge, token).get_repo("acme/tool")
    assert repo.permissions.admin is True


def test_malformed_json_is_400(team: Team) -> None:
    resp = httpx.post(
        f"{team.forge.api_url}/repos/alice/shop/issues",
        content=b"{not json",
        headers={"Authorization": f"token {team.alice}"},
    )
    assert resp.status_code == 400
    assert resp.json()["message"] == "Problems parsing JSON"


def test_invalid_field_is_422_with_errors(team: Team) -> None:
    resp = httpx.post(
        f"{team.forge.api_url}/repos/alice/shop/issues",
        json={"title": 7},
        headers={"Authorization": f"token {team.alice}"},
    )
    assert resp.status_code == 422
    assert resp.json()["message"] == "Validation Failed"
    assert resp.json()["errors"] == [{"resource": "Issue", "code": "invalid", "field": "title"}]


def test_unknown_route_is_404_not_found(forge: ForgeHandle) -> None:
    resp = httpx.get(f"{forge.api_url}/no/such/thing")
    assert resp.status_code == 404
    assert resp.json()["message"] == "Not Found"


def test_oversized_api_body_is_413(team: Team) -> None:
    resp = httpx.post(
        f"{team.forge.api_url}/repos/alice/shop/issues",
        content=b"x" * (25 * 1024 * 1024 + 1),
        headers={"Authorization": f"token {team.alice}"},
    )
    assert resp.status_code == 413


def test_every_api_answer_carries_rate_limit_headers(team: Team) -> None:
    headers = {"Authorization": f"token {team.alice}"}
    first = httpx.get(f"{team.forge.api_url}/user", headers=headers)
    second = httpx.get(f"{team.forge.api_url}/nope", headers=headers)
    for resp in (first, second):
        for name in ("limit", "remaining", "reset", "used", "resource"):
            assert f"x-ratelimit-{name}" in resp.headers
    assert int(second.headers["x-ratelimit-used"]) == int(first.headers["x-ratelimit-used"]) + 1
    assert first.headers["x-ratelimit-resource"] == "core"


def test_pagination_follows_link_headers(team: Team) -> None:
    repo = team.shop
    for i in range(7):
        repo.create_issue(f"issue {i}")
    resp = httpx.get(
        f"{team.forge.api_url}/repos/alice/shop/issues?per_page=3&page=2",
        headers={"Authorization": f"token {team.alice}"},
    )
    assert len(resp.json()) == 3
    assert 'rel="next"' in resp.headers["link"] and 'rel="prev"' in resp.headers["link"]
    assert "page=3" in resp.headers["link"]
    paged = Github(
        base_url=team.forge.api_url, auth=Auth.Token(team.alice), per_page=2, retry=None, seconds_between_requests=None
    )
    titles = [i.title for i in paged.get_repo("alice/shop").get_issues()]
    assert titles == [f"issue {i}" for i in reversed(range(7))]
