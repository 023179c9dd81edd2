"""GitHub Apps on the forge, through unmodified PyGithub (`GithubIntegration`, `Auth.AppAuth`,
`Auth.AppInstallationAuth`) and the git CLI: JWT checks, installation tokens, their expiry and their reach."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from github import Auth, BadCredentialsException, Github, GithubException, GithubIntegration

from infra.forge.testing import ForgeHandle

APP_ID = 4242
PERMISSIONS = {"contents": "write", "issues": "write", "pull_requests": "write", "metadata": "read"}


def _key() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


@pytest.fixture
def app(forge: ForgeHandle) -> dict[str, Any]:
    """App ``fixer`` installed on alice's ``shop`` only (selected); ``other`` (private) lies outside it."""
    alice = forge.create_user("alice")
    forge.create_repo(alice, "shop")
    forge.create_repo(alice, "other", private=True)
    private, public = _key()
    forge.register_app(APP_ID, "fixer", public, token_lifetime_s=2)
    installation = forge.install_app("fixer", "alice", PERMISSIONS, repositories=["shop"])
    return {"private": private, "alice": alice, "installation_id": installation["id"]}


def _integration(forge: ForgeHandle, private: str) -> GithubIntegration:
    return GithubIntegration(base_url=forge.api_url, auth=Auth.AppAuth(APP_ID, private), retry=None)


def _jwt_answer(forge: ForgeHandle, token: str) -> httpx.Response:
    return forge.http.get(forge.api_url + "/app", headers={"Authorization": f"Bearer {token}"})


def test_app_finds_its_installation_and_acts_as_its_bot(forge: ForgeHandle, app: dict[str, Any]) -> None:
    integration = _integration(forge, app["private"])
    assert integration.get_app().slug == "fixer"
    assert [i.id for i in integration.get_installations()] == [app["installation_id"]]
    installation = integration.get_repo_installation("alice", "shop")
    assert installation.id == app["installation_id"]
    with pytest.raises(GithubException) as outside:
        integration.get_repo_installation("alice", "other")
    assert outside.value.status == 404

    access = integration.get_access_token(app["installation_id"])
    assert access.token.startswith("ghs_") and access.permissions == PERMISSIONS
    assert access.repository_selection == "selected"

    auth = Auth.AppInstallationAuth(Auth.AppAuth(APP_ID, app["private"]), app["installation_id"])
    gh = Github(
        base_url=forge.api_url, auth=auth, retry=None, seconds_between_requests=None, seconds_between_writes=None
    )
    issue = gh.get_repo("alice/shop").create_issue(title="from the app")
    assert (issue.user.login, issue.user.type) == ("fixer[bot]", "Bot")
    # A repository outside the installation: private is invisible, and the bot cannot write to public ones.
    with pytest.raises(GithubException) as hidden:
        gh.get_repo("alice/other")
    assert hidden.value.status == 404
    forge.create_repo(app["alice"], "public-outside")
    with pytest.raises(GithubException) as refused:
        gh.get_repo("alice/public-outside").create_label("nope", "ff0000")
    assert refused.value.status == 403
    assert refused.value.data["message"] == "Resource not accessible by integration"


def test_expired_installation_token_is_bad_credentials_for_rest_and_git(
    forge: ForgeHandle, app: dict[str, Any], tmp_path: Path
) -> None:
    token = _integration(forge, app["private"]).get_access_token(app["installation_id"]).token
    clone = subprocess.run(
        ["git", "clone", "-q", forge.clone_url("alice/shop", token), str(tmp_path / "a")], capture_output=True
    )
    assert clone.returncode == 0, clone.stderr
    time.sleep(2.5)
    gh = Github(base_url=forge.api_url, auth=Auth.Token(token), retry=None)
    with pytest.raises(BadCredentialsException):
        gh.get_repo("alice/shop")
    # Git sends credentials once challenged, which a push always is: the expired token is refused then.
    work = tmp_path / "a"
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "late"], check=True)
    push = subprocess.run(
        [*git, "push", "-q", "origin", "HEAD:refs/heads/late"],
        capture_output=True,
        text=True,
        env={"GIT_TERMINAL_PROMPT": "0", "PATH": "/usr/bin:/bin"},
    )
    assert push.returncode != 0 and "Authentication failed" in push.stderr, push.stderr
    # PyGithub's installation auth renews the token it holds once it is about to expire.
    assert len(forge.app_tokens("fixer")) == 1


