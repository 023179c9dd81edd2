"""Site-admin endpoints (admin token only), GitHub Enterprise style, plus the forge's fault and delivery admin.

``POST /admin/users`` and ``POST /admin/organizations`` refuse an existing login with 422; tokens come from
``POST /admin/users/{login}/authorizations``. GitHub Apps are registered with ``POST /admin/apps`` (``id``,
``slug``, ``name``, ``public_key`` PEM, optional ``owner`` and ``token_lifetime_s``; creates the bot user
``SLUG[bot]``), installed with ``POST /admin/apps/{slug}/installations`` (``account``, ``repository_selection``
``all``/``selected``, ``repositories`` names, ``permissions``), and ``GET /admin/apps/{slug}/tokens`` lists
the installation tokens issued (never their values). ``/admin/faults`` manages fault rules, ``/admin/deliveries``
lists every recorded webhook delivery, newest last, and ``PUT /admin/issue-events`` turns the issue events
endpoint on or off (all forge-specific).
"""

from __future__ import annotations

import json
from typing import Any

from cryptography.hazmat.primitives.serialization import load_pem_public_key

from . import apps
from . import shapes_core as core
from .auth import new_token
from .names import now_iso, valid_login
from .router import Ctx, RouteTable
from .wire import Response, invalid_field, not_found, validation_failed

routes = RouteTable()


def _require_admin(ctx: Ctx) -> None:
    if not ctx.is_admin:
        raise not_found()


def _create_account(ctx: Ctx, login: Any, email: Any, kind: str) -> int:
    if not isinstance(login, str) or not valid_login(login):
        raise invalid_field(kind, "login")
    if email is not None and not isinstance(email, str):
        raise invalid_field(kind, "email")
    if ctx.user_by_login(login) is not None:
        raise validation_failed({"resource": kind, "code": "already_exists", "field": "login"})
    cur = ctx.db.execute(
        "INSERT INTO users (login, email, type, created_at) VALUES (?, ?, ?, ?)",
        (login, email, "User" if kind == "User" else "Organization", now_iso()),
    )
    return int(cur.lastrowid or 0)


@routes.add("POST", "/admin/users")
def create_user(ctx: Ctx) -> Response:
    _require_admin(ctx)
    data = ctx.request.json_object()
    user_id = _create_account(ctx, data.get("login"), data.get("email"), "User")
    return Response.json(201, core.user(ctx, ctx.user_row(user_id)))


@routes.add("POST", "/admin/users/{login}/authorizations")
def create_token(ctx: Ctx) -> Response:
    _require_admin(ctx)
    ctx.request.json()
    row = ctx.user_by_login(ctx.p("login"))
    if row is None or row["type"] != "User":
        raise not_found()
    token = new_token()
    now = now_iso()
    ctx.db.execute("INSERT INTO tokens (token, user_id, created_at) VALUES (?, ?, ?)", (token, row["id"], now))
    return Response.json(
        201,
        {
            "id": ctx.db.execute("SELECT COUNT(*) FROM tokens").fetchone()[0],
            "url": f"{ctx.api}/authorizations",
            "token": token,
            "token_last_eight": token[-8:],
            "hashed_token": None,
            "scopes": ["repo", "admin:repo_hook", "admin:org"],
            "note": None,
            "created_at": now,
            "updated_at": now,
            "user": core.user(ctx, row),
        },
    )


@routes.add("POST", "/admin/organizations")
def create_org(ctx: Ctx) -> Response:
    _require_admin(ctx)
    data = ctx.request.json_object()
    admin = ctx.user_by_login(str(data.get("admin", "")))
    if admin is None or admin["type"] != "User":
        raise invalid_field("Organization", "admin")
    org_id = _create_account(ctx, data.get("login"), None, "Organization")
    ctx.db.execute("INSERT INTO org_members (org_id, user_id, role) VALUES (?, ?, 'admin')", (org_id, admin["id"]))
    return Response.json(201, core.organization(ctx, ctx.user_row(org_id)))


@routes.add("POST", "/admin/faults")
def add_fault(ctx: Ctx) -> Response:
    _require_admin(ctx)
    return Response.json(201, ctx.forge.faults.add(ctx.request.json_object()).as_json())


@routes.add("PUT", "/admin/issue-events")
def keep_issue_events(ctx: Ctx) -> Response:
    """``{"enabled": bool}``: whether ``GET .../issues/{number}/events`` answers (off: 404, the default)."""
    _require_admin(ctx)
    enabled = ctx.request.json_object().get("enabled")
    if not isinstance(enabled, bool):
        raise invalid_field("IssueEvents", "enabled")
    ctx.forge.issue_events = enabled
    return Response.json(200, {"enabled": enabled})


@routes.add("GET", "/admin/faults")
def list_faults(ctx: Ctx) -> Response:
    _require_admin(ctx)
    return Response.json(200, [f.as_json() for f in ctx.forge.faults.list()])


@routes.add("DELETE", "/admin/faults")
def clear_faults(ctx: Ctx) -> Response:
    _require_admin(ctx)
    ctx.forge.faults.clear()
    return Response.empty()


