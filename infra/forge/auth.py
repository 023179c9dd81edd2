"""Who is calling and what they may do.

Tokens come in ``Authorization: token X`` / ``Bearer X`` (API) or as the password of HTTP Basic auth (git and
API alike). An unknown token is 401 "Bad credentials" even where anonymous access would be allowed, as on
GitHub; so is an expired GitHub App installation token (``ghs_...``). An installation token acts as the App's bot
user with the installation's repositories and permissions only (see :func:`installation_role`); a JWT (an App
authenticating as itself) is no user at all and is checked by the App routes (:mod:`infra.forge.apps`).
Repository roles follow GitHub's ladder read < triage < write < maintain < admin: the owning user and
an owning organisation's owners are admin, collaborators have their granted role, anyone may read a public
repository, and a private repository the caller cannot read does not exist for them (404, never 403).
"""

from __future__ import annotations

import base64
import json
import secrets
import sqlite3
import time
from email.message import Message

from .wire import ApiError, not_found

ROLES = ["read", "triage", "write", "maintain", "admin"]
# REST inputs accept the legacy names for the same roles.
ROLE_ALIASES = {
    "pull": "read",
    "push": "write",
    "read": "read",
    "triage": "triage",
    "write": "write",
    "maintain": "maintain",
    "admin": "admin",
}
LEGACY_PERMISSION = {"read": "read", "triage": "read", "write": "write", "maintain": "write", "admin": "admin"}


def new_token() -> str:
    return "ghp_" + secrets.token_urlsafe(27).replace("-", "A").replace("_", "B")[:36]


def bearer_token(headers: Message) -> str | None:
    """The token in an Authorization header, whatever the scheme; None when there is none."""
    value = headers.get("Authorization")
    if not value:
        return None
    scheme, _, credential = value.strip().partition(" ")
    scheme = scheme.lower()
    if scheme in ("token", "bearer"):
        return credential.strip()
    if scheme == "basic":
        try:
            decoded = base64.b64decode(credential.strip()).decode()
        except (ValueError, UnicodeDecodeError):
            return ""
        _, _, password = decoded.partition(":")
        return password
    return ""


def looks_like_jwt(token: str) -> bool:
    """Whether ``token`` has a JWT's shape (three base64url parts, a JSON header): an App, not a user."""
    return token.startswith("eyJ") and token.count(".") == 2


def user_for_token(db: sqlite3.Connection, token: str) -> sqlite3.Row | None:
    """The user a personal token or an unexpired installation token acts as. An installation token's row also
    carries ``installation_id``, which limits what it reaches (:func:`installation_role`)."""
    row: sqlite3.Row | None = db.execute(
        "SELECT users.* FROM tokens JOIN users ON users.id = tokens.user_id WHERE tokens.token = ?", (token,)
    ).fetchone()
    if row is None and token.startswith("ghs_"):
        row = db.execute(
            "SELECT users.*, installation_tokens.installation_id AS installation_id FROM installation_tokens "
            "JOIN installations ON installations.id = installation_tokens.installation_id "
            "JOIN apps ON apps.id = installations.app_id JOIN users ON users.id = apps.bot_user_id "
            "WHERE installation_tokens.token = ? AND installation_tokens.expires_at > ?",
            (token, time.time()),
        ).fetchone()
    return row


def installation_of(user: sqlite3.Row | None) -> int | None:
    """The installation an installation token's user row was read for; None for any other caller."""
    return int(user["installation_id"]) if user is not None and "installation_id" in user.keys() else None  # noqa: SIM118


def no_access(user: sqlite3.Row | None) -> ApiError:
    """GitHub's 403 for a write the token's role does not allow; an App says "integration"."""
    kind = "integration" if installation_of(user) is not None else "personal access token"
    return ApiError(403, f"Resource not accessible by {kind}")


def authenticate(db: sqlite3.Connection, headers: Message) -> sqlite3.Row | None:
    """The calling user; None for anonymous callers and for JWTs, which only the App routes accept."""
    token = bearer_token(headers)
    if token is None or looks_like_jwt(token):
        return None
    user = user_for_token(db, token) if token else None
    if user is None:
        raise ApiError(401, "Bad credentials")
    return user


def role_at_least(role: str | None, needed: str) -> bool:
    return role is not None and ROLES.index(role) >= ROLES.index(needed)


def repo_role(db: sqlite3.Connection, repo: sqlite3.Row, user: sqlite3.Row | None) -> str | None:
    """The caller's effective role on ``repo``; None when they cannot even read it."""
    installation = installation_of(user)
    if installation is not None:
        return installation_role(db, repo, installation)
    if user is not None:
        if user["id"] == repo["owner_id"]:
            return "admin"
        member = db.execute(
            "SELECT role FROM org_members WHERE org_id = ? AND user_id = ?", (repo["owner_id"], user["id"])
        ).fetchone()
        if member is not None and member["role"] == "admin":
            return "admin"
        collab = db.execute(
            "SELECT role FROM collaborators WHERE repo_id = ? AND user_id = ?", (repo["id"], user["id"])
        ).fetchone()
        if collab is not None:
            return str(collab["role"])
        if member is not None and repo["private"] == 0:
            return "read"
    return None if repo["private"] else "read"


def installation_role(db: sqlite3.Connection, repo: sqlite3.Row, installation_id: int) -> str | None:
    """An installation token's role on ``repo``: from the installation's permissions on a repository it
    covers (``administration: write`` is admin; ``contents``, ``pull_requests`` or ``issues`` write is write;
    anything else read); on any other repository what anonymous callers get (read of public ones only)."""
    inst = db.execute("SELECT * FROM installations WHERE id = ?", (installation_id,)).fetchone()
    covered = inst["account_id"] == repo["owner_id"] and (
        inst["repository_selection"] == "all"
        or db.execute(
            "SELECT 1 FROM installation_repos WHERE installation_id = ? AND repo_id = ?", (installation_id, repo["id"])
        ).fetchone()
        is not None
    )
    if not covered:
        return None if repo["private"] else "read"
    permissions: dict[str, str] = json.loads(inst["permissions"])
    if permissions.get("administration") == "write":
        return "admin"
    if any(permissions.get(scope) == "write" for scope in ("contents", "pull_requests", "issues")):
        return "write"
    return "read"


def require_role(db: sqlite3.Connection, repo: sqlite3.Row, user: sqlite3.Row | None, needed: str) -> str:
    """The caller's role if it reaches ``needed``; otherwise GitHub's answer for that caller."""
    role = repo_role(db, repo, user)
    if role is None:
        raise not_found()
    if role_at_least(role, needed):
        return role
    if user is None:
        raise ApiError(401, "Requires authentication")
    if needed == "admin":
        raise ApiError(403, "Must have admin rights to Repository.")
    raise no_access(user)
