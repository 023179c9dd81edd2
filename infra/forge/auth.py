"""Who is calling and what they may do.

Tokens come in ``Authorization: token X`` / ``Bearer X`` (API) or as the password of HTTP Basic auth (git and
API alike). An unknown token is 401 "Bad credentials" even where anonymous access would be allowed, as on
GitHub. Repository roles follow GitHub's ladder read < triage < write < maintain < admin: the owning user and
an owning organisation's owners are admin, collaborators have their granted role, anyone may read a public
repository, and a private repository the caller cannot read does not exist for them (404, never 403).
"""

from __future__ import annotations

import base64
import secrets
import sqlite3
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


def user_for_token(db: sqlite3.Connection, token: str) -> sqlite3.Row | None:
    row: sqlite3.Row | None = db.execute(
        "SELECT users.* FROM tokens JOIN users ON users.id = tokens.user_id WHERE tokens.token = ?", (token,)
    ).fetchone()
    return row


def authenticate(db: sqlite3.Connection, headers: Message) -> sqlite3.Row | None:
    token = bearer_token(headers)
    if token is None:
        return None
    user = user_for_token(db, token) if token else None
    if user is None:
        raise ApiError(401, "Bad credentials")
    return user


def role_at_least(role: str | None, needed: str) -> bool:
    return role is not None and ROLES.index(role) >= ROLES.index(needed)


def repo_role(db: sqlite3.Connection, repo: sqlite3.Row, user: sqlite3.Row | None) -> str | None:
    """The caller's effective role on ``repo``; None when they cannot even read it."""
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
    raise ApiError(403, "Resource not accessible by personal access token")
