"""Pull request reviews, their line comments, and review requests.

A review is tied to the head SHA it was made on (``commit_id``, by default the head at submission) and stays
on the pull request after later pushes, so whoever checks an approval must compare its ``commit_id`` with
the head they are about to merge. Authors cannot approve or request changes on their own pull requests.
"""

from __future__ import annotations

import sqlite3

from . import events, payloads, shapes_pulls
from . import shapes_core as core
from .auth import repo_role, role_at_least
from .names import now_iso
from .paging import paginate
from .router import Ctx, RouteTable
from .routes_pulls import emit_pull, load_pull, reload
from .routes_repos import load_repo
from .wire import ApiError, Response, invalid_field, validation_failed

routes = RouteTable()
EVENT_STATES = {"APPROVE": "APPROVED", "REQUEST_CHANGES": "CHANGES_REQUESTED", "COMMENT": "COMMENTED"}


def _review(ctx: Ctx, pull: sqlite3.Row) -> sqlite3.Row:
    return ctx.existing("SELECT * FROM reviews WHERE id = ? AND pull_id = ?", (ctx.id_param("review_id"), pull["id"]))


def _visible(ctx: Ctx, sql: str) -> list[sqlite3.Row]:
    """The rows ``sql`` selects of the path's pull request as the viewer may see them: ``sql``'s two parameters are
    the pull request's ID and the viewer's (-1 for an anonymous one), whose pending reviews are theirs alone."""
    _, pull = load_pull(ctx, load_repo(ctx))
    viewer_id = ctx.viewer["id"] if ctx.viewer is not None else -1
    rows: list[sqlite3.Row] = ctx.db.execute(sql, (pull["id"], viewer_id)).fetchall()
    return rows


def _submit(
    ctx: Ctx, repo: sqlite3.Row, issue: sqlite3.Row, pull: sqlite3.Row, review_id: int, event: object, body: str
) -> None:
    viewer = ctx.require_viewer()
    state = EVENT_STATES.get(event) if isinstance(event, str) else None
    if state is None:
        raise invalid_field("PullRequestReview", "event")
    if issue["user_id"] == viewer["id"] and state != "COMMENTED":
        verb = "approve" if state == "APPROVED" else "request changes on"
        raise ApiError(422, "Unprocessable Entity", errors=[f"Can not {verb} your own pull request"])
    if state != "APPROVED" and not body:
        raise invalid_field("PullRequestReview", "body", "missing_field")
    ctx.db.execute(
        "UPDATE reviews SET state = ?, body = ?, submitted_at = ? WHERE id = ?", (state, body, now_iso(), review_id)
    )
    ctx.db.execute("DELETE FROM review_requests WHERE pull_id = ? AND user_id = ?", (pull["id"], viewer["id"]))
    row = ctx.db.execute("SELECT * FROM reviews WHERE id = ?", (review_id,)).fetchone()
    events.emit(ctx, repo, "pull_request_review", payloads.review_body(ctx, "submitted", row), viewer)