def test_installation_auth_renews_an_expiring_token(forge: ForgeHandle, app: dict[str, Any]) -> None:
    auth = Auth.AppInstallationAuth(Auth.AppAuth(APP_ID, app["private"]), app["installation_id"])
    gh = Github(base_url=forge.api_url, auth=auth, retry=None)
    assert gh.get_repo("alice/shop").full_name == "alice/shop"
    time.sleep(2.5)
    assert gh.get_repo("alice/shop").full_name == "alice/shop"
    assert len(forge.app_tokens("fixer")) == 2


def _signed(private: str, **claims: Any) -> str:
    # JWS-level: PyJWT's own JWT encoder refuses the numeric ``iss`` GitHub accepts.
    return jwt.PyJWS().encode(json.dumps(claims).encode(), private, algorithm="RS256")


def test_invalid_and_hostile_jwts_are_refused_with_githubs_messages(forge: ForgeHandle, app: dict[str, Any]) -> None:
    now = int(time.time())
    other_private, _ = _key()
    cases = {
        "not a token": ("eyJhbGciOiJSUzI1NiJ9.e30.bad", "A JSON web token could not be decoded"),
        "another key": (_signed(other_private, iss=APP_ID, iat=now - 60, exp=now + 300), "A JSON web token"),
        "alg none": (
            jwt.encode({"iss": str(APP_ID), "iat": now, "exp": now + 60}, "", algorithm="none"),
            "A JSON web",
        ),
        # The classic confusion: the public key used as an HMAC secret.
        "HS256 with the public key": (_hmac_signed(_public_of(app["private"]), iss=APP_ID, iat=now, exp=now + 60), "A"),
        "unknown app": (_signed(app["private"], iss=999, iat=now - 60, exp=now + 300), "A JSON web token"),
        "expired": (
            _signed(app["private"], iss=APP_ID, iat=now - 600, exp=now - 10),
            "'Expiration time' claim ('exp') must be",
        ),
        "too long": (
            _signed(app["private"], iss=APP_ID, iat=now - 60, exp=now + 600),
            "'Expiration time' claim ('exp') is too far",
        ),
        "no iat": (_signed(app["private"], iss=APP_ID, exp=now + 300), "'Issued at' claim ('iat')"),
        "iat from the future": (_signed(app["private"], iss=APP_ID, iat=now + 300, exp=now + 400), "'Issued at'"),
    }
    for name, (token, message) in cases.items():
        answer = _jwt_answer(forge, token)
        assert answer.status_code == 401, name
        assert answer.json()["message"].startswith(message), (name, answer.json())
    # The App ID as a string is GitHub's own example; iat slightly ahead is within the clock leeway.
    for iss in (APP_ID, str(APP_ID)):
        assert _jwt_answer(forge, _signed(app["private"], iss=iss, iat=now + 30, exp=now + 500)).status_code == 200
    # A JWT is not a token for the rest of the API, nor is an installation token a user.
    valid = _signed(app["private"], iss=APP_ID, iat=now - 60, exp=now + 300)
    repo = forge.http.get(forge.api_url + "/repos/alice/shop", headers={"Authorization": f"Bearer {valid}"})
    assert repo.status_code == 403
    with pytest.raises(GithubException) as no_user:
        Github(
            base_url=forge.api_url, auth=Auth.Token(_installation_token(forge, valid, app)), retry=None
        ).get_user().update()
    assert no_user.value.status == 403


def _public_of(private: str) -> bytes:
    key = serialization.load_pem_private_key(private.encode(), password=None)
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _hmac_signed(secret: bytes, **claims: Any) -> str:
    """A JWT signed HS256 with ``secret`` by hand (PyJWT refuses a PEM as an HMAC secret, as it should)."""

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    signing_input = part(b'{"alg":"HS256","typ":"JWT"}') + "." + part(json.dumps(claims).encode())
    return signing_input + "." + part(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())


def _installation_token(forge: ForgeHandle, jwt_token: str, app: dict[str, Any]) -> str:
    answer = forge.http.post(
        f"{forge.api_url}/app/installations/{app['installation_id']}/access_tokens",
        headers={"Authorization": f"Bearer {jwt_token}"},
    )
    assert answer.status_code == 201
    body = answer.json()
    assert body["expires_at"].endswith("Z") and body["repository_selection"] == "selected"
    return str(body["token"])
