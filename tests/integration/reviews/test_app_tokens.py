"""The adapter as a GitHub App installation, on the forge over HTTP: the token source's caching, renewal and
thread safety, the installation lookup, the bot identity, and REST plus git (a pushed branch, a claim) as the App."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import SecretStr

from infra.forge.testing import ForgeHandle
from infra.forge.testing import client as forge_client
from reviews.adapter import GitHubForge
from reviews.app_tokens import InstallationTokens
from reviews.errors import ForgePermanentError
from tests.support.review_site import clone, git, make_config

APP_ID = 77
PERMISSIONS = {"contents": "write", "issues": "write", "pull_requests": "write", "metadata": "read"}


@pytest.fixture
def installed(forge: ForgeHandle) -> tuple[ForgeHandle, str, str]:
    """App ``mender`` (tokens of 4 s) installed on alice's ``shop``; alice's token and the App's private key."""
    alice = forge.create_user("alice")
    forge.create_repo(alice, "shop")
    forge.create_repo(alice, "elsewhere")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    forge.register_app(APP_ID, "mender", public.decode(), token_lifetime_s=4)
    forge.install_app("mender", "alice", PERMISSIONS, repositories=["shop"])
    return forge, alice, private


def _tokens(forge: ForgeHandle, private: str, installation_id: int | None = None) -> InstallationTokens:
    return InstallationTokens(forge.api_url, APP_ID, SecretStr(private), installation_id)


def test_tokens_are_cached_renewed_before_expiry_and_issued_once_under_contention(
    installed: tuple[ForgeHandle, str, str],
) -> None:
    forge, _, private = installed
    tokens = _tokens(forge, private)
    with ThreadPoolExecutor(8) as pool:
        first = set(pool.map(lambda _: tokens.token("alice/shop"), range(16)))
    assert len(first) == 1 and len(forge.app_tokens("mender")) == 1
    # Half the 4 s lifetime is the renewal margin here: after 2.5 s the cached token is no longer handed out.
    time.sleep(2.5)
    renewed = tokens.token("alice/shop")
    assert renewed not in first and len(forge.app_tokens("mender")) == 2
    assert tokens.known_tokens() == [renewed]
    assert tokens.bot_login() == "mender[bot]"


def test_an_app_not_installed_on_the_repository_is_a_clear_error(installed: tuple[ForgeHandle, str, str]) -> None:
    forge, _, private = installed
    with pytest.raises(ForgePermanentError) as err:
        _tokens(forge, private).token("alice/elsewhere")
    message = str(err.value)
    assert "not installed on alice/elsewhere" in message and "DURAFIX_GITHUB_APP_INSTALLATION_ID" in message
    assert "PRIVATE KEY" not in message


def test_adapter_acts_as_the_apps_bot_over_rest_and_git(
    installed: tuple[ForgeHandle, str, str], tmp_path: Path
) -> None:
    forge, alice, private = installed
    git_url = forge.clone_url("alice/shop")
    config = make_config(forge, "", "alice/shop", git_url)
    with GitHubForge(config, app=_tokens(forge, private)) as adapter:
        assert adapter.login() == "mender[bot]"
        ticket = adapter.ensure_ticket("run-1:ticket", None, "a ticket", "body")
        work = clone(git_url, alice, tmp_path / "work")
        (work / "fix.txt").write_text("fixed\n")
        git(work, "add", "-A")
        git(work, "commit", "-q", "-m", "fix")
        sha = git(work, "rev-parse", "HEAD")
        time.sleep(2.5)  # the first installation token is past its renewal margin: git must get a new one
        adapter.publish_branch("durafix/run-1/fix", sha, None, work)
        assert adapter.get_branch_sha("durafix/run-1/fix") == sha
    owner = forge_client(forge.api_url, alice).get_repo("alice/shop")
    assert owner.get_issue(ticket.issue_number).user.login == "mender[bot]"
    assert len(forge.app_tokens("mender")) >= 2
