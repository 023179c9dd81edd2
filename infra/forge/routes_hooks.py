"""Repository webhooks and their recorded deliveries (admin role required, as on GitHub).

A new hook gets a ``ping`` delivery. Deliveries are listed newest first; redelivery (``POST
.../deliveries/{id}/attempts``) answers 202 and queues a copy with the same GUID and ``redelivery: true``.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.parse
from typing import Any

from . import payloads, webhooks
from . import shapes_core as core
from .names import now_iso
from .paging import paginate
from .router import Ctx, RouteTable
from .routes_repos import load_repo
from .view import View
from .wire import Response, invalid_field

routes = RouteTable()


def hook_json(ctx: Ctx, row: sqlite3.Row) -> dict[str, Any]:
    api = f"{ctx.repo_api(ctx.repo_row(row['repo_id']))}/hooks/{row['id']}"
    config: dict[str, Any] = {
        "content_type": row["content_type"],
        "insecure_ssl": row["insecure_ssl"],
        "url": row["url"],
    }
    if row["secret"]:
        config["secret"] = "********"
    return {
        "type": "Repository",
        "id": row["id"],
        "name": "web",
        "active": bool(row["active"]),
        "events": json.loads(row["events"]),
        "config": config,
        "updated_at": row["updated_at"],
        "created_at": row["created_at"],
        "url": api,
        "test_url": f"{api}/test",
        "ping_url": f"{api}/pings",
        "deliveries_url": f"{api}/deliveries",
        "last_response": {
            "code": row["last_code"],
            "status": row["last_status"] or "unused",
            "message": row["last_message"],
        },
    }


def _hook(ctx: Ctx, repo: sqlite3.Row) -> sqlite3.Row:
    return ctx.existing("SELECT * FROM hooks WHERE id = ? AND repo_id = ?", (ctx.id_param("hook_id"), repo["id"]))


def _config(data: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    config = data.get("config", {})
    if not isinstance(config, dict):
        raise invalid_field("Hook", "config")
    merged = {**current, **{k: v for k, v in config.items() if v is not None}}
    url = merged.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise invalid_field("Hook", "url", "custom" if url else "missing_field")
    if merged.get("content_type", "form") not in ("json", "form"):
        raise invalid_field("Hook", "content_type")
    return merged


def _events(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(e, str) for e in value):
        raise invalid_field("Hook", "events")
    return value


def _ping(ctx: Ctx, repo: sqlite3.Row, hook: sqlite3.Row) -> None:
    anonymous = View(ctx.db, ctx.base_url, ctx.repos_root, None)
    body = payloads.ping_body(hook_json(ctx, hook))
    body["repository"] = core.repo(anonymous, repo)
    body["sender"] = core.user(anonymous, ctx.require_viewer())
    webhooks.insert_delivery(ctx.db, hook, "ping", body)


@routes.add("POST", "/repos/{owner}/{repo}/hooks")
def create_hook(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "admin")
    data = ctx.request.json_object()
    if data.get("name", "web") != "web":
        raise invalid_field("Hook", "name")
    config = _config(data, {})
    events = _events(data.get("events", ["push"]))
    now = now_iso()
    cur = ctx.db.execute(
        "INSERT INTO hooks (repo_id, url, content_type, secret, insecure_ssl, events, active, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            repo["id"],
            config["url"],
            config.get("content_type", "form"),
            config.get("secret"),
            str(config.get("insecure_ssl", "0")),
            json.dumps(events),
            int(data.get("active", True) is not False),
            now,
            now,
        ),
    )
    hook = ctx.db.execute("SELECT * FROM hooks WHERE id = ?", (cur.lastrowid,)).fetchone()
    _ping(ctx, repo, hook)
    return Response.json(201, hook_json(ctx, hook))


@routes.add("GET", "/repos/{owner}/{repo}/hooks")
def list_hooks(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "admin")
    rows = ctx.db.execute("SELECT * FROM hooks WHERE repo_id = ? ORDER BY id", (repo["id"],)).fetchall()
    return paginate(ctx, rows, lambda r: hook_json(ctx, r))


@routes.add("GET", "/repos/{owner}/{repo}/hooks/{hook_id}")
def get_hook(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "admin")
    return Response.json(200, hook_json(ctx, _hook(ctx, repo)))


@routes.add("PATCH", "/repos/{owner}/{repo}/hooks/{hook_id}")
def edit_hook(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "admin")
    hook = _hook(ctx, repo)
    data = ctx.request.json_object()
    current = {
        "url": hook["url"],
        "content_type": hook["content_type"],
        "secret": hook["secret"],
        "insecure_ssl": hook["insecure_ssl"],
    }
    config = _config(data, current) if "config" in data else current
    events = json.loads(hook["events"])
    if "events" in data:
        events = _events(data["events"])
    events += [e for e in _events(data.get("add_events", [])) if e not in events]
    events = [e for e in events if e not in _events(data.get("remove_events", []))]
    active = hook["active"] if "active" not in data else int(bool(data["active"]))
    ctx.db.execute(
        "UPDATE hooks SET url = ?, content_type = ?, secret = ?, insecure_ssl = ?, events = ?, active = ?,"
        " updated_at = ? WHERE id = ?",
        (
            config["url"],
            config.get("content_type", "form"),
            config.get("secret"),
            str(config.get("insecure_ssl", "0")),
            json.dumps(events),
            active,
            now_iso(),
            hook["id"],
        ),
    )
    return Response.json(200, hook_json(ctx, _hook(ctx, repo)))


@routes.add("DELETE", "/repos/{owner}/{repo}/hooks/{hook_id}")
def delete_hook(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "admin")
    hook = _hook(ctx, repo)
    ctx.db.execute("DELETE FROM deliveries WHERE hook_id = ?", (hook["id"],))
    ctx.db.execute("DELETE FROM hooks WHERE id = ?", (hook["id"],))
    return Response.empty()


@routes.add("POST", "/repos/{owner}/{repo}/hooks/{hook_id}/pings")
def ping_hook(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "admin")
    _ping(ctx, repo, _hook(ctx, repo))
    return Response.empty()


def delivery_json(ctx: Ctx, row: sqlite3.Row, full: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": row["id"],
        "guid": row["guid"],
        "delivered_at": row["delivered_at"],
        "redelivery": bool(row["redelivery"]),
        "duration": row["duration"] or 0,
        "status": row["status"] or "pending",
        "status_code": row["status_code"] or 0,
        "event": row["event"],
        "action": row["action"],
        "installation_id": None,
        "repository_id": row["repo_id"],
        "throttled_at": None,
    }
    if full:
        headers = json.loads(row["request_headers"])
        body = row["request_body"]
        raw = body if headers["Content-Type"] == "application/json" else urllib.parse.parse_qs(body)["payload"][0]
        hook = ctx.db.execute("SELECT url FROM hooks WHERE id = ?", (row["hook_id"],)).fetchone()
        out["url"] = hook["url"]
        out["request"] = {"headers": headers, "payload": json.loads(raw)}
        out["response"] = {"headers": json.loads(row["response_headers"] or "{}"), "payload": row["response_body"]}
    return out


def _delivery(ctx: Ctx, hook: sqlite3.Row) -> sqlite3.Row:
    return ctx.existing(
        "SELECT * FROM deliveries WHERE id = ? AND hook_id = ?", (ctx.id_param("delivery_id"), hook["id"])
    )


@routes.add("GET", "/repos/{owner}/{repo}/hooks/{hook_id}/deliveries")
def list_deliveries(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "admin")
    hook = _hook(ctx, repo)
    rows = ctx.db.execute("SELECT * FROM deliveries WHERE hook_id = ? ORDER BY id DESC", (hook["id"],)).fetchall()
    return paginate(ctx, rows, lambda r: delivery_json(ctx, r, full=False))


@routes.add("GET", "/repos/{owner}/{repo}/hooks/{hook_id}/deliveries/{delivery_id}")
def get_delivery(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "admin")
    return Response.json(200, delivery_json(ctx, _delivery(ctx, _hook(ctx, repo)), full=True))


@routes.add("POST", "/repos/{owner}/{repo}/hooks/{hook_id}/deliveries/{delivery_id}/attempts")
def redeliver(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "admin")
    hook = _hook(ctx, repo)
    original = _delivery(ctx, hook)
    full = delivery_json(ctx, original, full=True)
    webhooks.insert_delivery(
        ctx.db, hook, original["event"], full["request"]["payload"], guid=original["guid"], redelivery=True
    )
    return Response.json(202, {})
