"""Repositories, branches and collaborators.

Creating a repository is keyed by ``OWNER/NAME``: a second create answers 422 "name already exists on this
account", so a client that lost the first answer can look the repository up instead of creating another.
``auto_init`` makes an initial commit with a README on the default branch (``main``). Collaborators are added
directly (204), as for organisation members on GitHub; invitations are not modelled. A repository's merge
settings (``allow_merge_commit``, ``allow_squash_merge``) are set at creation or by ``PATCH``; at least one
must stay allowed, and rebase merges are never allowed (not implemented).
"""

from __future__ import annotations

import shutil
import sqlite3
from typing import Any

from . import shapes_core as core
from . import shapes_git
from .auth import ROLE_ALIASES, repo_role, require_role, role_at_least
from .names import now_iso, valid_branch, valid_repo_name
from .paging import paginate
from .router import Ctx, RouteTable
from .wire import ApiError, Response, invalid_field, not_found, validation_failed

routes = RouteTable()
DEFAULT_BRANCH = "main"
# The merge methods a repository may allow, as its settings name them, with what a new repository allows.
# Rebase merges are not implemented, so the forge never allows them.
MERGE_SETTINGS = {"allow_merge_commit": True, "allow_squash_merge": True, "allow_rebase_merge": False}


def _merge_settings(data: dict[str, Any], current: dict[str, bool]) -> dict[str, bool]:
    """``current`` with the merge settings ``data`` names; GitHub's 422 when none would be left allowed."""
    settings = dict(current)
    for name in MERGE_SETTINGS:
        if name in data:
            if not isinstance(data[name], bool):
                raise invalid_field("Repository", name)
            settings[name] = data[name]
    if settings["allow_rebase_merge"]:
        raise validation_failed(
            {
                "resource": "Repository",
                "code": "custom",
                "field": "allow_rebase_merge",
                "message": "rebase merges are not supported by this forge",
            }
        )
    if not any(settings.values()):
        raise validation_failed(
            {
                "resource": "Repository",
                "code": "invalid",
                "field": "merge_commit_allowed",
                "message": "Sorry, you need to allow at least one merge strategy. (no_merge_strategy)",
            }
        )
    return settings


def load_repo(ctx: Ctx, needed: str = "read") -> sqlite3.Row:
    """The repository named by the route's ``owner``/``repo``, if the caller holds ``needed`` on it."""
    repo = ctx.find_repo(ctx.p("owner"), ctx.p("repo"))
    require_role(ctx.db, repo, ctx.viewer, needed)
    return repo


def _create(ctx: Ctx, owner: sqlite3.Row, data: dict[str, Any]) -> Response:
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise invalid_field("Repository", "name", "missing_field")
    if not valid_repo_name(name):
        raise validation_failed(
            {"resource": "Repository", "code": "custom", "field": "name", "message": "name is invalid"}
        )
    private = data.get("private", False)
    description = data.get("description")
    if not isinstance(private, bool):
        raise invalid_field("Repository", "private")
    if description is not None and not isinstance(description, str):
        raise invalid_field("Repository", "description")
    exists = ctx.db.execute("SELECT 1 FROM repos WHERE owner_id = ? AND name = ?", (owner["id"], name)).fetchone()
    if exists:
        raise validation_failed(
            {
                "resource": "Repository",
                "code": "custom",
                "field": "name",
                "message": "name already exists on this account",
            }
        )
    merging = _merge_settings(data, MERGE_SETTINGS)
    now = now_iso()
    cur = ctx.db.execute(
        "INSERT INTO repos (owner_id, name, description, private, default_branch, created_at, updated_at,"
        " allow_merge_commit, allow_squash_merge, allow_rebase_merge) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            owner["id"],
            name,
            description,
            int(private),
            DEFAULT_BRANCH,
            now,
            now,
            *(int(merging[key]) for key in MERGE_SETTINGS),
        ),
    )
    repo = ctx.repo_row(int(cur.lastrowid or 0))
    path = ctx.repo_path(repo)
    # A directory without a row is debris of a create that was rolled back; it belongs to nobody.
    if path.exists():
        shutil.rmtree(path)
    git = ctx.git(repo)
    git.init_bare(DEFAULT_BRANCH)
    if data.get("auto_init"):
        who = ctx.identity(ctx.require_viewer())
        readme = f"# {name}\n" + (f"\n{description}\n" if description else "")
        tree = git.build_tree(None, [("README.md", "100644", git.hash_blob(readme.encode()))])
        sha = git.commit_tree(tree, [], "Initial commit", who, who)
        git.update_ref(f"refs/heads/{DEFAULT_BRANCH}", sha, None)
        ctx.db.execute("UPDATE repos SET pushed_at = ? WHERE id = ?", (now, repo["id"]))
    return Response.json(201, core.full_repo(ctx, ctx.repo_row(repo["id"])))


