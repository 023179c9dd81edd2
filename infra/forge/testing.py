"""Helpers for tests that need a GitHub: an in-process forge and a handle that drives its admin API over HTTP.

with running_forge(tmp_path) as forge:
    token = forge.create_user("alice")
    repo = forge.create_repo(token, "shop")          # auto-initialised with a README on main
    gh = client(forge.api_url, token)
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from github import Auth, Github

from .server import ForgeServer


def client(api_url: str, token: str) -> Github:
    """A PyGithub client of the emulator at ``api_url``, as ``token``'s user, for a test's or the local stack's own
    view of the forge. ``retry=None``: a caller asserts on the first answer, a fault or 5xx is never hidden.
    Unspaced: PyGithub waits 0.25 s between requests and 1 s between writes for github.com's secondary limits,
    which the emulator does not set."""
    return Github(
        base_url=api_url, auth=Auth.Token(token), retry=None, seconds_between_requests=None, seconds_between_writes=None
    )


@dataclass
class ForgeHandle:
    server: ForgeServer
    admin_token: str
    http: httpx.Client

    @property
    def api_url(self) -> str:
        return self.server.api_url

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def _call(self, method: str, path: str, token: str | None = None, body: Any = None) -> Any:
        headers = {"Authorization": f"token {token or self.admin_token}", "Accept": "application/vnd.github+json"}
        resp = self.http.request(method, self.api_url + path, json=body, headers=headers)
        if resp.status_code >= 400:
            raise RuntimeError(f"{method} {path} -> {resp.status_code}: {resp.text}")
        return resp.json() if resp.content else None

    def create_user(self, login: str, email: str | None = None) -> str:
        """Create a user and return a new token for them."""
        self._call("POST", "/admin/users", body={"login": login, "email": email or f"{login}@example.com"})
        return self.create_token(login)

    def create_token(self, login: str) -> str:
        return str(self._call("POST", f"/admin/users/{login}/authorizations", body={})["token"])

    def create_org(self, login: str, admin: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/admin/organizations", body={"login": login, "admin": admin})
        return result

    def create_repo(
        self, token: str, name: str, owner: str | None = None, private: bool = False, auto_init: bool = True
    ) -> dict[str, Any]:
        """Create ``name`` for the token's user, or in organisation ``owner``; auto-initialised by default."""
        path = f"/orgs/{owner}/repos" if owner else "/user/repos"
        body = {"name": name, "private": private, "auto_init": auto_init}
        result: dict[str, Any] = self._call("POST", path, token=token, body=body)
        return result

    def add_collaborator(self, token: str, full_name: str, login: str, permission: str = "push") -> None:
        self._call("PUT", f"/repos/{full_name}/collaborators/{login}", token=token, body={"permission": permission})

    def add_org_member(self, org: str, login: str) -> None:
        """Make ``login`` a member of organisation ``org`` (site admin; activates their pending team invitations)."""
        self._call("PUT", f"/admin/organizations/{org}/members/{login}")

    def create_team(self, token: str, org: str, name: str) -> dict[str, Any]:
        """A team of ``org`` created by the token's user (an owner of it), who becomes its maintainer."""
        result: dict[str, Any] = self._call("POST", f"/orgs/{org}/teams", token=token, body={"name": name})
        return result

    def add_team_member(self, token: str, org: str, team_slug: str, login: str, role: str = "member") -> dict[str, Any]:
        """Add ``login`` to the team (``pending`` until they are a member of the organisation); the membership."""
        path = f"/orgs/{org}/teams/{team_slug}/memberships/{login}"
        result: dict[str, Any] = self._call("PUT", path, token=token, body={"role": role})
        return result

    def register_app(
        self, app_id: int, slug: str, public_key_pem: str, *, token_lifetime_s: int | None = None
    ) -> dict[str, Any]:
        """Register a GitHub App (its bot user is ``SLUG[bot]``); tokens last ``token_lifetime_s`` (default 1 h)."""
        body: dict[str, Any] = {"id": app_id, "slug": slug, "name": slug, "public_key": public_key_pem}
        if token_lifetime_s is not None:
            body["token_lifetime_s"] = token_lifetime_s
        result: dict[str, Any] = self._call("POST", "/admin/apps", body=body)
        return result

    def install_app(
        self, slug: str, account: str, permissions: dict[str, str], repositories: list[str] | None = None
    ) -> dict[str, Any]:
        """Install the App on ``account``: on all its repositories, or only on ``repositories`` (names)."""
        body: dict[str, Any] = {"account": account, "permissions": permissions}
        if repositories is not None:
            body.update(repository_selection="selected", repositories=repositories)
        result: dict[str, Any] = self._call("POST", f"/admin/apps/{slug}/installations", body=body)
        return result

    def app_tokens(self, slug: str) -> list[dict[str, Any]]:
        """The installation tokens issued to the App so far, oldest first (without their values)."""
        result: list[dict[str, Any]] = self._call("GET", f"/admin/apps/{slug}/tokens")
        return result

    def set_faults(self, *faults: dict[str, Any]) -> list[dict[str, Any]]:
        """Install fault rules (see :mod:`infra.forge.faults` for the fields); returns them with ids."""
        return [self._call("POST", "/admin/faults", body=f) for f in faults]

    def faults(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/admin/faults")
        return result

    def clear_faults(self) -> None:
        self._call("DELETE", "/admin/faults")

    def keep_issue_events(self, enabled: bool = True) -> None:
        """Answer ``GET .../issues/{number}/events`` (as GitHub does) or 404 (the emulator's default)."""
        self._call("PUT", "/admin/issue-events", body={"enabled": enabled})

    def deliveries(self) -> list[dict[str, Any]]:
        """Every recorded webhook delivery, oldest first, with request headers and body."""
        result: list[dict[str, Any]] = self._call("GET", "/admin/deliveries")
        return result

    def wait_for_deliveries(self, timeout: float = 15.0) -> list[dict[str, Any]]:
        """Wait until no delivery is pending or in flight, then return them all."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.deliveries()
            if all(d["state"] == "done" for d in found):
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"webhook deliveries still pending after {timeout}s")
            time.sleep(0.05)

    def clone_url(self, full_name: str, token: str | None = None) -> str:
        """The HTTP clone URL, with ``x-access-token:TOKEN@`` credentials when a token is given."""
        host = self.base_url.split("://", 1)[1]
        auth = f"x-access-token:{token}@" if token else ""
        return f"http://{auth}{host}/{full_name}.git"


@contextmanager
def running_forge(data_dir: Path, admin_token: str | None = None) -> Iterator[ForgeHandle]:
    """Serve a forge on a free port of 127.0.0.1 for the duration of the block."""
    server = ForgeServer(data_dir, admin_token=admin_token or secrets.token_hex(16))
    server.start()
    try:
        with httpx.Client(timeout=30) as http:
            yield ForgeHandle(server, server.forge.admin_token, http)
    finally:
        server.stop()
