"""GitHub Apps: App JWTs, installations and installation tokens, checked as github.com checks them.

An App authenticates as itself with a JWT (``Authorization: Bearer JWT``) signed RS256 with its private key:
``iss`` is the App ID (string or number), ``iat`` and ``exp`` are present, ``exp`` lies in the future and at
most ten minutes after ``iat``, and ``iat`` may lie up to :data:`IAT_LEEWAY_S` in the future (clock drift).
Anything else is 401 with GitHub's message. Only the App routes accept a JWT.

An installation token (``ghs_...``) is issued to the App for one installation and lasts the App's
``token_lifetime_s`` (GitHub: one hour); afterwards it is 401 "Bad credentials" for REST and git alike. It acts
as the App's bot user ``SLUG[bot]`` (type ``Bot``) within the installation (:func:`infra.forge.auth.installation_role`).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
from datetime import UTC, datetime
from typing import Any

import jwt

from . import shapes_core as core
from .auth import bearer_token, looks_like_jwt
from .router import Ctx
from .view import View, node_id
from .wire import ApiError

MAX_JWT_LIFETIME_S = 600
IAT_LEEWAY_S = 60
DEFAULT_TOKEN_LIFETIME_S = 3600

_JWS = jwt.PyJWS()
_NOT_DECODED = "A JSON web token could not be decoded"
_BAD_EXP = (
    "'Expiration time' claim ('exp') must be a numeric value representing the future time at which the "
    "assertion expires"
)
_FAR_EXP = "'Expiration time' claim ('exp') is too far in the future"
_BAD_IAT = "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued"


def new_installation_token() -> str:
    return "ghs_" + secrets.token_urlsafe(27).replace("-", "A").replace("_", "B")[:36]


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _claim_time(claims: dict[str, Any], name: str) -> int | None:
    value = claims.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def verify_jwt(db: sqlite3.Connection, token: str) -> sqlite3.Row:
    """The App that signed ``token``; a token GitHub would refuse is a 401 with GitHub's message."""
    # JWS-level decoding: PyJWT's claim checks would refuse a numeric ``iss``, which GitHub accepts.
    try:
        unverified = _JWS.decode_complete(token, options={"verify_signature": False})
        claims = json.loads(unverified["payload"])
    except (jwt.PyJWTError, ValueError) as exc:
        raise ApiError(401, _NOT_DECODED) from exc
    header = unverified["header"]
    if not isinstance(claims, dict):
        raise ApiError(401, _NOT_DECODED)
    issuer = claims.get("iss")
    if header.get("alg") != "RS256" or isinstance(issuer, bool) or not isinstance(issuer, int | str):
        raise ApiError(401, _NOT_DECODED)
    try:
        app_id = int(issuer)
    except ValueError as exc:
        raise ApiError(401, _NOT_DECODED) from exc
    app: sqlite3.Row | None = db.execute("SELECT * FROM apps WHERE id = ?", (app_id,)).fetchone()
    if app is None:
        raise ApiError(401, _NOT_DECODED)
    try:
        # Signature only: the time claims are checked below, each with GitHub's own message.
        _JWS.decode(token, app["public_key"], algorithms=["RS256"])
    except jwt.PyJWTError as exc:
        raise ApiError(401, _NOT_DECODED) from exc
    now = time.time()
    issued, expires = _claim_time(claims, "iat"), _claim_time(claims, "exp")
    if issued is None or issued > now + IAT_LEEWAY_S:
        raise ApiError(401, _BAD_IAT)
    if expires is None or expires <= now:
        raise ApiError(401, _BAD_EXP)
    if expires - issued > MAX_JWT_LIFETIME_S:
        raise ApiError(401, _FAR_EXP)
    return app


def require_app(ctx: Ctx) -> sqlite3.Row:
    """The App authenticating this request with a JWT; 401 for anything else."""
    token = bearer_token(ctx.request.headers)
    if token is None:
        raise ApiError(401, "A JSON web token could not be decoded")
    if not looks_like_jwt(token):
        raise ApiError(401, _NOT_DECODED)
    return verify_jwt(ctx.db, token)