@routes.add("POST", "/repos/{owner}/{repo}/pulls/{number}/reviews")
def create_review(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    viewer = ctx.require_viewer()
    issue, pull = load_pull(ctx, repo)
    data = ctx.request.json_object()
    body = data.get("body") or ""
    if not isinstance(body, str):
        raise invalid_field("PullRequestReview", "body")
    commit_id = data.get("commit_id") or pull["head_sha"]
    if not isinstance(commit_id, str) or ctx.git(repo).object_type(commit_id) != "commit":
        raise validation_failed(
            {
                "resource": "PullRequestReview",
                "code": "custom",
                "field": "commit_id",
                "message": "Commit does not exist",
            }
        )
    comments = _line_comments(ctx, repo, pull, commit_id, data.get("comments"))
    pending = ctx.db.execute(
        "SELECT 1 FROM reviews WHERE pull_id = ? AND user_id = ? AND state = 'PENDING'", (pull["id"], viewer["id"])
    ).fetchone()
    if pending:
        raise ApiError(422, "Unprocessable Entity", errors=["User can only have one pending review per pull request"])
    cur = ctx.db.execute(
        "INSERT INTO reviews (pull_id, user_id, body, state, commit_id) VALUES (?, ?, ?, 'PENDING', ?)",
        (pull["id"], viewer["id"], body, commit_id),
    )
    review_id = int(cur.lastrowid or 0)
    for path, line, side, text in comments:
        ctx.db.execute(
            "INSERT INTO review_comments (review_id, pull_id, user_id, path, line, side, body, commit_id, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (review_id, pull["id"], viewer["id"], path, line, side, text, commit_id, now_iso()),
        )
    if data.get("event"):
        _submit(ctx, repo, issue, pull, review_id, data["event"], body)
    row = ctx.db.execute("SELECT * FROM reviews WHERE id = ?", (review_id,)).fetchone()
    return Response.json(200, shapes_pulls.review(ctx, row))


def _line_comments(
    ctx: Ctx, repo: sqlite3.Row, pull: sqlite3.Row, commit_id: str, raw: object
) -> list[tuple[str, int | None, str, str]]:
    """A review's ``comments`` as (path, line, side, body), checked as GitHub does: each names a file the pull
    request changes (else 422 "Path could not be resolved") and has a body; ``line`` (or the older
    ``position``) is a positive number, and a comment without either is on the file."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid_field("PullRequestReview", "comments")
    git = ctx.git(repo)
    start = git.merge_base(shapes_pulls.base_sha(ctx, repo, pull), commit_id)
    changed = {f.filename for f in git.changes(start, commit_id)}
    out: list[tuple[str, int | None, str, str]] = []
    for item in raw:
        if not isinstance(item, dict):
            raise invalid_field("PullRequestReview", "comments")
        path, body, side = item.get("path"), item.get("body"), item.get("side") or "RIGHT"
        line = item.get("line", item.get("position"))
        if not isinstance(path, str) or not isinstance(body, str) or not body:
            raise invalid_field("PullRequestReviewComment", "body" if isinstance(path, str) else "path")
        if line is not None and (not isinstance(line, int) or isinstance(line, bool) or line < 1):
            raise invalid_field("PullRequestReviewComment", "line")
        if side not in ("LEFT", "RIGHT"):
            raise invalid_field("PullRequestReviewComment", "side")
        if path not in changed:
            raise ApiError(422, "Unprocessable Entity", errors=["Path could not be resolved"])
        out.append((path, line, side, body))
    return out


@routes.add("POST", "/repos/{owner}/{repo}/pulls/{number}/reviews/{review_id}/events")
def submit_review(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    viewer = ctx.require_viewer()
    issue, pull = load_pull(ctx, repo)
    review = _review(ctx, pull)
    if review["user_id"] != viewer["id"] or review["state"] != "PENDING":
        raise ApiError(422, "Unprocessable Entity", errors=["Can not submit a review that is not pending"])
    data = ctx.request.json_object()
    body = data.get("body") or review["body"]
    _submit(ctx, repo, issue, pull, review["id"], data.get("event"), str(body))
    row = ctx.db.execute("SELECT * FROM reviews WHERE id = ?", (review["id"],)).fetchone()
    return Response.json(200, shapes_pulls.review(ctx, row))


@routes.add("GET", "/repos/{owner}/{repo}/pulls/{number}/reviews")
def list_reviews(ctx: Ctx) -> Response:
    rows = _visible(ctx, "SELECT * FROM reviews WHERE pull_id = ? AND (state != 'PENDING' OR user_id = ?) ORDER BY id")
    return paginate(ctx, rows, lambda r: shapes_pulls.review(ctx, r))


@routes.add("GET", "/repos/{owner}/{repo}/pulls/{number}/reviews/{review_id}")
def get_review(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    _, pull = load_pull(ctx, repo)
    return Response.json(200, shapes_pulls.review(ctx, _review(ctx, pull)))


@routes.add("GET", "/repos/{owner}/{repo}/pulls/{number}/reviews/{review_id}/comments")
def list_review_comments(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    _, pull = load_pull(ctx, repo)
    review = _review(ctx, pull)
    rows = ctx.db.execute("SELECT * FROM review_comments WHERE review_id = ? ORDER BY id", (review["id"],)).fetchall()
    return paginate(ctx, rows, lambda r: shapes_pulls.review_comment(ctx, r))


@routes.add("GET", "/repos/{owner}/{repo}/pulls/{number}/comments")
def list_pull_review_comments(ctx: Ctx) -> Response:
    """The PR's line comments of submitted reviews (and the viewer's own pending ones)."""
    rows = _visible(
        ctx,
        "SELECT c.* FROM review_comments c JOIN reviews r ON r.id = c.review_id"
        " WHERE c.pull_id = ? AND (r.state != 'PENDING' OR r.user_id = ?) ORDER BY c.id",
    )
    return paginate(ctx, rows, lambda r: shapes_pulls.review_comment(ctx, r))


@routes.add("PUT", "/repos/{owner}/{repo}/pulls/{number}/reviews/{review_id}/dismissals")
def dismiss_review(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "write")
    _, pull = load_pull(ctx, repo)
    review = _review(ctx, pull)
    message = ctx.request.json_object().get("message")
    if not isinstance(message, str) or not message:
        raise invalid_field("PullRequestReview", "message", "missing_field")
    if review["state"] not in ("APPROVED", "CHANGES_REQUESTED"):
        raise ApiError(
            422, "Unprocessable Entity", errors=[f"Can not dismiss a {review['state'].lower()} pull request review"]
        )
    ctx.db.execute("UPDATE reviews SET state = 'DISMISSED' WHERE id = ?", (review["id"],))
    row = ctx.db.execute("SELECT * FROM reviews WHERE id = ?", (review["id"],)).fetchone()
    events.emit(ctx, repo, "pull_request_review", payloads.review_body(ctx, "dismissed", row), ctx.require_viewer())
    return Response.json(200, shapes_pulls.review(ctx, row))


def _reviewer_logins(ctx: Ctx) -> list[str]:
    data = ctx.request.json_object()
    logins = data.get("reviewers", [])
    if not isinstance(logins, list) or not all(isinstance(x, str) for x in logins):
        raise invalid_field("PullRequest", "reviewers")
    if data.get("team_reviewers"):
        raise invalid_field("PullRequest", "team_reviewers")
    return logins


def _change_requests(
    ctx: Ctx, repo: sqlite3.Row, pull: sqlite3.Row, users: list[sqlite3.Row], sql: str, action: str, status: int
) -> Response:
    """Run ``sql`` (its parameters: the pull request's ID, a user's) for each of ``users``; every user whose request
    it changed is announced as ``action``. Answers ``status`` with the pull request as it is now."""
    for user in users:
        if ctx.db.execute(sql, (pull["id"], user["id"])).rowcount:
            emit_pull(ctx, repo, action, pull["id"], requested_reviewer=core.user(ctx, user))
    return Response.json(status, shapes_pulls.pull(ctx, *reload(ctx, pull["id"]), full=False))


@routes.add("POST", "/repos/{owner}/{repo}/pulls/{number}/requested_reviewers")
def request_reviewers(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "triage")
    issue, pull = load_pull(ctx, repo)
    users = []
    for login in _reviewer_logins(ctx):
        user = ctx.user_by_login(login)
        if user is not None and user["id"] == issue["user_id"]:
            raise ApiError(422, "Review cannot be requested from pull request author.")
        if user is None or not role_at_least(repo_role(ctx.db, repo, user), "write"):
            raise ApiError(
                422,
                "Reviews may only be requested from collaborators. One or more of the users or "
                f"teams you specified is not a collaborator of the {ctx.full_name(repo)} repository.",
            )
        users.append(user)
    insert = "INSERT OR IGNORE INTO review_requests (pull_id, user_id) VALUES (?, ?)"
    return _change_requests(ctx, repo, pull, users, insert, "review_requested", 201)


@routes.add("GET", "/repos/{owner}/{repo}/pulls/{number}/requested_reviewers")
def list_requested_reviewers(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    _, pull = load_pull(ctx, repo)
    users = [
        core.user(ctx, ctx.user_row(r["user_id"]))
        for r in ctx.db.execute("SELECT user_id FROM review_requests WHERE pull_id = ? ORDER BY user_id", (pull["id"],))
    ]
    return Response.json(200, {"users": users, "teams": []})


@routes.add("DELETE", "/repos/{owner}/{repo}/pulls/{number}/requested_reviewers")
def remove_requested_reviewers(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "triage")
    _, pull = load_pull(ctx, repo)
    users = [user for login in _reviewer_logins(ctx) if (user := ctx.user_by_login(login)) is not None]
    delete = "DELETE FROM review_requests WHERE pull_id = ? AND user_id = ?"
    return _change_requests(ctx, repo, pull, users, delete, "review_request_removed", 200)
