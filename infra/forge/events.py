"""What follows a change: webhook events, and pull requests kept in step with their head branches.

:func:`refs_changed` is the single place ref moves are reconciled, whether they came from a git push or from
the REST API: it emits ``push`` for branches and tags and, for an open pull request whose head branch moved,
records the new head SHA, moves ``refs/pull/N/head`` and emits ``pull_request`` ``synchronize``.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from . import payloads, webhooks
from . import shapes_core as core
from .names import now_iso
from .view import View

RefChange = tuple[str, str | None, str | None]
MERGED_BY_PUSH = (
    "SELECT pulls.* FROM pulls JOIN issues ON issues.id = pulls.issue_id "
    "WHERE issues.repo_id = ? AND issues.state = 'open' AND pulls.base_ref = ?"
)


def emit(v: View, repo_row: sqlite3.Row, event: str, body: dict[str, Any], sender: sqlite3.Row) -> None:
    anonymous = View(v.db, v.base_url, v.repos_root, None)
    payload = dict(body)
    payload.setdefault("repository", core.repo(anonymous, repo_row))
    payload["sender"] = core.user(anonymous, sender)
    owner = v.user_row(repo_row["owner_id"])
    if owner["type"] == "Organization":
        payload["organization"] = core.organization(anonymous, owner)
    webhooks.enqueue(v.db, repo_row["id"], event, payload)


MAX_TAG_EVENTS_PER_PUSH = 3


def refs_changed(v: View, repo_row: sqlite3.Row, changes: list[RefChange], sender: sqlite3.Row) -> None:
    if not changes:
        return
    now = now_iso()
    v.db.execute("UPDATE repos SET pushed_at = ?, updated_at = ? WHERE id = ?", (now, now, repo_row["id"]))
    repo_row = v.repo_row(repo_row["id"])
    anonymous = View(v.db, v.base_url, v.repos_root, None)
    git = v.git(repo_row)
    # GitHub: "Events will not be created for tags when more than three tags are pushed at once."
    tags_evented = sum(ref.startswith("refs/tags/") for ref, _, _ in changes) <= MAX_TAG_EVENTS_PER_PUSH
    for ref, before, after in changes:
        if ref.startswith("refs/heads/") or (ref.startswith("refs/tags/") and tags_evented):
            emit(v, repo_row, "push", payloads.push_body(anonymous, repo_row, ref, before, after, sender), sender)
        if not ref.startswith("refs/heads/") or after is None:
            continue
        branch = ref.removeprefix("refs/heads/")
        _close_pulls_merged_by_push(v, anonymous, repo_row, branch, before, after, sender)
        open_pulls = v.db.execute(
            "SELECT pulls.* FROM pulls JOIN issues ON issues.id = pulls.issue_id "
            "WHERE issues.repo_id = ? AND issues.state = 'open' AND pulls.head_ref = ? AND pulls.head_sha != ?",
            (repo_row["id"], branch, after),
        ).fetchall()
        for pull_row in open_pulls:
            v.db.execute("UPDATE pulls SET head_sha = ? WHERE id = ?", (after, pull_row["id"]))
            v.db.execute("UPDATE issues SET updated_at = ? WHERE id = ?", (now, pull_row["issue_id"]))
            issue_row = v.db.execute("SELECT * FROM issues WHERE id = ?", (pull_row["issue_id"],)).fetchone()
            pull_head = f"refs/pull/{issue_row['number']}/head"
            git.update_ref(pull_head, after, git.read_ref(pull_head))
            synced = v.db.execute("SELECT * FROM pulls WHERE id = ?", (pull_row["id"],)).fetchone()
            body = payloads.pull_body(
                anonymous, "synchronize", issue_row, synced, before=pull_row["head_sha"], after=after
            )
            emit(v, repo_row, "pull_request", body, sender)


def _close_pulls_merged_by_push(
    v: View, anonymous: View, repo_row: sqlite3.Row, base: str, before: str | None, after: str, sender: sqlite3.Row
) -> None:
    """Like GitHub: an open pull request whose head became part of its base by a push counts as merged."""
    git = v.git(repo_row)
    for pull_row in v.db.execute(MERGED_BY_PUSH, (repo_row["id"], base)).fetchall():
        head = pull_row["head_sha"]
        if not git.is_ancestor(head, after):
            continue
        now = now_iso()
        v.db.execute(
            "UPDATE pulls SET merged_at = ?, merged_by = ?, merge_commit_sha = ?, base_sha = ? WHERE id = ?",
            (now, sender["id"], after, before or after, pull_row["id"]),
        )
        v.db.execute(
            "UPDATE issues SET state = 'closed', closed_at = ?, closed_by = ?, updated_at = ? WHERE id = ?",
            (now, sender["id"], now, pull_row["issue_id"]),
        )
        issue_row = v.db.execute("SELECT * FROM issues WHERE id = ?", (pull_row["issue_id"],)).fetchone()
        merged = v.db.execute("SELECT * FROM pulls WHERE id = ?", (pull_row["id"],)).fetchone()
        emit(v, repo_row, "pull_request", payloads.pull_body(anonymous, "closed", issue_row, merged), sender)
