"""get_permission reads a user's permission on the repository the way GitHub names it, and fails classified."""

from __future__ import annotations

import pytest

from reviews.adapter import REPO_PERMISSIONS, REPO_ROLES, role_at_least
from reviews.errors import ForgeNotFoundError, ForgePermanentError, ForgeTransientError
from tests.support.review_site import Site

PERMISSION_PATH = r"/repos/bot/shop/collaborators/{login}/permission$"


def _user(site: Site, login: str, role: str | None) -> str:
    """A user of the forge; with ``role``, a collaborator of the site's repository holding it."""
    site.handle.create_user(login)
    if role is not None:
        site.handle.add_collaborator(site.token, site.full_name, login, role)
    return login


# A collaborator's role as granted (None: not a collaborator), GitHub's legacy permission name for it (what
# get_permission reads), and the role get_role reads, which tells triage from read and maintain from write.
GRANTED = [
    ("admin", "admin", "admin"),
    ("maintain", "write", "maintain"),
    ("push", "write", "write"),
    ("triage", "read", "triage"),
    ("pull", "read", "read"),
    (None, "none", "none"),
]


@pytest.mark.parametrize(("role", "permission", "read_role"), GRANTED)
def test_permission_is_githubs_legacy_name_of_the_users_role_and_role_tells_them_apart(
    site: Site, role: str | None, permission: str, read_role: str
) -> None:
    login = _user(site, "someone", role)
    assert site.adapter.get_permission(login) == permission
    assert site.adapter.get_role(login) == read_role


def test_the_owner_is_admin_and_the_values_are_ordered_least_first(site: Site) -> None:
    assert site.adapter.get_permission("bot") == "admin"
    assert REPO_PERMISSIONS == ("none", "read", "write", "admin")


def test_a_user_that_does_not_exist_is_not_found(site: Site) -> None:
    with pytest.raises(ForgeNotFoundError) as raised:
        site.adapter.get_permission("ghost")
    assert raised.value.status == 404


def test_a_repository_the_token_cannot_see_is_not_found(site: Site) -> None:
    _user(site, "writer", "push")
    secret_token = site.handle.create_user("alice")
    site.handle.create_repo(secret_token, "vault", private=True)
    with pytest.raises(ForgeNotFoundError):
        site.new_adapter(repository="alice/vault").get_permission("writer")


def test_bad_credentials_are_permanent(site: Site) -> None:
    with pytest.raises(ForgePermanentError) as raised:
        site.new_adapter(token="ghp_" + "0" * 36).get_permission("bot")
    assert raised.value.status == 401


def test_an_unavailable_forge_is_transient_and_the_next_read_answers(site: Site) -> None:
    site.fault("GET", PERMISSION_PATH.format(login="bot"), "status", status=503)
    with pytest.raises(ForgeTransientError) as raised:
        site.adapter.get_permission("bot")
    assert raised.value.status == 503
    assert site.adapter.get_permission("bot") == "admin"


def test_a_secondary_rate_limit_is_transient_with_its_wait(site: Site) -> None:
    site.fault("GET", PERMISSION_PATH.format(login="bot"), "secondary_rate_limit", retry_after=7)
    with pytest.raises(ForgeTransientError) as raised:
        site.adapter.get_permission("bot")
    assert raised.value.status == 403 and raised.value.retry_after_s == 7.0


def test_the_roles_are_ordered_least_first(site: Site) -> None:
    assert REPO_ROLES == ("none", "read", "triage", "write", "maintain", "admin")
    assert role_at_least("maintain", "triage") and not role_at_least("read", "triage")
    assert site.adapter.get_role("bot") == "admin"
