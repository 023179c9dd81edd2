"""Site-admin endpoints (admin token only), GitHub Enterprise style, plus the forge's fault and delivery admin.

``POST /admin/users`` and ``POST /admin/organizations`` refuse an existing login with 422; tokens come from
``POST /admin/users/{login}/authorizations``. ``/admin/faults`` manages fault rules and ``/admin/deliveries``
lists every recorded webhook delivery, newest last (both forge-specific).
"""

from __future__ import annotations

import json
from typing import Any

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
