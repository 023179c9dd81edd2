"""Git data (blobs, trees, commits, refs), repository commits and commit statuses.

Refs are compare-and-swap writes, which is what makes them usable as atomic claims (for example
``refs/durafix/claims/X``): ``POST /git/refs`` succeeds for exactly one caller and answers 422 "Reference
already exists" to every other; ``PATCH`` without ``force`` only fast-forwards (422 "Update is not a fast
forward" otherwise). Blobs, trees and commits are content-addressed, so creating one twice is harmless.

On an empty repository (no refs: nothing was ever pushed) every git data endpoint, read or write, and the
commit listings answer 409 "Git Repository is empty.", as GitHub does: its git database does not exist yet,
and the first commit has to come from a push.
"""

from __future__ import annotations

import base64
import binascii
import re
import sqlite3
from typing import Any, TypeVar

from . import events, shapes_git
from .gitrepo import GitRepo, Identity
from .names import now_iso, valid_ref
from .paging import paginate
from .router import Ctx, RouteTable
from .routes_repos import load_repo
from .wire import ApiError, Response, invalid_field, not_found, validation_failed

routes = RouteTable()
T = TypeVar("T")
SHA = re.compile(r"^[0-9a-f]{40}$")
MODES = {"100644": "blob", "100755": "blob", "120000": "blob", "040000": "tree", "160000": "commit"}


EMPTY = "Git Repository is empty."


def load_git(ctx: Ctx, needed: str = "read") -> tuple[sqlite3.Row, GitRepo]:
    """The path's repository (``needed`` role checked first) and its git, or 409 when it is empty."""
    repo = load_repo(ctx, needed)
    git = ctx.git(repo)
    if git.is_empty():
        raise ApiError(409, EMPTY)
    return repo, git


def _object(git: GitRepo, sha: Any, kind: str | None) -> str:
    """``sha`` when it names an object of ``kind`` (of any kind when None); otherwise GitHub's 422."""
    if isinstance(sha, str) and SHA.match(sha):
        found = git.object_type(sha)
        if found is not None and kind in (None, found):
            return sha
    raise ApiError(422, "Object does not exist" if kind != "tree" else "Tree SHA does not exist")


def _required(data: dict[str, Any], resource: str, field: str, kind: type[T]) -> T:
    """``data[field]`` when it is a ``kind``; else the 422 GitHub answers for a missing ``field`` of ``resource``."""
    value = data.get(field)
    if not isinstance(value, kind):
        raise invalid_field(resource, field, "missing_field")
    return value


@routes.add("POST", "/repos/{owner}/{repo}/git/blobs")
def create_blob(ctx: Ctx) -> Response:
    repo, git = load_git(ctx, "write")
    data = ctx.request.json_object()
    content, encoding = _required(data, "Blob", "content", str), data.get("encoding", "utf-8")
    if encoding == "base64":
        try:
            raw = base64.b64decode(content, validate=False)
        except binascii.Error as exc:
            raise invalid_field("Blob", "content") from exc
    elif encoding in ("utf-8", "utf8"):
        raw = content.encode()
    else:
        raise validation_failed(
            {
                "resource": "Blob",
                "code": "custom",
                "field": "encoding",
                "message": f"encoding {encoding} is not supported",
            }
        )
    sha = git.hash_blob(raw)
    return Response.json(201, {"url": f"{ctx.repo_api(repo)}/git/blobs/{sha}", "sha": sha})


@routes.add("GET", "/repos/{owner}/{repo}/git/blobs/{sha}")
def get_blob(ctx: Ctx) -> Response:
    repo, git = load_git(ctx)
    sha = ctx.p("sha")
    if git.object_type(sha) != "blob":
        raise not_found()
    return Response.json(200, shapes_git.blob(ctx, repo, sha, git.cat("blob", sha)))


