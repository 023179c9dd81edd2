"""The GitHub App endpoints an App calls with its JWT: itself, its installations, a repository's installation,
and installation access tokens (201 ``{token, expires_at, permissions, repository_selection}``)."""

from __future__ import annotations

import sqlite3

from . import apps
from .router import Ctx, RouteTable
from .wire import Response, not_found

routes = RouteTable()


@routes.add("GET", "/app")
def get_app(ctx: Ctx) -> Response:
    return Response.json(200, apps.app_json(ctx, apps.require_app(ctx)))


@routes.add("GET", "/app/installations")
def list_installations(ctx: Ctx) -> Response:
    app = apps.require_app(ctx)
    rows = ctx.db.execute("SELECT * FROM installations WHERE app_id = ? ORDER BY id", (app["id"],)).fetchall()
    return Response.json(200, [apps.installation_json(ctx, r) for r in rows])


@routes.add("GET", "/app/installations/{installation_id}")
def get_installation(ctx: Ctx) -> Response:
    return Response.json(200, apps.installation_json(ctx, _own_installation(ctx)))


@routes.add("GET", "/repos/{owner}/{repo}/installation")
def get_repo_installation(ctx: Ctx) -> Response:
    app = apps.require_app(ctx)
    repo = ctx.find_repo(ctx.p("owner"), ctx.p("repo"))
    inst = apps.covering_installation(ctx, app["id"], repo)
    if inst is None:
        raise not_found()
    return Response.json(200, apps.installation_json(ctx, inst))


@routes.add("POST", "/app/installations/{installation_id}/access_tokens")
def create_access_token(ctx: Ctx) -> Response:
    inst = _own_installation(ctx)
    # Narrowing a token to fewer repositories or permissions is not modelled: the body is only validated.
    ctx.request.json_object()
    return Response.json(201, apps.issue_token(ctx, inst))


def _own_installation(ctx: Ctx) -> sqlite3.Row:
    app = apps.require_app(ctx)
    inst = apps.installation_row(ctx, ctx.id_param("installation_id"))
    if inst["app_id"] != app["id"]:
        raise not_found()
    return inst
