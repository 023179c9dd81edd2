"""Setting a repository up on a forge for durafix: accounts (the emulator's admin API), the repository, its
collaborators, the webhook, and pushing a history into it.

These are the pieces ``durafix demo``, ``durafix forge create-repo | add-collaborator | add-webhook`` and
``durafix dev onboard`` share. They speak GitHub's REST API (``https://api.github.com``, GitHub Enterprise's
``/api/v3``, or the local emulator) with one token per :class:`ForgeApi`; only :func:`ensure_user` and
:func:`mint_token` need the emulator (its ``/admin`` endpoints, GitHub Enterprise style).

Each ``ensure_*`` and :func:`set_collaborator` is idempotent: called again with the same arguments it
changes nothing and creates nothing a second time (:func:`mint_token` is not: every call is a new token).
"""

from __future__ import annotations

import base64
import functools
import os
import re
import ssl
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

WEBHOOK_EVENTS = ("issues", "issue_comment", "pull_request", "pull_request_review")
"""What durafix's receiver acts on: issues (the trigger label), their comments (`/durafix` commands), pull
requests and their reviews (approvals)."""

PERMISSIONS = ("pull", "triage", "push", "maintain", "admin")
"""GitHub's repository roles, as the collaborator API names them."""


class ForgeSetupError(Exception):
    """The forge refused a request (``status`` is its HTTP status) or did not answer (``status`` is None);
    the message names the request and carries GitHub's own message."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ForgeApi:
    """One forge's REST API, acting with one token."""

    def __init__(self, api_url: str, token: str, *, timeout_s: float = 30.0) -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token
        self._headers = {
            "Authorization": f"token {token}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
        }
        self._timeout_s = timeout_s

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The decoded JSON answer (None when empty); a 4xx/5xx or no answer is :class:`ForgeSetupError`."""
        return self._send(method, f"{self.api_url}{path}", body).json_or_none

    def exists(self, path: str) -> bool:
        """Whether ``GET path`` answers 200 (404: False; anything else is an error)."""
        try:
            self.call("GET", path)
        except ForgeSetupError as err:
            if err.status == 404:
                return False
            raise
        return True

    def pages(self, path: str) -> Iterator[Any]:
        """Every item of a paginated list, following the ``Link: rel="next"`` headers."""
        url: str | None = f"{self.api_url}{path}{'&' if '?' in path else '?'}per_page=100"
        while url is not None:
            answer = self._send("GET", url, None)
            yield from answer.json_or_none or []
            url = answer.next_url

    def _send(self, method: str, url: str, body: dict[str, Any] | None) -> _Answer:
        try:
            resp = httpx.request(
                method, url, json=body, headers=self._headers, timeout=self._timeout_s, verify=_tls_context()
            )
        except httpx.HTTPError as err:
            raise ForgeSetupError(f"{method} {url}: the forge did not answer ({type(err).__name__}: {err})") from err
        if resp.status_code >= 400:
            raise ForgeSetupError(f"{method} {url} -> {resp.status_code}: {_github_message(resp)}", resp.status_code)
        next_link = resp.links.get("next", {}).get("url")
        return _Answer(resp.json() if resp.content else None, next_link)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # Loading the CA bundle takes some 50 ms; httpx would do it again for every request.
    return httpx.create_ssl_context()


@dataclass(frozen=True)
class _Answer:
    json_or_none: Any
    next_url: str | None


def _github_message(resp: httpx.Response) -> str:
    try:
        data = resp.json()
    except ValueError:
        return resp.text[:300]
    if not isinstance(data, dict):
        return resp.text[:300]
    message = str(data.get("message", ""))
    details = [e.get("message") or e.get("code") for e in data.get("errors", []) if isinstance(e, dict)]
    details += [e for e in data.get("errors", []) if isinstance(e, str)]
    return "; ".join([message, *[str(d) for d in details if d]]) or resp.text[:300]


# ---- accounts (the emulator's admin API) ------------------------------------------------------------------


def ensure_user(admin: ForgeApi, login: str) -> None:
    """Create the emulator user ``login`` unless it exists (``admin`` acts with the emulator's admin token).
    Idempotent."""
    try:
        admin.call("POST", "/admin/users", {"login": login, "email": f"{login}@localhost"})
    except ForgeSetupError as err:
        if err.status != 422:  # 422: the login is taken, i.e. the user exists already
            raise


def mint_token(admin: ForgeApi, login: str) -> str:
    """A new token for the emulator user ``login`` (scope ``repo``). Not idempotent: each call is another
    token; earlier ones stay valid."""
    return str(admin.call("POST", f"/admin/users/{login}/authorizations", {"scopes": ["repo"]})["token"])


# ---- repositories -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Repository:
    full_name: str
    html_url: str
    clone_url: str
    created: bool
    """False when it existed already."""


def ensure_repository(api: ForgeApi, full_name: str, *, private: bool = False) -> Repository:
    """``OWNER/NAME``, created empty (no initial commit, so any history can be pushed into it) unless it
    exists. ``api``'s token must be OWNER's, or an admin's of the organisation OWNER. Idempotent: an existing
    repository is left as it is (its visibility too)."""
    owner, name = split_repository(full_name)
    created = False
    if not api.exists(f"/repos/{owner}/{name}"):
        login = str(api.call("GET", "/user")["login"])
        path = "/user/repos" if login.lower() == owner.lower() else f"/orgs/{owner}/repos"
        try:
            api.call("POST", path, {"name": name, "private": private, "auto_init": False})
            created = True
        except ForgeSetupError as err:
            # Created meanwhile by someone else: the repository exists, which is all this promises.
            if err.status != 422 or not api.exists(f"/repos/{owner}/{name}"):
                raise
    data = api.call("GET", f"/repos/{owner}/{name}")
    return Repository(str(data["full_name"]), str(data["html_url"]), str(data["clone_url"]), created)


def split_repository(full_name: str) -> tuple[str, str]:
    """``("OWNER", "NAME")`` of ``OWNER/NAME``; ``ValueError`` for anything else."""
    owner, sep, name = full_name.partition("/")
    if not sep or not owner or not name or "/" in name:
        raise ValueError(f"{full_name!r} is not OWNER/NAME")
    return owner, name


def set_collaborator(api: ForgeApi, full_name: str, login: str, permission: str) -> bool:
    """Give ``login`` ``permission`` (one of :data:`PERMISSIONS`) on the repository. Idempotent (a second
    call with another permission changes it). True when it took effect at once; False when GitHub sent an
    invitation instead, which ``login`` must accept before the permission counts (the emulator adds at once)."""
    if permission not in PERMISSIONS:
        raise ValueError(f"permission {permission!r} is not one of {', '.join(PERMISSIONS)}")
    owner, name = split_repository(full_name)
    invitation = api.call("PUT", f"/repos/{owner}/{name}/collaborators/{login}", {"permission": permission})
    # 204 (no body) when the permission is in force; 201 with the invitation when it waits for acceptance.
    return invitation is None


def ensure_label(api: ForgeApi, full_name: str, label: str, *, color: str = "5319e7", description: str = "") -> bool:
    """The repository has the label ``label`` (so reviewers find it in the forge's label picker); True when
    it was created now. Idempotent: an existing label is left as it is."""
    owner, name = split_repository(full_name)
    if api.exists(f"/repos/{owner}/{name}/labels/{quote(label, safe='')}"):
        return False
    try:
        api.call("POST", f"/repos/{owner}/{name}/labels", {"name": label, "color": color, "description": description})
    except ForgeSetupError as err:
        if err.status != 422:  # 422: created meanwhile
            raise
        return False
    return True


@dataclass(frozen=True)
class Webhook:
    hook_id: int
    url: str
    events: tuple[str, ...]
    created: bool
    """False when a hook for the URL existed and was brought up to date."""


def ensure_webhook(
    api: ForgeApi, full_name: str, url: str, secret: str, events: Sequence[str] = WEBHOOK_EVENTS
) -> Webhook:
    """The repository's one hook for ``url``: JSON deliveries signed with ``secret`` for ``events``, active.

    Idempotent: when a hook for ``url`` exists it is edited to exactly that (the forge never shows a secret,
    so it is always written: a rotated secret takes effect) and no second hook is created; a new hook gets
    the forge's ``ping``. Needs admin rights on the repository.
    """
    if not secret:
        raise ValueError("a webhook needs a secret: durafix's receiver refuses unsigned deliveries")
    owner, name = split_repository(full_name)
    config = {"url": url, "content_type": "json", "secret": secret, "insecure_ssl": "0"}
    body: dict[str, Any] = {"active": True, "events": list(events), "config": config}
    existing = next((h for h in api.pages(f"/repos/{owner}/{name}/hooks") if h["config"].get("url") == url), None)
    if existing is not None:
        hook = api.call("PATCH", f"/repos/{owner}/{name}/hooks/{existing['id']}", body)
        created = False
    else:
        hook = api.call("POST", f"/repos/{owner}/{name}/hooks", {"name": "web", **body})
        created = True
    return Webhook(int(hook["id"]), url, tuple(hook["events"]), created)


# ---- git --------------------------------------------------------------------------------------------------


def maintainer_git_env(token: str, home: Path) -> dict[str, str]:
    """The environment of git commands run as the repositories' maintainer against the forge: a fixed
    identity, the token as HTTP Basic credentials, nothing from the caller's git configuration."""
    return {
        "GIT_AUTHOR_NAME": "Maintainer",
        "GIT_AUTHOR_EMAIL": "maintainer@localhost",
        "GIT_COMMITTER_NAME": "Maintainer",
        "GIT_COMMITTER_EMAIL": "maintainer@localhost",
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "http.extraHeader",
        "GIT_CONFIG_VALUE_0": f"Authorization: Basic {_basic(token)}",
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
    }


def _basic(token: str) -> str:
    return base64.b64encode(f"x-access-token:{token}".encode()).decode()


class GitError(Exception):
    """A git command failed; the message carries its stderr."""


@dataclass(frozen=True)
class PushedHistory:
    branch: str | None
    """The checkout's current branch; None for a detached HEAD."""
    head: str
    commits: int
    tags: tuple[str, ...]


def push_history(checkout: Path, clone_url: str, token: str, *, branch: str = "main") -> PushedHistory:
    """Push the whole history of ``checkout``'s HEAD as ``branch`` of ``clone_url``, with the tags that point
    into it, as the maintainer with ``token``. The checkout is only read: no remote, configuration or ref of
    it changes, and its pre-push hooks do not run (they belong to its own remotes).

    Idempotent: pushing the same history again changes nothing. A branch that moved on the forge (a merged
    fix the checkout lacks) or a tag that points elsewhere there is never overwritten: git refuses the
    non-fast-forward and :class:`GitError` says so.
    """
    with tempfile.TemporaryDirectory() as home:
        env = {**maintainer_git_env(token, Path(home)), "GIT_TERMINAL_PROMPT": "0"}
        if "PATH" in os.environ:
            # git may live outside /usr/bin (and its helpers with it); the checkout is the caller's machine.
            env["PATH"] = os.environ["PATH"]

        def git(*args: str) -> str:
            done = subprocess.run(["git", "-C", str(checkout), *args], env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise GitError(f"git {' '.join(args)}: {done.stderr.strip() or f'exit {done.returncode}'}")
            return done.stdout.strip()

        head = git("rev-parse", "--verify", "HEAD^{commit}")
        current = git("rev-parse", "--abbrev-ref", "HEAD")
        commits = int(git("rev-list", "--count", "HEAD"))
        tags = tuple(t for t in git("tag", "--merged", "HEAD").splitlines() if t)
        refspecs = [f"HEAD:refs/heads/{branch}", *(f"refs/tags/{t}:refs/tags/{t}" for t in tags)]
        try:
            git("push", "--no-verify", "--quiet", clone_url, *refspecs)
        except GitError as err:
            rejected = re.findall(r"! \[rejected\]\s+\S+ -> (\S+) \(([^)]*)\)", str(err))
            if not rejected:
                raise
            names = ", ".join(f"{ref} ({why})" for ref, why in rejected)
            raise GitError(
                f"the forge has history the checkout lacks and nothing was overwritten: {names} refused; bring "
                f"it into the checkout (git pull {clone_url} {branch}) and push again"
            ) from err
    return PushedHistory(None if current == "HEAD" else current, head, commits, tags)