@routes.add("POST", "/repos/{owner}/{repo}/git/trees")
def create_tree(ctx: Ctx) -> Response:
    repo, git = load_git(ctx, "write")
    data = ctx.request.json_object()
    entries = _required(data, "Tree", "tree", list)
    base_tree = data.get("base_tree")
    if base_tree is not None:
        _object(git, base_tree, "tree")
    changes: list[tuple[str, str, str | None]] = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise invalid_field("Tree", "tree")
        path, mode = entry.get("path"), entry.get("mode")
        if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
            raise invalid_field("Tree", "tree.path")
        if mode not in MODES:
            raise invalid_field("Tree", "tree.mode")
        if "content" in entry:
            if not isinstance(entry["content"], str):
                raise invalid_field("Tree", "tree.content")
            changes.append((path, mode, git.hash_blob(entry["content"].encode())))
        elif entry.get("sha") is None:
            changes.append((path, mode, None))
        else:
            changes.append((path, mode, _object(git, entry["sha"], MODES[mode])))
    sha = git.build_tree(base_tree, changes)
    return Response.json(201, shapes_git.tree(ctx, repo, sha, recursive=False))


@routes.add("GET", "/repos/{owner}/{repo}/git/trees/{sha}")
def get_tree(ctx: Ctx) -> Response:
    repo, git = load_git(ctx)
    rev = ctx.p("sha")
    kind = git.object_type(rev) if SHA.match(rev) else None
    if kind == "commit":
        rev = git.commit_info(rev).tree
    elif kind != "tree":
        resolved = git.resolve_commit(rev) if not SHA.match(rev) else None
        if resolved is None:
            raise not_found()
        rev = git.commit_info(resolved).tree
    recursive = ctx.request.arg("recursive") not in (None, "", "0", "false")
    return Response.json(200, shapes_git.tree(ctx, repo, rev, recursive))


def _identity(value: Any, fallback: Identity, field_name: str) -> Identity:
    if value is None:
        return fallback
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not isinstance(value.get("email"), str):
        raise invalid_field("Commit", field_name)
    date = value.get("date") or fallback.date
    return Identity(value["name"], value["email"], str(date))


@routes.add("POST", "/repos/{owner}/{repo}/git/commits")
def create_commit(ctx: Ctx) -> Response:
    repo, git = load_git(ctx, "write")
    data = ctx.request.json_object()
    message = _required(data, "Commit", "message", str)
    tree = _object(git, data.get("tree"), "tree")
    parents = data.get("parents", [])
    if not isinstance(parents, list):
        raise invalid_field("Commit", "parents")
    parent_shas = [_object(git, p, "commit") for p in parents]
    who = ctx.identity(ctx.require_viewer())
    author = _identity(data.get("author"), who, "author")
    committer = _identity(data.get("committer"), author if data.get("author") else who, "committer")
    sha = git.commit_tree(tree, parent_shas, message, author, committer)
    return Response.json(201, shapes_git.git_commit(ctx, repo, git.commit_info(sha)))


@routes.add("GET", "/repos/{owner}/{repo}/git/commits/{sha}")
def get_git_commit(ctx: Ctx) -> Response:
    repo, git = load_git(ctx)
    sha = ctx.p("sha")
    if not SHA.match(sha) or git.object_type(sha) != "commit":
        raise not_found()
    return Response.json(200, shapes_git.git_commit(ctx, repo, git.commit_info(sha)))


def _ref_json(ctx: Ctx, repo: sqlite3.Row, ref: str, sha: str) -> dict[str, Any]:
    return shapes_git.git_ref(ctx, repo, ref, sha, ctx.git(repo).object_type(sha) or "commit")


def _path_ref(ctx: Ctx, git: GitRepo) -> tuple[str, str | None]:
    """The full name of the ref the path names and its SHA; None when the name is not valid or not there."""
    ref = "refs/" + ctx.p("ref")
    return ref, git.read_ref(ref) if valid_ref(ref) else None


