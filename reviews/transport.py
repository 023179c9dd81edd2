"""The PyGithub client as the adapter configures it, and the wrappers that classify every failure.

Every call to GitHub goes through `read` or `mutate`, so a PyGithub or requests exception never escapes
the adapter unclassified. PyGithub evaluates lazily (pagination, lazy completion): callers put the whole
evaluation, not just the first call, inside the wrapper.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import requests
from github import Auth, Github, GithubException
from github.IssueComment import IssueComment
from github.Repository import Repository
from urllib3.util.retry import Retry

from reviews.app_tokens import InstallationTokens
from reviews.config import ForgeConfig
from reviews.errors import (
    ForgeEmptyRepositoryError,
    ForgeError,
    ForgeNotFoundError,
    from_github_exception,
    from_transport_exception,
)

T = TypeVar("T")


def client_retry(config: ForgeConfig) -> Retry:
    """urllib3 retry policy handed to PyGithub instead of its default.

    PyGithub's default `GithubRetry` re-sends POST and sleeps on 403 rate limits inside the call; neither
    is acceptable for mutations we must reconcile, nor for waits a workflow's retry policy should own.
    Reads are retried on 500/502/504 and network errors. Connect failures are retried for all methods
    (urllib3 retries them regardless of method): the request never left. 429/503 with `retry-after` are
    not retried here, so their wait reaches the caller.
    """
    return Retry(
        total=config.read_retries,
        connect=config.read_retries,
        read=config.read_retries,
        status=config.read_retries,
        other=0,
        allowed_methods=frozenset({"GET", "HEAD"}),
        status_forcelist=(500, 502, 504),
        backoff_factor=config.retry_backoff_s,
        respect_retry_after_header=False,
        raise_on_status=False,
        raise_on_redirect=False,
    )


class Transport:
    """One PyGithub client bound to one repository, authenticated with the configured token, or as a GitHub App
    installation when `app` is given (REST through PyGithub's installation auth, git with `git_token`)."""

    def __init__(self, config: ForgeConfig, app: InstallationTokens | None = None) -> None:
        self.config = config
        self._app = app
        auth: Auth.Auth = (
            app.api_auth(config.repository) if app is not None else Auth.Token(config.token.get_secret_value())
        )
        self.github = Github(
            base_url=config.api_url.rstrip("/"),
            auth=auth,
            timeout=config.request_timeout_s,
            retry=client_retry(config),
            per_page=100,
            seconds_between_requests=config.seconds_between_requests or None,
            seconds_between_writes=config.seconds_between_writes or None,
            # Lazy: an object built from a URL is fetched only when read, so each wrapped call sends
            # exactly the requests it names (a mutation is not preceded by a hidden GET).
            lazy=True,
        )
        self.repo: Repository = self.github.get_repo(config.repository)
        self._login: str | None = config.bot_login or (app.bot_login() if app is not None else None)
        self._last_write = float("-inf")

    def git_token(self) -> str:
        """The token git sends for the repository: the configured one, or a fresh installation token."""
        return (
            self._app.token(self.config.repository) if self._app is not None else self.config.token.get_secret_value()
        )

    def read(self, what: str, fn: Callable[[], T]) -> T:
        """Run a read; every failure is transient, permanent or conflict, never ambiguous."""
        return self._call(what, fn, mutation=False)

    def read_if_found(self, what: str, fn: Callable[[], T]) -> T | None:
        """`read`, with "it is not there" answered as None: a 404 (the object does not exist, or the token
        cannot see it), and GitHub's 409 for an empty repository, in which no ref or git object exists."""
        try:
            return self.read(what, fn)
        except (ForgeNotFoundError, ForgeEmptyRepositoryError):
            return None

    def mutate(self, what: str, fn: Callable[[], T]) -> T:
        """Run one mutation; a sent request without an answer raises `ForgeAmbiguousError`."""
        with self.write_slot():
            return self._call(what, fn, mutation=True)

    @contextmanager
    def write_slot(self) -> Iterator[None]:
        """Hold while sending one write: it starts `seconds_between_writes` after the end of the last one.

        PyGithub spaces its own REST writes; this also spaces the adapter's git pushes of claims (which
        PyGithub never sees) from REST writes and from each other, so every write this client sends keeps
        GitHub's one-second spacing for integrations.
        """
        wait = self._last_write + self.config.seconds_between_writes - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        try:
            yield
        finally:
            # Measured from the end of the write, as PyGithub does.
            self._last_write = time.monotonic()

    def _call(self, what: str, fn: Callable[[], T], *, mutation: bool) -> T:
        try:
            return fn()
        except ForgeError:
            raise
        except GithubException as exc:
            raise from_github_exception(exc, what) from exc
        except requests.exceptions.RequestException as exc:
            raise from_transport_exception(exc, what, mutation=mutation) from exc

    def our_comments(self, what: str, number: int, body_matches: Callable[[str], bool]) -> list[IssueComment]:
        """Comments on issue or pull request ``number`` by :meth:`login` whose body passes ``body_matches``,
        listed in one :meth:`read` (the whole pagination inside it)."""
        login = self.login()

        def scan() -> list[IssueComment]:
            comments = self.repo.get_issue(number).get_comments()
            return [c for c in comments if c.user.login == login and body_matches(c.body)]

        return self.read(what, scan)

    def login(self) -> str:
        """The login whose marked objects count as ours (configured, else the token's user)."""
        if self._login is None:
            self._login = self.read("read authenticated user", lambda: self.github.get_user().login)
        return self._login

    def close(self) -> None:
        self.github.close()
