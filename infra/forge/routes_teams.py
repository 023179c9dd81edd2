"""Organisation teams and their memberships, as much of GitHub's team API as a membership check needs.

- ``POST /orgs/{org}/teams`` (an organisation owner): a team whose slug is its name lowercased with every run of
  other characters a hyphen; 422 when the slug exists. The creator becomes its maintainer, as on GitHub.
- ``GET /orgs/{org}/teams/{team_slug}``: the team, to members of the organisation (404 to anyone else).
- ``PUT /orgs/{org}/teams/{team_slug}/memberships/{username}`` (an owner, or a maintainer of the team): adds or
  changes a membership (``role`` ``member`` or ``maintainer``). A user who is not a member of the organisation
  is invited: the membership is ``pending`` until they join it, then ``active``, as GitHub's invitation does.
- ``GET .../memberships/{username}``: 200 with the role and state; 404 when there is no such team or membership,
  or the caller is not a member of the organisation (GitHub hides teams from outsiders).
- ``DELETE .../memberships/{username}``: 204 (an owner, a maintainer of the team, or the member themselves).
- ``PUT /admin/organizations/{org}/members/{login}`` (admin token only, forge-specific): makes ``login`` a
  member of the organisation at once (GitHub's invitation accepted), activating their pending team memberships.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from . import shapes_core as core
from .names import now_iso
from .router import Ctx, RouteTable
from .view import ids
from .wire import ApiError, Response, invalid_field, not_found, validation_failed

routes = RouteTable()

TEAM_ROLES = ("member", "maintainer")


def slug_of(name: str) -> str:
    """GitHub's slug of a team name: lowercased, every run of characters other than letters, digits, ``_`` and
    ``-`` made one hyphen, no hyphen at either end."""
    return re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-")


def _org(ctx: Ctx) -> sqlite3.Row:
    row = ctx.user_by_login(ctx.p("org"))
    if row is None or row["type"] != "Organization":
        raise not_found()
    return row


def _org_role(ctx: Ctx, org: sqlite3.Row, user_id: int) -> str | None:
    found = ctx.db.execute(
        "SELECT role FROM org_members WHERE org_id = ? AND user_id = ?", (org["id"], user_id)
    ).fetchone()
    return None if found is None else str(found["role"])


def _visible_org(ctx: Ctx) -> sqlite3.Row:
    """The path's organisation, when the caller may see its teams (a member, or the site admin); else 404."""
    org = _org(ctx)
    if ctx.is_admin:
        return org
    viewer = ctx.require_viewer()
    if _org_role(ctx, org, viewer["id"]) is None:
        raise not_found()
    return org


def _team(ctx: Ctx, org: sqlite3.Row) -> sqlite3.Row:
    query = "SELECT * FROM teams WHERE org_id = ? AND slug = ?"
    row: sqlite3.Row | None = ctx.db.execute(query, (org["id"], ctx.p("team"))).fetchone()
    if row is None:
        raise not_found()
    return row


def _user(ctx: Ctx, name: str) -> sqlite3.Row:
    row = ctx.user_by_login(ctx.p(name))
    if row is None or row["type"] != "User":
        raise not_found()
    return row


def _may_manage(ctx: Ctx, org: sqlite3.Row, team: sqlite3.Row) -> bool:
    """An organisation owner, a maintainer of the team, or the site admin."""
    if ctx.is_admin:
        return True
    viewer = ctx.require_viewer()
    if _org_role(ctx, org, viewer["id"]) == "admin":
        return True
    found = ctx.db.execute(
        "SELECT role FROM team_members WHERE team_id = ? AND user_id = ? AND state = 'active'",
        (team["id"], viewer["id"]),
    ).fetchone()
    return found is not None and found["role"] == "maintainer"


def team_shape(ctx: Ctx, org: sqlite3.Row, row: sqlite3.Row) -> dict[str, Any]:
    api = f"{ctx.api}/organizations/{org['id']}/team/{row['id']}"
    members = ctx.db.execute(
        "SELECT COUNT(*) FROM team_members WHERE team_id = ? AND state = 'active'", (row["id"],)
    ).fetchone()[0]
    return {
        **ids("Team", row["id"]),
        "url": api,
        "html_url": f"{ctx.base_url}/orgs/{org['login']}/teams/{row['slug']}",
        "name": row["name"],
        "slug": row["slug"],
        "description": row["description"],
        "privacy": row["privacy"],
        "notification_setting": "notifications_enabled",
        "permission": "pull",
        "members_url": f"{api}/members{{/member}}",
        "repositories_url": f"{api}/repos",
        "parent": None,
        "members_count": members,
        "repos_count": 0,
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "organization": organization_full(ctx, org),
        "type": "organization",
    }


def organization_full(ctx: Ctx, org: sqlite3.Row) -> dict[str, Any]:
    """The organisation as a team answer embeds it (GitHub's full organisation, counts the forge keeps)."""
    repos = ctx.db.execute("SELECT COUNT(*) FROM repos WHERE owner_id = ? AND private = 0", (org["id"],)).fetchone()[0]
    return {
        **core.organization(ctx, org),
        "name": org["login"],
        "html_url": f"{ctx.base_url}/{org['login']}",
        "has_organization_projects": False,
        "has_repository_projects": False,
        "public_repos": repos,
        "public_gists": 0,
        "followers": 0,
        "following": 0,
        "created_at": org["created_at"],
        "updated_at": org["created_at"],
        "archived_at": None,
        "type": "Organization",
    }


