"""Webhook payload bodies, shaped like GitHub's; :func:`infra.forge.events.emit` adds ``repository``,
``sender`` and (for organisation repositories) ``organization``."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any

from . import shapes_core as core
from . import shapes_pulls
from .gitrepo import ZERO_SHA
from .view import View

ZEN = "Design for failure."


def _epoch(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())


def issue_body(v: View, action: str, issue_row: sqlite3.Row, **extra: Any) -> dict[str, Any]:
    return {"action": action, "issue": core.issue(v, issue_row), **extra}


def comment_body(
    v: View, action: str, issue_row: sqlite3.Row, comment_row: sqlite3.Row, **extra: Any
) -> dict[str, Any]:
    return {"action": action, "issue": core.issue(v, issue_row), "comment": core.comment(v, comment_row), **extra}


def pull_body(v: View, action: str, issue_row: sqlite3.Row, pull_row: sqlite3.Row, **extra: Any) -> dict[str, Any]:
    return {
        "action": action,
        "number": issue_row["number"],
        "pull_request": shapes_pulls.pull(v, issue_row, pull_row),
        **extra,
    }


def review_body(v: View, action: str, review_row: sqlite3.Row) -> dict[str, Any]:
    pull_row = v.db.execute("SELECT * FROM pulls WHERE id = ?", (review_row["pull_id"],)).fetchone()
    issue_row = v.db.execute("SELECT * FROM issues WHERE id = ?", (pull_row["issue_id"],)).fetchone()
    review = shapes_pulls.review(v, review_row)
    # Webhook reviews spell states in lower case, unlike the REST API.
    review["state"] = review["state"].lower()
    pull = shapes_pulls.pull(v, issue_row, pull_row, full=False)
    return {"action": action, "review": review, "pull_request": pull}


def ping_body(hook: dict[str, Any]) -> dict[str, Any]:
    return {"zen": ZEN, "hook_id": hook["id"], "hook": hook}


def push_repository(v: View, repo_row: sqlite3.Row) -> dict[str, Any]:
    """Push payloads carry the repository with epoch timestamps and an owner that has name and email."""
    repo = core.repo(v, repo_row)
    owner = v.user_row(repo_row["owner_id"])
    repo["owner"] = {**repo["owner"], "name": owner["login"], "email": owner["email"]}
    repo["created_at"] = _epoch(repo["created_at"])
    repo["pushed_at"] = _epoch(repo["pushed_at"])
    repo["stargazers"] = 0
    repo["master_branch"] = repo_row["default_branch"]
    return repo


def _push_commit(v: View, repo_row: sqlite3.Row, sha: str) -> dict[str, Any]:
    git = v.git(repo_row)
    info = git.commit_info(sha)
    files = git.changes(info.parents[0] if info.parents else None, sha)

    def person(name: str, email: str) -> dict[str, Any]:
        account = v.db.execute("SELECT login FROM users WHERE email = ? COLLATE NOCASE", (email,)).fetchone()
        out: dict[str, Any] = {"name": name, "email": email}
        if account is not None:
            out["username"] = account["login"]
        return out

    return {
        "id": sha,
        "tree_id": info.tree,
        "distinct": True,
        "message": info.message.rstrip("\n"),
        "timestamp": info.committer.date,
        "url": f"{v.repo_html(repo_row)}/commit/{sha}",
        "author": person(info.author.name, info.author.email),
        "committer": person(info.committer.name, info.committer.email),
        "added": [f.filename for f in files if f.status == "added"],
        "removed": [f.filename for f in files if f.status == "removed"],
        "modified": [f.filename for f in files if f.status == "modified"],
    }


def push_body(
    v: View, repo_row: sqlite3.Row, ref: str, before: str | None, after: str | None, pusher: sqlite3.Row
) -> dict[str, Any]:
    git = v.git(repo_row)
    old = before or ZERO_SHA
    new = after or ZERO_SHA
    shas = list(reversed(git.rev_list(new, before, limit=20))) if after else []
    commits = [_push_commit(v, repo_row, sha) for sha in shas]
    forced = bool(before and after and not git.is_ancestor(before, after))
    return {
        "ref": ref,
        "before": old,
        "after": new,
        "repository": push_repository(v, repo_row),
        "pusher": {"name": pusher["login"], "email": pusher["email"]},
        "created": before is None,
        "deleted": after is None,
        "forced": forced,
        "base_ref": None,
        "compare": f"{v.repo_html(repo_row)}/compare/{old[:12]}...{new[:12]}",
        "commits": commits,
        "head_commit": _push_commit(v, repo_row, after) if after else None,
    }