def installation_row(v: View, installation_id: int) -> sqlite3.Row:
    return v.existing("SELECT * FROM installations WHERE id = ?", (installation_id,))


def covering_installation(v: View, app_id: int, repo: sqlite3.Row) -> sqlite3.Row | None:
    """The App's installation that reaches ``repo``, if any."""
    row: sqlite3.Row | None = v.db.execute(
        "SELECT * FROM installations WHERE app_id = ? AND account_id = ? AND (repository_selection = 'all' "
        "OR id IN (SELECT installation_id FROM installation_repos WHERE repo_id = ?))",
        (app_id, repo["owner_id"], repo["id"]),
    ).fetchone()
    return row


def issue_token(v: View, installation: sqlite3.Row) -> dict[str, Any]:
    """A new installation token and the answer GitHub gives for it (201)."""
    app = v.db.execute("SELECT * FROM apps WHERE id = ?", (installation["app_id"],)).fetchone()
    token = new_installation_token()
    expires = time.time() + app["token_lifetime_s"]
    v.db.execute(
        "INSERT INTO installation_tokens (token, installation_id, created_at, expires_at) VALUES (?, ?, ?, ?)",
        (token, installation["id"], iso(time.time()), expires),
    )
    answer: dict[str, Any] = {
        "token": token,
        "expires_at": iso(expires),
        "permissions": json.loads(installation["permissions"]),
        "repository_selection": installation["repository_selection"],
    }
    if installation["repository_selection"] == "selected":
        answer["repositories"] = [core.repo(v, r) for r in selected_repos(v, installation)]
    return answer


def selected_repos(v: View, installation: sqlite3.Row) -> list[sqlite3.Row]:
    return list(
        v.db.execute(
            "SELECT repos.* FROM repos JOIN installation_repos ON installation_repos.repo_id = repos.id "
            "WHERE installation_repos.installation_id = ? ORDER BY repos.id",
            (installation["id"],),
        )
    )


def app_json(v: View, app: sqlite3.Row) -> dict[str, Any]:
    owner = core.user(v, v.user_row(app["owner_id"])) if app["owner_id"] is not None else None
    count = v.db.execute("SELECT COUNT(*) FROM installations WHERE app_id = ?", (app["id"],)).fetchone()[0]
    return {
        "id": app["id"],
        "slug": app["slug"],
        "client_id": f"Iv1.{app['id']:016x}",
        "node_id": node_id("Integration", app["id"]),
        "owner": owner,
        "name": app["name"],
        "description": "",
        "external_url": f"{v.base_url}/apps/{app['slug']}",
        "html_url": f"{v.base_url}/apps/{app['slug']}",
        "created_at": app["created_at"],
        "updated_at": app["created_at"],
        "permissions": {},
        "events": [],
        "installations_count": count,
    }


def installation_json(v: View, inst: sqlite3.Row) -> dict[str, Any]:
    app = v.db.execute("SELECT * FROM apps WHERE id = ?", (inst["app_id"],)).fetchone()
    account = v.user_row(inst["account_id"])
    return {
        "id": inst["id"],
        "account": core.user(v, account),
        "repository_selection": inst["repository_selection"],
        "access_tokens_url": f"{v.api}/app/installations/{inst['id']}/access_tokens",
        "repositories_url": f"{v.api}/installation/repositories",
        "html_url": f"{v.base_url}/settings/installations/{inst['id']}",
        "app_id": app["id"],
        "app_slug": app["slug"],
        "client_id": f"Iv1.{app['id']:016x}",
        "target_id": account["id"],
        "target_type": account["type"],
        "permissions": json.loads(inst["permissions"]),
        "events": [],
        "created_at": inst["created_at"],
        "updated_at": inst["created_at"],
        "single_file_name": None,
        "has_multiple_single_files": False,
        "single_file_paths": [],
        "suspended_by": None,
        "suspended_at": None,
    }