@routes.add("POST", "/user/repos")
def create_user_repo(ctx: Ctx) -> Response:
    viewer = ctx.require_viewer()
    return _create(ctx, viewer, ctx.request.json_object())


@routes.add("POST", "/orgs/{org}/repos")
def create_org_repo(ctx: Ctx) -> Response:
    viewer = ctx.require_viewer()
    org = ctx.user_by_login(ctx.p("org"))
    if org is None or org["type"] != "Organization":
        raise not_found()
    member = ctx.db.execute(
        "SELECT role FROM org_members WHERE org_id = ? AND user_id = ?", (org["id"], viewer["id"])
    ).fetchone()
    if member is None or member["role"] != "admin":
        raise ApiError(403, "You need admin access to the organization before adding a repository to it.")
    return _create(ctx, org, ctx.request.json_object())


@routes.add("GET", "/user/repos")
def list_own_repos(ctx: Ctx) -> Response:
    viewer = ctx.require_viewer()
    rows = ctx.db.execute(
        "SELECT DISTINCT repos.* FROM repos "
        "LEFT JOIN collaborators c ON c.repo_id = repos.id AND c.user_id = :u "
        "LEFT JOIN org_members m ON m.org_id = repos.owner_id AND m.user_id = :u "
        "WHERE repos.owner_id = :u OR c.user_id IS NOT NULL OR m.user_id IS NOT NULL ORDER BY repos.id",
        {"u": viewer["id"]},
    ).fetchall()
    return paginate(ctx, rows, lambda r: core.repo(ctx, r))


@routes.add("GET", "/repos/{owner}/{repo}")
def get_repo(ctx: Ctx) -> Response:
    return Response.json(200, core.full_repo(ctx, load_repo(ctx)))


@routes.add("PATCH", "/repos/{owner}/{repo}")
def edit_repo(ctx: Ctx) -> Response:
    """Edit the description, visibility and merge settings (admin only); other fields are ignored, and a
    different ``name`` is refused because renames are not modelled."""
    repo = load_repo(ctx, "admin")
    data = ctx.request.json_object()
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or name.lower() != str(repo["name"]).lower()):
        raise validation_failed(
            {"resource": "Repository", "code": "custom", "field": "name", "message": "renaming is not supported"}
        )
    description = data.get("description", repo["description"])
    if description is not None and not isinstance(description, str):
        raise invalid_field("Repository", "description")
    private = data.get("private", bool(repo["private"]))
    if not isinstance(private, bool):
        raise invalid_field("Repository", "private")
    merging = _merge_settings(data, {key: bool(repo[key]) for key in MERGE_SETTINGS})
    ctx.db.execute(
        "UPDATE repos SET description = ?, private = ?, allow_merge_commit = ?, allow_squash_merge = ?,"
        " allow_rebase_merge = ?, updated_at = ? WHERE id = ?",
        (description, int(private), *(int(merging[key]) for key in MERGE_SETTINGS), now_iso(), repo["id"]),
    )
    return Response.json(200, core.full_repo(ctx, ctx.repo_row(repo["id"])))