def _ref_to_write(ctx: Ctx) -> tuple[sqlite3.Row, GitRepo, str, str | None]:
    """The repository (the viewer may write it), its git repository, and the path's ref as :func:`_path_ref` says."""
    repo, git = load_git(ctx, "write")
    return repo, git, *_path_ref(ctx, git)


def _set_ref(ctx: Ctx, repo: sqlite3.Row, git: GitRepo, ref: str, sha: str, old: str | None, lost: str) -> None:
    """Move ``ref`` from ``old`` (None: create it) to ``sha`` and tell the repository's webhooks, as the viewer's
    push. A 422 saying ``lost`` when ``ref`` is no longer at ``old``: someone else's write came first."""
    if not git.update_ref(ref, sha, old):
        raise ApiError(422, lost)
    events.refs_changed(ctx, repo, [(ref, old, sha)], ctx.require_viewer())


@routes.add("GET", "/repos/{owner}/{repo}/git/ref/{ref:path}")
def get_ref(ctx: Ctx) -> Response:
    repo, git = load_git(ctx)
    ref, sha = _path_ref(ctx, git)
    if sha is None:
        raise not_found()
    return Response.json(200, _ref_json(ctx, repo, ref, sha))


@routes.add("GET", "/repos/{owner}/{repo}/git/matching-refs/{ref:path}")
def matching_refs(ctx: Ctx) -> Response:
    repo, git = load_git(ctx)
    prefix = "refs/" + ctx.p("ref")
    refs = sorted((r, s) for r, s in git.list_refs("refs/").items() if r.startswith(prefix))
    return paginate(ctx, refs, lambda item: _ref_json(ctx, repo, item[0], item[1]))


@routes.add("GET", "/repos/{owner}/{repo}/git/refs")
def list_refs(ctx: Ctx) -> Response:
    repo, git = load_git(ctx)
    refs = sorted(git.list_refs("refs/").items())
    return paginate(ctx, refs, lambda item: _ref_json(ctx, repo, item[0], item[1]))


@routes.add("GET", "/repos/{owner}/{repo}/git/refs/{ref:path}")
def get_ref_legacy(ctx: Ctx) -> Response:
    """The older spelling of "get a reference"; an exact match answers one ref, a prefix a list."""
    repo, git = load_git(ctx)
    ref = "refs/" + ctx.p("ref")
    refs = git.list_refs("refs/")
    if ref in refs:
        return Response.json(200, _ref_json(ctx, repo, ref, refs[ref]))
    matching = sorted((r, s) for r, s in refs.items() if r.startswith(ref + "/"))
    if not matching:
        raise not_found()
    return Response.json(200, [_ref_json(ctx, repo, r, s) for r, s in matching])


@routes.add("POST", "/repos/{owner}/{repo}/git/refs")
def create_ref(ctx: Ctx) -> Response:
    repo, git = load_git(ctx, "write")
    data = ctx.request.json_object()
    ref, sha = _required(data, "Reference", "ref", str), _required(data, "Reference", "sha", str)
    if not valid_ref(ref):
        raise ApiError(422, "Reference name must start with 'refs/' and have at least two slashes.")
    _object(git, sha, None)
    _set_ref(ctx, repo, git, ref, sha, None, "Reference already exists")
    return Response.json(201, _ref_json(ctx, repo, ref, sha))


@routes.add("PATCH", "/repos/{owner}/{repo}/git/refs/{ref:path}")
def update_ref(ctx: Ctx) -> Response:
    repo, git, ref, old = _ref_to_write(ctx)
    data = ctx.request.json_object()
    sha, force = _required(data, "Reference", "sha", str), data.get("force", False)
    if old is None:
        raise ApiError(422, "Reference does not exist")
    _object(git, sha, None)
    if force is not True and not git.is_ancestor(old, sha):
        raise ApiError(422, "Update is not a fast forward")
    if old != sha:
        _set_ref(ctx, repo, git, ref, sha, old, "Update is not a fast forward")
    return Response.json(200, _ref_json(ctx, repo, ref, sha))