def membership_shape(
    ctx: Ctx, org: sqlite3.Row, team: sqlite3.Row, user: sqlite3.Row, row: sqlite3.Row
) -> dict[str, Any]:
    return {
        "url": f"{ctx.api}/organizations/{org['id']}/team/{team['id']}/memberships/{user['login']}",
        "role": row["role"],
        "state": row["state"],
    }


@routes.add("POST", "/orgs/{org}/teams")
def create_team(ctx: Ctx) -> Response:
    org = _org(ctx)
    viewer = ctx.require_viewer()
    role = _org_role(ctx, org, viewer["id"])
    if role is None:
        raise not_found()
    if role != "admin":
        raise ApiError(403, "You must be an organization owner to create teams.")
    data = ctx.request.json_object()
    name = data.get("name")
    if not isinstance(name, str) or not slug_of(name):
        raise invalid_field("Team", "name", "missing_field")
    description = data.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid_field("Team", "description")
    privacy = data.get("privacy", "secret")
    if privacy not in ("secret", "closed"):
        raise invalid_field("Team", "privacy")
    slug = slug_of(name)
    if ctx.db.execute("SELECT 1 FROM teams WHERE org_id = ? AND slug = ?", (org["id"], slug)).fetchone():
        raise validation_failed({"resource": "Team", "code": "already_exists", "field": "name"})
    now = now_iso()
    cur = ctx.db.execute(
        "INSERT INTO teams (org_id, name, slug, description, privacy, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (org["id"], name, slug, description, privacy, now, now),
    )
    team_id = int(cur.lastrowid or 0)
    ctx.db.execute(
        "INSERT INTO team_members (team_id, user_id, role, state) VALUES (?, ?, 'maintainer', 'active')",
        (team_id, viewer["id"]),
    )
    row = ctx.db.execute("SELECT * FROM teams WHERE id = ?", (team_id,)).fetchone()
    return Response.json(201, team_shape(ctx, org, row))


@routes.add("GET", "/orgs/{org}/teams/{team}")
def get_team(ctx: Ctx) -> Response:
    org = _visible_org(ctx)
    return Response.json(200, team_shape(ctx, org, _team(ctx, org)))


@routes.add("GET", "/orgs/{org}/teams/{team}/memberships/{user}")
def get_membership(ctx: Ctx) -> Response:
    org = _visible_org(ctx)
    team = _team(ctx, org)
    user = _user(ctx, "user")
    row = ctx.db.execute(
        "SELECT * FROM team_members WHERE team_id = ? AND user_id = ?", (team["id"], user["id"])
    ).fetchone()
    if row is None:
        raise not_found()
    return Response.json(200, membership_shape(ctx, org, team, user, row))


@routes.add("PUT", "/orgs/{org}/teams/{team}/memberships/{user}")
def put_membership(ctx: Ctx) -> Response:
    org = _visible_org(ctx)
    team = _team(ctx, org)
    if not _may_manage(ctx, org, team):
        raise ApiError(403, "You must be an organization owner or team maintainer to add a team membership.")
    user = _user(ctx, "user")
    role = ctx.request.json_object().get("role", "member")
    if role not in TEAM_ROLES:
        raise invalid_field("TeamMember", "role")
    state = "active" if _org_role(ctx, org, user["id"]) is not None else "pending"
    ctx.db.execute(
        "INSERT INTO team_members (team_id, user_id, role, state) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (team_id, user_id) DO UPDATE SET role = excluded.role",
        (team["id"], user["id"], role, state),
    )
    row = ctx.db.execute(
        "SELECT * FROM team_members WHERE team_id = ? AND user_id = ?", (team["id"], user["id"])
    ).fetchone()
    return Response.json(200, membership_shape(ctx, org, team, user, row))


@routes.add("DELETE", "/orgs/{org}/teams/{team}/memberships/{user}")
def delete_membership(ctx: Ctx) -> Response:
    org = _visible_org(ctx)
    team = _team(ctx, org)
    user = _user(ctx, "user")
    if not (_may_manage(ctx, org, team) or (ctx.viewer is not None and ctx.viewer["id"] == user["id"])):
        raise ApiError(403, "You must be an organization owner or team maintainer to remove a team membership.")
    ctx.db.execute("DELETE FROM team_members WHERE team_id = ? AND user_id = ?", (team["id"], user["id"]))
    return Response.empty()


@routes.add("PUT", "/admin/organizations/{org}/members/{user}")
def add_org_member(ctx: Ctx) -> Response:
    if not ctx.is_admin:
        raise not_found()
    org = _org(ctx)
    user = _user(ctx, "user")
    ctx.db.execute(
        "INSERT INTO org_members (org_id, user_id, role) VALUES (?, ?, 'member') ON CONFLICT DO NOTHING",
        (org["id"], user["id"]),
    )
    ctx.db.execute(
        "UPDATE team_members SET state = 'active' WHERE user_id = ? AND state = 'pending' "
        "AND team_id IN (SELECT id FROM teams WHERE org_id = ?)",
        (user["id"], org["id"]),
    )
    return Response.empty()