@routes.add("GET", "/repos/{owner}/{repo}/branches")
def list_branches(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    refs = sorted(ctx.git(repo).list_refs("refs/heads/").items())
    return paginate(ctx, refs, lambda item: shapes_git.branch(ctx, repo, item[0][11:], item[1], full=False))


@routes.add("GET", "/repos/{owner}/{repo}/branches/{branch:path}")
def get_branch(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    name = ctx.p("branch")
    sha = ctx.git(repo).read_ref(f"refs/heads/{name}") if valid_branch(name) else None
    if sha is None:
        raise ApiError(404, "Branch not found")
    return Response.json(200, shapes_git.branch(ctx, repo, name, sha, full=True))


def _user_param(ctx: Ctx) -> sqlite3.Row:
    row = ctx.user_by_login(ctx.p("user"))
    if row is None or row["type"] != "User":
        raise not_found()
    return row


@routes.add("PUT", "/repos/{owner}/{repo}/collaborators/{user}")
def add_collaborator(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "admin")
    user = _user_param(ctx)
    permission = ctx.request.json_object().get("permission", "push")
    role = ROLE_ALIASES.get(permission) if isinstance(permission, str) else None
    if role is None:
        raise invalid_field("Collaborator", "permission")
    if user["id"] == repo["owner_id"]:
        raise validation_failed(
            {
                "resource": "Repository",
                "code": "custom",
                "field": "collaborator",
                "message": "Repository owner cannot be a collaborator",
            }
        )
    ctx.db.execute(
        "INSERT INTO collaborators (repo_id, user_id, role) VALUES (?, ?, ?) "
        "ON CONFLICT (repo_id, user_id) DO UPDATE SET role = excluded.role",
        (repo["id"], user["id"], role),
    )
    return Response.empty()


@routes.add("DELETE", "/repos/{owner}/{repo}/collaborators/{user}")
def remove_collaborator(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "admin")
    user = _user_param(ctx)
    ctx.db.execute("DELETE FROM collaborators WHERE repo_id = ? AND user_id = ?", (repo["id"], user["id"]))
    return Response.empty()


def _require_push(ctx: Ctx, repo: sqlite3.Row, message: str) -> None:
    """GitHub's answer to a caller without push access on the collaborator endpoints: 401 anonymous, else 403."""
    if not role_at_least(repo_role(ctx.db, repo, ctx.viewer), "write"):
        if ctx.viewer is None:
            raise ApiError(401, "Requires authentication")
        raise ApiError(403, message)


@routes.add("GET", "/repos/{owner}/{repo}/collaborators")
def list_collaborators(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    _require_push(ctx, repo, "Must have push access to view repository collaborators.")
    owner = ctx.user_row(repo["owner_id"])
    members: list[tuple[sqlite3.Row, str]] = []
    if owner["type"] == "User":
        members.append((owner, "admin"))
    for row in ctx.db.execute(
        "SELECT users.*, collaborators.role AS role FROM collaborators JOIN users ON users.id = "
        "collaborators.user_id WHERE collaborators.repo_id = ? ORDER BY users.id",
        (repo["id"],),
    ).fetchall():
        members.append((ctx.user_row(row["id"]), row["role"]))
    return paginate(ctx, members, lambda m: core.collaborator(ctx, m[0], m[1]))


@routes.add("GET", "/repos/{owner}/{repo}/collaborators/{user}")
def check_collaborator(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    user = _user_param(ctx)
    if repo_role(ctx.db, repo, user) in (None, "read") and user["id"] != repo["owner_id"]:
        collab = ctx.db.execute(
            "SELECT 1 FROM collaborators WHERE repo_id = ? AND user_id = ?", (repo["id"], user["id"])
        ).fetchone()
        if collab is None:
            raise not_found()
    return Response.empty()


@routes.add("GET", "/repos/{owner}/{repo}/collaborators/{user}/permission")
def get_permission(ctx: Ctx) -> Response:
    """The user's permission; only callers with push access may ask (403 otherwise, as on GitHub)."""
    repo = load_repo(ctx)
    _require_push(ctx, repo, "Must have push access to view collaborator permission.")
    user = _user_param(ctx)
    role = repo_role(ctx.db, repo, user)
    if not repo["private"] and role == "read":
        collab = ctx.db.execute(
            "SELECT 1 FROM collaborators WHERE repo_id = ? AND user_id = ?", (repo["id"], user["id"])
        ).fetchone()
        role = "read" if collab else None
    return Response.json(200, core.collaborator_permission(ctx, user, role))
