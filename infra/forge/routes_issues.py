"""Issues, labels and issue comments.

Creating an issue or a comment is not idempotent on GitHub and is not here: every POST makes a new one, so a
client that lost an answer must look for its own object (for example by a marker in the body) before
retrying. Pull requests are issues too: they share the number sequence and appear in issue lists, and label
changes on a pull request emit ``pull_request`` events instead of ``issues`` events.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from . import events, payloads
from . import shapes_core as core
from .auth import no_access, require_role, role_at_least
from .listing import ListQuery
from .names import now_iso
from .paging import paginate
from .router import Ctx, RouteTable
from .routes_repos import load_repo
from .view import ids
from .wire import ApiError, Response, invalid_field, not_found, validation_failed

routes = RouteTable()
DEFAULT_LABEL_COLOR = "ededed"


def next_number(ctx: Ctx, repo: sqlite3.Row) -> int:
    number = int(ctx.db.execute("SELECT next_number FROM repos WHERE id = ?", (repo["id"],)).fetchone()[0])
    ctx.db.execute("UPDATE repos SET next_number = ? WHERE id = ?", (number + 1, repo["id"]))
    return number


def load_issue(ctx: Ctx, repo: sqlite3.Row) -> sqlite3.Row:
    return ctx.existing("SELECT * FROM issues WHERE repo_id = ? AND number = ?", (repo["id"], ctx.id_param("number")))


def issue_row(ctx: Ctx, issue_id: int) -> sqlite3.Row:
    row: sqlite3.Row = ctx.db.execute("SELECT * FROM issues WHERE id = ?", (issue_id,)).fetchone()
    return row


def label_row(ctx: Ctx, repo: sqlite3.Row, name: str, create: bool) -> sqlite3.Row | None:
    row: sqlite3.Row | None = ctx.db.execute(
        "SELECT * FROM labels WHERE repo_id = ? AND name = ?", (repo["id"], name)
    ).fetchone()
    if row is None and create:
        ctx.db.execute(
            "INSERT INTO labels (repo_id, name, color) VALUES (?, ?, ?)", (repo["id"], name, DEFAULT_LABEL_COLOR)
        )
        row = ctx.db.execute("SELECT * FROM labels WHERE repo_id = ? AND name = ?", (repo["id"], name)).fetchone()
    return row


def _label_names(value: Any) -> list[str]:
    if isinstance(value, dict):
        value = value.get("labels")
    if not isinstance(value, list):
        raise invalid_field("Label", "labels")
    names = []
    for item in value:
        name = item.get("name") if isinstance(item, dict) else item
        if not isinstance(name, str) or not name.strip():
            raise invalid_field("Label", "name")
        names.append(name.strip())
    return names


def emit_issue_event(ctx: Ctx, repo: sqlite3.Row, row: sqlite3.Row, action: str, **extra: Any) -> None:
    sender = ctx.require_viewer()
    if row["is_pull"]:
        pull = ctx.db.execute("SELECT * FROM pulls WHERE issue_id = ?", (row["id"],)).fetchone()
        events.emit(ctx, repo, "pull_request", payloads.pull_body(ctx, action, row, pull, **extra), sender)
    else:
        events.emit(ctx, repo, "issues", payloads.issue_body(ctx, action, row, **extra), sender)


def set_labels(ctx: Ctx, repo: sqlite3.Row, row: sqlite3.Row, names: list[str], replace: bool) -> None:
    """Attach ``names`` (creating unknown labels), dropping the others when ``replace``; one event per change."""
    current = {
        r["label_id"] for r in ctx.db.execute("SELECT label_id FROM issue_labels WHERE issue_id = ?", (row["id"],))
    }
    wanted = [label_row(ctx, repo, n, create=True) for n in names]
    wanted_ids = {w["id"] for w in wanted if w is not None}
    now = now_iso()
    for label in wanted:
        assert label is not None
        if label["id"] not in current:
            current.add(label["id"])
            ctx.db.execute("INSERT INTO issue_labels (issue_id, label_id) VALUES (?, ?)", (row["id"], label["id"]))
            ctx.db.execute("UPDATE issues SET updated_at = ? WHERE id = ?", (now, row["id"]))
            record_event(ctx, row, "labeled", label, now)
            emit_issue_event(ctx, repo, issue_row(ctx, row["id"]), "labeled", label=core.label(ctx, repo, label))
    if replace:
        for label_id in sorted(current - wanted_ids):
            remove_label(ctx, repo, row, ctx.db.execute("SELECT * FROM labels WHERE id = ?", (label_id,)).fetchone())


def remove_label(ctx: Ctx, repo: sqlite3.Row, row: sqlite3.Row, label: sqlite3.Row) -> None:
    ctx.db.execute("DELETE FROM issue_labels WHERE issue_id = ? AND label_id = ?", (row["id"], label["id"]))
    now = now_iso()
    ctx.db.execute("UPDATE issues SET updated_at = ? WHERE id = ?", (now, row["id"]))
    record_event(ctx, row, "unlabeled", label, now)
    emit_issue_event(ctx, repo, issue_row(ctx, row["id"]), "unlabeled", label=core.label(ctx, repo, label))


def record_event(ctx: Ctx, row: sqlite3.Row, event: str, label: sqlite3.Row, at: str) -> None:
    """An issue event (``labeled``/``unlabeled``) by the viewer, as ``GET .../issues/{number}/events`` lists it."""
    ctx.db.execute(
        "INSERT INTO issue_events (issue_id, actor_id, event, label_id, created_at) VALUES (?, ?, ?, ?, ?)",
        (row["id"], ctx.require_viewer()["id"], event, label["id"], at),
    )


@routes.add("GET", "/repos/{owner}/{repo}/issues/{number}/events")
def list_issue_events(ctx: Ctx) -> Response:
    """The issue's label events, oldest first, shaped like GitHub's; 404 while the forge keeps no issue events
    (``Forge.issue_events``, the emulator's default)."""
    repo = load_repo(ctx)
    row = load_issue(ctx, repo)
    if not ctx.forge.issue_events:
        raise not_found()
    rows = ctx.db.execute("SELECT * FROM issue_events WHERE issue_id = ? ORDER BY id", (row["id"],)).fetchall()

    def render(ev: sqlite3.Row) -> dict[str, Any]:
        label = ctx.db.execute("SELECT * FROM labels WHERE id = ?", (ev["label_id"],)).fetchone()
        return {
            **ids("LabeledEvent" if ev["event"] == "labeled" else "UnlabeledEvent", ev["id"]),
            "url": f"{ctx.repo_api(repo)}/issues/events/{ev['id']}",
            "actor": core.user(ctx, ctx.user_row(ev["actor_id"])),
            "event": ev["event"],
            "commit_id": None,
            "commit_url": None,
            "created_at": ev["created_at"],
            "label": {"name": label["name"], "color": label["color"]},
            "performed_via_github_app": None,
        }

    return paginate(ctx, rows, render)


def _check_text(data: dict[str, Any], name: str, required: bool = False) -> None:
    value = data.get(name)
    if value is None and required:
        raise invalid_field("Issue", name, "missing_field")
    if value is not None and not isinstance(value, str):
        raise invalid_field("Issue", name)


@routes.add("POST", "/repos/{owner}/{repo}/issues")
def create_issue(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    viewer = ctx.require_viewer()
    data = ctx.request.json_object()
    _check_text(data, "title", required=True)
    _check_text(data, "body")
    if not data["title"].strip():
        raise invalid_field("Issue", "title", "missing_field")
    labels = _label_names(data["labels"]) if "labels" in data else []
    now = now_iso()
    cur = ctx.db.execute(
        "INSERT INTO issues (repo_id, number, title, body, state, user_id, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, 'open', ?, ?, ?)",
        (repo["id"], next_number(ctx, repo), data["title"], data.get("body"), viewer["id"], now, now),
    )
    issue_id = int(cur.lastrowid or 0)
    # Labels set at creation are part of the "opened" event; GitHub sends no "labeled" for them.
    if labels and role_at_least(require_role(ctx.db, repo, viewer, "read"), "triage"):
        for name in labels:
            label = label_row(ctx, repo, name, create=True)
            assert label is not None
            ctx.db.execute(
                "INSERT OR IGNORE INTO issue_labels (issue_id, label_id) VALUES (?, ?)", (issue_id, label["id"])
            )
    row = issue_row(ctx, issue_id)
    events.emit(ctx, repo, "issues", payloads.issue_body(ctx, "opened", row), viewer)
    return Response.json(201, core.issue(ctx, row))


@routes.add("GET", "/repos/{owner}/{repo}/issues")
def list_issues(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    req = ctx.request
    query = ListQuery(req, "Issue", "SELECT * FROM issues WHERE repo_id = ?", repo["id"], state_column="state")
    creator = req.arg("creator")
    if creator:
        user = ctx.user_by_login(creator)
        query.where("user_id = ?", user["id"] if user is not None else -1)
    since = req.arg("since")
    if since:
        query.where("updated_at >= ?", since)
    for name in filter(None, (req.arg("labels") or "").split(",")):
        query.where(
            "id IN (SELECT issue_id FROM issue_labels JOIN labels ON labels.id = issue_labels.label_id"
            " WHERE labels.name = ?)",
            name.strip(),
        )
    rows = query.rows(ctx.db, {"created": "created_at", "updated": "updated_at", "comments": "created_at"}, "id")
    return paginate(ctx, rows, lambda r: core.issue(ctx, r))


@routes.add("GET", "/repos/{owner}/{repo}/issues/{number}")
def get_issue(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    return Response.json(200, core.issue(ctx, load_issue(ctx, repo)))


def close_or_reopen(ctx: Ctx, repo: sqlite3.Row, row: sqlite3.Row, state: str, reason: Any) -> sqlite3.Row:
    """Move an issue (or pull request) to ``state`` and emit closed/reopened; a no-op if already there."""
    if state == row["state"]:
        return row
    now = now_iso()
    if state == "closed":
        if reason is not None and reason not in ("completed", "not_planned"):
            raise invalid_field("Issue", "state_reason")
        ctx.db.execute(
            "UPDATE issues SET state = 'closed', state_reason = ?, closed_at = ?, closed_by = ?, updated_at = ?"
            " WHERE id = ?",
            (None if row["is_pull"] else (reason or "completed"), now, ctx.require_viewer()["id"], now, row["id"]),
        )
    else:
        ctx.db.execute(
            "UPDATE issues SET state = 'open', state_reason = ?, closed_at = NULL, closed_by = NULL, updated_at = ?"
            " WHERE id = ?",
            (None if row["is_pull"] else "reopened", now, row["id"]),
        )
    row = issue_row(ctx, row["id"])
    emit_issue_event(ctx, repo, row, "closed" if state == "closed" else "reopened")
    return row


@routes.add("PATCH", "/repos/{owner}/{repo}/issues/{number}")
def edit_issue(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    viewer = ctx.require_viewer()
    row = load_issue(ctx, repo)
    role = require_role(ctx.db, repo, viewer, "read")
    if row["user_id"] != viewer["id"] and not role_at_least(role, "triage"):
        raise no_access(viewer)
    data = ctx.request.json_object()
    _check_text(data, "title")
    _check_text(data, "body")
    changes: dict[str, Any] = {}
    for name in ("title", "body"):
        if name in data and data[name] != row[name]:
            if name == "title" and not (data["title"] or "").strip():
                raise invalid_field("Issue", "title", "missing_field")
            changes[name] = {"from": row[name]}
            ctx.db.execute(
                f"UPDATE issues SET {name} = ?, updated_at = ? WHERE id = ?", (data[name], now_iso(), row["id"])
            )
    if changes:
        emit_issue_event(ctx, repo, issue_row(ctx, row["id"]), "edited", changes=changes)
    if "labels" in data:
        set_labels(ctx, repo, issue_row(ctx, row["id"]), _label_names(data["labels"]), replace=True)
    state = data.get("state")
    if state is not None:
        if state not in ("open", "closed"):
            raise invalid_field("Issue", "state")
        if state == "open" and row["is_pull"] and _pull_merged(ctx, row):
            raise validation_failed(
                {
                    "resource": "PullRequest",
                    "code": "custom",
                    "field": "state",
                    "message": "state cannot be changed. The pull request has been merged.",
                }
            )
        close_or_reopen(ctx, repo, issue_row(ctx, row["id"]), state, data.get("state_reason"))
    return Response.json(200, core.issue(ctx, issue_row(ctx, row["id"])))


def _pull_merged(ctx: Ctx, row: sqlite3.Row) -> bool:
    pull = ctx.db.execute("SELECT merged_at FROM pulls WHERE issue_id = ?", (row["id"],)).fetchone()
    return pull is not None and pull["merged_at"] is not None


@routes.add("GET", "/repos/{owner}/{repo}/labels")
def list_labels(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    rows = ctx.db.execute("SELECT * FROM labels WHERE repo_id = ? ORDER BY name", (repo["id"],)).fetchall()
    return paginate(ctx, rows, lambda r: core.label(ctx, repo, r))


@routes.add("POST", "/repos/{owner}/{repo}/labels")
def create_label(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "write")
    data = ctx.request.json_object()
    name, color = data.get("name"), data.get("color", DEFAULT_LABEL_COLOR)
    if not isinstance(name, str) or not name.strip():
        raise invalid_field("Label", "name", "missing_field")
    if not isinstance(color, str) or len(color.lstrip("#")) != 6:
        raise invalid_field("Label", "color")
    if label_row(ctx, repo, name, create=False) is not None:
        raise ApiError(
            422, "Validation Failed", errors=[{"resource": "Label", "code": "already_exists", "field": "name"}]
        )
    ctx.db.execute(
        "INSERT INTO labels (repo_id, name, color, description) VALUES (?, ?, ?, ?)",
        (repo["id"], name.strip(), color.lstrip("#"), data.get("description")),
    )
    label = label_row(ctx, repo, name.strip(), create=False)
    assert label is not None
    return Response.json(201, core.label(ctx, repo, label))


@routes.add("GET", "/repos/{owner}/{repo}/labels/{name}")
def get_label(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    label = label_row(ctx, repo, ctx.p("name"), create=False)
    if label is None:
        raise not_found()
    return Response.json(200, core.label(ctx, repo, label))


def _labels_answer(ctx: Ctx, repo: sqlite3.Row, row: sqlite3.Row) -> Response:
    return Response.json(200, core.issue_labels(ctx, repo, row["id"]))


@routes.add("GET", "/repos/{owner}/{repo}/issues/{number}/labels")
def list_issue_labels(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    return _labels_answer(ctx, repo, load_issue(ctx, repo))


def _set_requested_labels(ctx: Ctx, replace: bool) -> Response:
    repo = load_repo(ctx, "triage")
    row = load_issue(ctx, repo)
    set_labels(ctx, repo, row, _label_names(ctx.request.json()), replace=replace)
    return _labels_answer(ctx, repo, row)


@routes.add("POST", "/repos/{owner}/{repo}/issues/{number}/labels")
def add_labels(ctx: Ctx) -> Response:
    return _set_requested_labels(ctx, replace=False)


@routes.add("PUT", "/repos/{owner}/{repo}/issues/{number}/labels")
def replace_labels(ctx: Ctx) -> Response:
    return _set_requested_labels(ctx, replace=True)


@routes.add("DELETE", "/repos/{owner}/{repo}/issues/{number}/labels")
def clear_labels(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "triage")
    row = load_issue(ctx, repo)
    set_labels(ctx, repo, row, [], replace=True)
    return Response.empty()


@routes.add("DELETE", "/repos/{owner}/{repo}/issues/{number}/labels/{name}")
def delete_label_from_issue(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "triage")
    row = load_issue(ctx, repo)
    label = label_row(ctx, repo, ctx.p("name"), create=False)
    attached = (
        label is not None
        and ctx.db.execute(
            "SELECT 1 FROM issue_labels WHERE issue_id = ? AND label_id = ?", (row["id"], label["id"])
        ).fetchone()
    )
    if label is None or not attached:
        raise ApiError(404, "Label does not exist")
    remove_label(ctx, repo, row, label)
    return _labels_answer(ctx, repo, row)


def _comment(ctx: Ctx, repo: sqlite3.Row) -> sqlite3.Row:
    return ctx.existing(
        "SELECT comments.* FROM comments JOIN issues ON issues.id = comments.issue_id "
        "WHERE comments.id = ? AND issues.repo_id = ?",
        (ctx.id_param("comment_id"), repo["id"]),
    )


@routes.add("POST", "/repos/{owner}/{repo}/issues/{number}/comments")
def create_comment(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    viewer = ctx.require_viewer()
    row = load_issue(ctx, repo)
    body = ctx.request.json_object().get("body")
    if not isinstance(body, str) or not body:
        raise invalid_field("IssueComment", "body", "missing_field")
    now = now_iso()
    cur = ctx.db.execute(
        "INSERT INTO comments (issue_id, user_id, body, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
        (row["id"], viewer["id"], body, now, now),
    )
    ctx.db.execute("UPDATE issues SET updated_at = ? WHERE id = ?", (now, row["id"]))
    comment = ctx.db.execute("SELECT * FROM comments WHERE id = ?", (cur.lastrowid,)).fetchone()
    body_json = payloads.comment_body(ctx, "created", issue_row(ctx, row["id"]), comment)
    events.emit(ctx, repo, "issue_comment", body_json, viewer)
    return Response.json(201, core.comment(ctx, comment))


@routes.add("GET", "/repos/{owner}/{repo}/issues/{number}/comments")
def list_comments(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    row = load_issue(ctx, repo)
    sql, args = "SELECT * FROM comments WHERE issue_id = ?", [row["id"]]
    since = ctx.request.arg("since")
    if since:
        sql += " AND updated_at >= ?"
        args.append(since)
    rows = ctx.db.execute(sql + " ORDER BY id", args).fetchall()
    return paginate(ctx, rows, lambda r: core.comment(ctx, r))


@routes.add("GET", "/repos/{owner}/{repo}/issues/comments/{comment_id}")
def get_comment(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    return Response.json(200, core.comment(ctx, _comment(ctx, repo)))


def _may_modify_comment(ctx: Ctx, repo: sqlite3.Row, comment: sqlite3.Row) -> None:
    viewer = ctx.require_viewer()
    role = require_role(ctx.db, repo, viewer, "read")
    if comment["user_id"] != viewer["id"] and not role_at_least(role, "write"):
        raise no_access(viewer)


@routes.add("PATCH", "/repos/{owner}/{repo}/issues/comments/{comment_id}")
def edit_comment(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    comment = _comment(ctx, repo)
    _may_modify_comment(ctx, repo, comment)
    body = ctx.request.json_object().get("body")
    if not isinstance(body, str) or not body:
        raise invalid_field("IssueComment", "body", "missing_field")
    if body != comment["body"]:
        ctx.db.execute("UPDATE comments SET body = ?, updated_at = ? WHERE id = ?", (body, now_iso(), comment["id"]))
        updated = ctx.db.execute("SELECT * FROM comments WHERE id = ?", (comment["id"],)).fetchone()
        payload = payloads.comment_body(
            ctx, "edited", issue_row(ctx, comment["issue_id"]), updated, changes={"body": {"from": comment["body"]}}
        )
        events.emit(ctx, repo, "issue_comment", payload, ctx.require_viewer())
    final = ctx.db.execute("SELECT * FROM comments WHERE id = ?", (comment["id"],)).fetchone()
    return Response.json(200, core.comment(ctx, final))


@routes.add("DELETE", "/repos/{owner}/{repo}/issues/comments/{comment_id}")
def delete_comment(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    comment = _comment(ctx, repo)
    _may_modify_comment(ctx, repo, comment)
    payload = payloads.comment_body(ctx, "deleted", issue_row(ctx, comment["issue_id"]), comment)
    ctx.db.execute("DELETE FROM comments WHERE id = ?", (comment["id"],))
    events.emit(ctx, repo, "issue_comment", payload, ctx.require_viewer())
    return Response.empty()
