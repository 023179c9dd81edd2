"""Teams and team memberships: GitHub's answers (validated against githubkit's 2022-11-28 models), read with
unmodified PyGithub where it has the call, and by the adapter's membership read (``GitHubForge.is_team_member``)."""

from __future__ import annotations

from typing import Any

import githubkit_schemas.v2022_11_28.models as gh_models
import httpx
import pytest
from github import Auth, Github, UnknownObjectException
from pydantic import SecretStr

from infra.forge.testing import ForgeHandle
from reviews.adapter import GitHubForge
from reviews.config import ForgeConfig


def call(forge: ForgeHandle, method: str, path: str, token: str, body: Any = None) -> httpx.Response:
    headers = {"Authorization": f"token {token}", "Accept": "application/vnd.github+json"}
    return forge.http.request(method, forge.api_url + path, json=body, headers=headers)


@pytest.fixture
def org(forge: ForgeHandle) -> dict[str, str]:
    """Organisation ``acme`` owned by ``owner``, ``member`` a member of it, ``outsider`` not; a repository."""
    tokens = {login: forge.create_user(login) for login in ("owner", "member", "outsider")}
    forge.create_org("acme", "owner")
    forge.add_org_member("acme", "member")
    forge.create_repo(tokens["owner"], "app", owner="acme")
    return tokens


def test_a_created_team_and_its_memberships_have_githubs_shapes(forge: ForgeHandle, org: dict[str, str]) -> None:
    created = call(forge, "POST", "/orgs/acme/teams", org["owner"], {"name": "Release Managers"})
    assert created.status_code == 201, created.text
    team = gh_models.TeamFull.model_validate(created.json())
    assert (team.slug, team.name, team.organization.login) == ("release-managers", "Release Managers", "acme")

    added = call(forge, "PUT", "/orgs/acme/teams/release-managers/memberships/member", org["owner"], {})
    assert added.status_code == 200, added.text
    membership = gh_models.TeamMembership.model_validate(added.json())
    assert (membership.role, membership.state) == ("member", "active")

    read = call(forge, "GET", "/orgs/acme/teams/release-managers/memberships/member", org["member"])
    assert read.status_code == 200 and read.json() == added.json()
    # The creator is the team's maintainer, as on GitHub.
    creator = call(forge, "GET", "/orgs/acme/teams/release-managers/memberships/owner", org["member"])
    assert (creator.json()["role"], creator.json()["state"]) == ("maintainer", "active")
    again = call(forge, "POST", "/orgs/acme/teams", org["owner"], {"name": "release managers"})
    assert again.status_code == 422 and again.json()["errors"][0]["code"] == "already_exists"


def test_membership_reads_answer_404_for_non_members_missing_teams_and_outsiders(
    forge: ForgeHandle, org: dict[str, str]
) -> None:
    forge.create_team(org["owner"], "acme", "core")
    assert call(forge, "GET", "/orgs/acme/teams/core/memberships/member", org["owner"]).status_code == 404
    assert call(forge, "GET", "/orgs/acme/teams/nope/memberships/member", org["owner"]).status_code == 404
    forge.add_team_member(org["owner"], "acme", "core", "member")
    # Someone outside the organisation cannot see its teams at all.
    assert call(forge, "GET", "/orgs/acme/teams/core/memberships/member", org["outsider"]).status_code == 404
    assert call(forge, "GET", "/orgs/acme/teams/core", org["outsider"]).status_code == 404
    # Only an owner or a maintainer of the team adds members.
    refused = call(forge, "PUT", "/orgs/acme/teams/core/memberships/owner", org["member"], {"role": "member"})
    assert refused.status_code == 403
    assert call(forge, "DELETE", "/orgs/acme/teams/core/memberships/member", org["owner"]).status_code == 204
    assert call(forge, "GET", "/orgs/acme/teams/core/memberships/member", org["owner"]).status_code == 404


def test_a_user_outside_the_organisation_is_pending_until_they_join(forge: ForgeHandle, org: dict[str, str]) -> None:
    forge.create_team(org["owner"], "acme", "core")
    invited = forge.add_team_member(org["owner"], "acme", "core", "outsider")
    assert invited["state"] == "pending"
    forge.add_org_member("acme", "outsider")
    joined = call(forge, "GET", "/orgs/acme/teams/core/memberships/outsider", org["owner"]).json()
    assert joined["state"] == "active"


def test_pygithub_reads_the_team_by_slug(forge: ForgeHandle, org: dict[str, str]) -> None:
    created = forge.create_team(org["owner"], "acme", "core")
    gh = Github(base_url=forge.api_url, auth=Auth.Token(org["member"]), retry=None)
    team = gh.get_organization("acme").get_team_by_slug("core")
    assert (team.id, team.slug, team.members_count) == (created["id"], "core", 1)
    with pytest.raises(UnknownObjectException):
        gh.get_organization("acme").get_team_by_slug("missing")


def test_the_adapter_counts_only_active_memberships(forge: ForgeHandle, org: dict[str, str]) -> None:
    forge.create_team(org["owner"], "acme", "core")
    forge.add_team_member(org["owner"], "acme", "core", "member")
    forge.add_team_member(org["owner"], "acme", "core", "outsider")  # invited, pending
    config = ForgeConfig(api_url=forge.api_url, token=SecretStr(org["owner"]), repository="acme/app", git_url="unused")
    with GitHubForge(config) as adapter:
        assert adapter.is_team_member("acme/core", "member")
        assert adapter.is_team_member("acme/core", "owner")
        assert not adapter.is_team_member("acme/core", "outsider")
        assert not adapter.is_team_member("acme/missing", "member")
        assert not adapter.is_team_member("acme/core", "nobody-at-all")