@routes.add("GET", "/admin/deliveries")
def all_deliveries(ctx: Ctx) -> Response:
    _require_admin(ctx)
    rows = ctx.db.execute("SELECT * FROM deliveries ORDER BY id").fetchall()
    return Response.json(
        200,
        [
            {
                "id": r["id"],
                "hook_id": r["hook_id"],
                "repository_id": r["repo_id"],
                "guid": r["guid"],
                "event": r["event"],
                "action": r["action"],
                "redelivery": bool(r["redelivery"]),
                "state": r["state"],
                "status": r["status"],
                "status_code": r["status_code"],
                "request": {"headers": json.loads(r["request_headers"]), "body": r["request_body"]},
            }
            for r in rows
        ],
    )


@routes.add("POST", "/admin/apps")
def register_app(ctx: Ctx) -> Response:
    """Register a GitHub App with its public key; its bot user ``SLUG[bot]`` (type Bot) is created with it."""
    _require_admin(ctx)
    data = ctx.request.json_object()
    app_id, slug, name, key = data.get("id"), data.get("slug"), data.get("name"), data.get("public_key")
    lifetime = data.get("token_lifetime_s", apps.DEFAULT_TOKEN_LIFETIME_S)
    if not isinstance(app_id, int) or isinstance(app_id, bool) or app_id <= 0:
        raise invalid_field("Integration", "id")
    if not isinstance(slug, str) or not valid_login(slug):
        raise invalid_field("Integration", "slug")
    if not isinstance(name, str) or not name:
        raise invalid_field("Integration", "name")
    try:
        load_pem_public_key(str(key).encode())
    except ValueError as exc:
        raise invalid_field("Integration", "public_key") from exc
    if not isinstance(lifetime, int) or isinstance(lifetime, bool) or not 1 <= lifetime <= 3600:
        raise invalid_field("Integration", "token_lifetime_s")
    owner = ctx.user_by_login(str(data["owner"])) if data.get("owner") is not None else None
    if data.get("owner") is not None and owner is None:
        raise invalid_field("Integration", "owner")
    bot = f"{slug}[bot]"
    taken = ctx.db.execute("SELECT 1 FROM apps WHERE id = ? OR slug = ?", (app_id, slug)).fetchone()
    if taken is not None or ctx.user_by_login(bot) is not None:
        raise validation_failed({"resource": "Integration", "code": "already_exists", "field": "slug"})
    now = now_iso()
    cur = ctx.db.execute("INSERT INTO users (login, email, type, created_at) VALUES (?, NULL, 'Bot', ?)", (bot, now))
    ctx.db.execute(
        "INSERT INTO apps (id, slug, name, public_key, owner_id, bot_user_id, token_lifetime_s, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (app_id, slug, name, key, owner["id"] if owner is not None else None, cur.lastrowid, lifetime, now),
    )
    return Response.json(201, apps.app_json(ctx, _app_by_slug(ctx, slug)))


@routes.add("POST", "/admin/apps/{slug}/installations")
def install_app(ctx: Ctx) -> Response:
    """Install the App on a user or organisation, for all its repositories or the ``selected`` ones."""
    _require_admin(ctx)
    app = _app_by_slug(ctx, ctx.p("slug"))
    data = ctx.request.json_object()
    account = ctx.user_by_login(str(data.get("account", "")))
    if account is None or account["type"] == "Bot":
        raise invalid_field("Installation", "account")
    selection = data.get("repository_selection", "all")
    if selection not in ("all", "selected"):
        raise invalid_field("Installation", "repository_selection")
    permissions = data.get("permissions", {"metadata": "read"})
    if not isinstance(permissions, dict) or not all(
        isinstance(k, str) and v in ("read", "write") for k, v in permissions.items()
    ):
        raise invalid_field("Installation", "permissions")
    names = data.get("repositories", [])
    if not isinstance(names, list) or (selection == "all" and names):
        raise invalid_field("Installation", "repositories")
    repos = [ctx.find_repo(account["login"], str(n)) for n in names]
    if ctx.db.execute(
        "SELECT 1 FROM installations WHERE app_id = ? AND account_id = ?", (app["id"], account["id"])
    ).fetchone():
        raise validation_failed({"resource": "Installation", "code": "already_exists", "field": "account"})
    cur = ctx.db.execute(
        "INSERT INTO installations (app_id, account_id, repository_selection, permissions, created_at) "
        "VALUES (?, ?, ?, ?, ?)",
        (app["id"], account["id"], selection, json.dumps(permissions), now_iso()),
    )
    for repo in repos:
        ctx.db.execute(
            "INSERT INTO installation_repos (installation_id, repo_id) VALUES (?, ?)", (cur.lastrowid, repo["id"])
        )
    return Response.json(201, apps.installation_json(ctx, apps.installation_row(ctx, int(cur.lastrowid or 0))))


@routes.add("GET", "/admin/apps/{slug}/tokens")
def issued_tokens(ctx: Ctx) -> Response:
    """The installation tokens issued to the App, oldest first: installation, times, the token's last eight."""
    _require_admin(ctx)
    app = _app_by_slug(ctx, ctx.p("slug"))
    rows = ctx.db.execute(
        "SELECT t.* FROM installation_tokens t JOIN installations i ON i.id = t.installation_id "
        "WHERE i.app_id = ? ORDER BY t.rowid",
        (app["id"],),
    ).fetchall()
    return Response.json(
        200,
        [
            {
                "installation_id": r["installation_id"],
                "token_last_eight": r["token"][-8:],
                "created_at": r["created_at"],
                "expires_at": apps.iso(r["expires_at"]),
            }
            for r in rows
        ],
    )


def _app_by_slug(ctx: Ctx, slug: str) -> Any:
    return ctx.existing("SELECT * FROM apps WHERE slug = ?", (slug,))
