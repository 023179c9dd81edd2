"""The authenticated user and public user/organisation profiles."""

from __future__ import annotations

from . import shapes_core as core
from .auth import installation_of
from .router import Ctx, RouteTable
from .wire import ApiError, Response, not_found

routes = RouteTable()


@routes.add("GET", "/user")
def get_authenticated_user(ctx: Ctx) -> Response:
    if installation_of(ctx.viewer) is not None:
        # As on GitHub: an installation token belongs to no user (the App's bot is found via GET /app).
        raise ApiError(403, "Resource not accessible by integration")
    return Response.json(200, core.private_user(ctx, ctx.require_viewer()))


@routes.add("GET", "/users/{login}")
def get_user(ctx: Ctx) -> Response:
    row = ctx.user_by_login(ctx.p("login"))
    if row is None:
        raise not_found()
    return Response.json(200, core.user(ctx, row))


@routes.add("GET", "/orgs/{org}")
def get_org(ctx: Ctx) -> Response:
    row = ctx.user_by_login(ctx.p("org"))
    if row is None or row["type"] != "Organization":
        raise not_found()
    return Response.json(200, core.organization(ctx, row))
