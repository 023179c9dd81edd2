"""Authenticating as a GitHub App installation: the App's JWT buys installation tokens, which expire (one hour on
github.com) and are renewed before they do.

`InstallationTokens` is the one token source of a worker for one App. It finds the installation of a repository
(the configured installation ID, else `GET /repos/{owner}/{repo}/installation`, asked once per repository),
caches one token per installation and asks for a new one when fewer than `renew_before_s` seconds remain (or less
than half the token's lifetime, for short-lived tokens); it is thread-safe. The REST client uses PyGithub's own
`Auth.AppInstallationAuth` (`api_auth`), which renews its token the same way; git uses `git_credentials`.

The private key stays in this object: it is never logged, put in an error message, or handed to git or a
sandbox (only installation tokens are). The bot identity is the App's ``SLUG[bot]``, read with `GET /app`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import requests
from github import Auth, GithubException, GithubIntegration
from pydantic import SecretStr

from reviews.errors import ForgeNotFoundError, ForgePermanentError, from_github_exception, from_transport_exception

T = TypeVar("T")

DEFAULT_RENEW_BEFORE_S = 300.0


@dataclass(frozen=True)
class _Token:
    value: str
    issued_at: float
    expires_at: float

    def fresh(self, renew_before_s: float) -> bool:
        margin = min(renew_before_s, (self.expires_at - self.issued_at) / 2)
        return self.expires_at - time.time() > margin


class InstallationTokens:
    """Installation tokens of one GitHub App, for every repository it is installed on."""

    def __init__(
        self,
        api_url: str,
        app_id: int,
        private_key: SecretStr,
        installation_id: int | None = None,
        *,
        renew_before_s: float = DEFAULT_RENEW_BEFORE_S,
        timeout_s: int = 15,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.app_id = app_id
        self._key = private_key
        self._installation_id = installation_id
        self._renew_before_s = renew_before_s
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._installations: dict[str, int] = {}
        self._tokens: dict[int, _Token] = {}
        self._bot_login: str | None = None

    def app_auth(self) -> Auth.AppAuth:
        return Auth.AppAuth(self.app_id, self._key.get_secret_value())

    def _integration(self) -> GithubIntegration:
        return GithubIntegration(base_url=self.api_url, auth=self.app_auth(), timeout=self._timeout_s)

    @staticmethod
    def _ask(what: str, fn: Callable[[], T]) -> T:
        """One read with the App's JWT; failures classified like every forge read."""
        try:
            return fn()
        except GithubException as exc:
            raise from_github_exception(exc, what) from exc
        except requests.exceptions.RequestException as exc:
            raise from_transport_exception(exc, what, mutation=False) from exc

    def installation_for(self, repository: str) -> int:
        """The installation that reaches ``repository`` (OWNER/REPO); `ForgePermanentError` naming what to do
        when the App is not installed there."""
        if self._installation_id is not None:
            return self._installation_id
        with self._lock:
            if repository not in self._installations:
                owner, _, name = repository.partition("/")
                integration = self._integration()
                try:
                    found = self._ask(
                        "find the App's installation", lambda: integration.get_repo_installation(owner, name).id
                    )
                except ForgeNotFoundError as exc:
                    raise ForgePermanentError(
                        f"GitHub App {self.app_id} is not installed on {repository}: install it on the "
                        "repository (or its owner) with the permissions docs/forge-adapter.md lists, or set "
                        "github_app_installation_id (DURAFIX_GITHUB_APP_INSTALLATION_ID) to an installation "
                        "that covers it",
                        status=404,
                    ) from exc
                self._installations[repository] = found
            return self._installations[repository]

    def token(self, repository: str) -> str:
        """A token for ``repository`` with more than the renewal margin left; a new one when the cached is not."""
        installation = self.installation_for(repository)
        with self._lock:
            cached = self._tokens.get(installation)
            if cached is not None and cached.fresh(self._renew_before_s):
                return cached.value
            issued = time.time()
            integration = self._integration()
            answer = self._ask(
                f"get an installation token for {repository}", lambda: integration.get_access_token(installation)
            )
            token = _Token(answer.token, issued, answer.expires_at.timestamp())
            self._tokens[installation] = token
            return token.value

    def api_auth(self, repository: str) -> Auth.AppInstallationAuth:
        """PyGithub's installation auth for ``repository``: it asks for its own tokens and renews them."""
        return Auth.AppInstallationAuth(self.app_auth(), self.installation_for(repository))

    def bot_login(self) -> str:
        """The login the App acts as, ``SLUG[bot]`` (`GET /app`, read once)."""
        with self._lock:
            if self._bot_login is None:
                integration = self._integration()
                slug = self._ask(f"read GitHub App {self.app_id}", lambda: integration.get_app().slug)
                self._bot_login = f"{slug}[bot]"
            return self._bot_login

    def known_tokens(self) -> list[str]:
        with self._lock:
            return [t.value for t in self._tokens.values() if t.expires_at > time.time()]

    def git_credentials(self, git_base: str) -> AppGitCredentials:
        return AppGitCredentials(self, git_base)


class AppGitCredentials:
    """`GitCredentials` from installation tokens: clone URLs are ``GIT_BASE/OWNER/REPO.git``."""

    def __init__(self, tokens: InstallationTokens, git_base: str) -> None:
        self._tokens = tokens
        self._base = git_base.rstrip("/") + "/"

    def token_for(self, clone_url: str) -> str | None:
        if not clone_url.startswith(self._base):
            # Not the forge the App lives on: no credentials rather than a token sent elsewhere.
            return None
        return self._tokens.token(clone_url.removeprefix(self._base).removesuffix(".git"))

    def known_tokens(self) -> list[str]:
        return self._tokens.known_tokens()