@routes.add("DELETE", "/repos/{owner}/{repo}/git/refs/{ref:path}")
def delete_ref(ctx: Ctx) -> Response:
    repo, git, ref, old = _ref_to_write(ctx)
    if old is None or not git.delete_ref(ref, old):
        raise ApiError(422, "Reference does not exist")
    events.refs_changed(ctx, repo, [(ref, old, None)], ctx.require_viewer())
    return Response.empty()


def _statuses(ctx: Ctx, repo: sqlite3.Row) -> tuple[str, list[sqlite3.Row]]:
    """The commit the path's ``ref`` resolves to (422 when none) and its statuses, newest first."""
    rev = ctx.p("ref")
    sha = ctx.git(repo).resolve_commit(rev)
    if sha is None:
        raise ApiError(422, f"No commit found for SHA: {rev}")
    rows = ctx.db.execute(
        "SELECT * FROM statuses WHERE repo_id = ? AND sha = ? ORDER BY id DESC", (repo["id"], sha)
    ).fetchall()
    return sha, rows


@routes.add("GET", "/repos/{owner}/{repo}/commits")
def list_commits(ctx: Ctx) -> Response:
    repo, git = load_git(ctx)
    start = ctx.request.arg("sha") or repo["default_branch"]
    head = git.resolve_commit(start)
    if head is None:
        if not git.list_refs("refs/heads/"):
            raise ApiError(409, EMPTY)
        raise not_found()
    shas = git.rev_list(head, limit=1000)
    return paginate(ctx, shas, lambda s: shapes_git.commit(ctx, repo, git.commit_info(s), with_files=False))


@routes.add("GET", "/repos/{owner}/{repo}/commits/{ref:path}/statuses")
@routes.add("GET", "/repos/{owner}/{repo}/statuses/{ref:path}")
def list_statuses(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    _, rows = _statuses(ctx, repo)
    return paginate(ctx, rows, lambda r: shapes_git.status(ctx, repo, r))


@routes.add("GET", "/repos/{owner}/{repo}/commits/{ref:path}/status")
def combined_status(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    sha, rows = _statuses(ctx, repo)
    return Response.json(200, shapes_git.combined_status(ctx, repo, sha, rows))


@routes.add("GET", "/repos/{owner}/{repo}/commits/{ref:path}")
def get_commit(ctx: Ctx) -> Response:
    repo, git = load_git(ctx)
    sha = git.resolve_commit(ctx.p("ref"))
    if sha is None:
        raise ApiError(422, f"No commit found for SHA: {ctx.p('ref')}")
    return Response.json(200, shapes_git.commit(ctx, repo, git.commit_info(sha)))


@routes.add("POST", "/repos/{owner}/{repo}/statuses/{sha}")
def create_status(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "write")
    data = ctx.request.json_object()
    sha = ctx.p("sha")
    if not SHA.match(sha) or ctx.git(repo).object_type(sha) != "commit":
        raise ApiError(422, f"No commit found for SHA: {sha}")
    state = data.get("state")
    if state not in ("error", "failure", "pending", "success"):
        raise invalid_field("Status", "state")
    context = data.get("context") or "default"
    for name in ("target_url", "description"):
        if data.get(name) is not None and not isinstance(data[name], str):
            raise invalid_field("Status", name)
    cur = ctx.db.execute(
        "INSERT INTO statuses (repo_id, sha, state, target_url, description, context, creator_id, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            repo["id"],
            sha,
            state,
            data.get("target_url"),
            data.get("description"),
            str(context),
            ctx.require_viewer()["id"],
            now_iso(),
        ),
    )
    row = ctx.db.execute("SELECT * FROM statuses WHERE id = ?", (cur.lastrowid,)).fetchone()
    return Response.json(201, shapes_git.status(ctx, repo, row))
