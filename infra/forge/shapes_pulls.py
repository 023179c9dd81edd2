"""GitHub's JSON shapes for pull requests and their reviews.

``mergeable`` comes from a real three-way merge of the current base tip and the head (``git merge-tree
--write-tree``). As on GitHub it is computed after the fact: a pull request answers ``mergeable: null``
(``mergeable_state: "unknown"``) until the merge was computed for its current base tip and head, which the
REST handlers start right after answering (:func:`compute_mergeability`). So the answer to a create, and the
first read after a push to the head or the base, say ``null``; the next read says ``true`` or ``false``.
Webhook payloads report what is known when they are written and never start the computation.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from . import shapes_core as core
from .view import View, ids


def base_sha(v: View, repo_row: sqlite3.Row, pull_row: sqlite3.Row) -> str:
    """The base branch's current tip, or the recorded one once the branch is gone."""
    current = v.git(repo_row).read_ref(f"refs/heads/{pull_row['base_ref']}")
    return current or str(pull_row["base_sha"])


def _branch(v: View, repo_row: sqlite3.Row, ref: str, sha: str) -> dict[str, Any]:
    owner = v.user_row(repo_row["owner_id"])
    return {
        "label": f"{owner['login']}:{ref}",
        "ref": ref,
        "sha": sha,
        "user": core.user(v, owner),
        "repo": core.repo(v, repo_row),
    }


def _merge_key(v: View, repo_row: sqlite3.Row, pull_row: sqlite3.Row) -> str:
    return f"{base_sha(v, repo_row, pull_row)}:{pull_row['head_sha']}"


def mergeability(v: View, repo_row: sqlite3.Row, issue_row: sqlite3.Row, pull_row: sqlite3.Row) -> bool | None:
    """``mergeable`` as GitHub reports it: None for a closed pull request, and for an open one whose current
    base tip and head have not been computed yet."""
    if issue_row["state"] != "open" or pull_row["mergeable_for"] != _merge_key(v, repo_row, pull_row):
        return None
    return bool(pull_row["mergeable"])


def compute_mergeability(v: View, issue_row: sqlite3.Row, pull_row: sqlite3.Row) -> None:
    """Compute and record whether an open pull request merges cleanly at its current base tip and head (GitHub's
    background job); nothing to do when that pair is already recorded or the pull request is closed."""
    repo_row = v.repo_row(issue_row["repo_id"])
    key = _merge_key(v, repo_row, pull_row)
    if issue_row["state"] != "open" or pull_row["mergeable_for"] == key:
        return
    clean, _ = v.git(repo_row).merge_tree(base_sha(v, repo_row, pull_row), pull_row["head_sha"])
    v.db.execute("UPDATE pulls SET mergeable_for = ?, mergeable = ? WHERE id = ?", (key, int(clean), pull_row["id"]))


def pull(v: View, issue_row: sqlite3.Row, pull_row: sqlite3.Row, full: bool = True) -> dict[str, Any]:
    repo_row = v.repo_row(issue_row["repo_id"])
    number = issue_row["number"]
    api = f"{v.repo_api(repo_row)}/pulls/{number}"
    issue_api = f"{v.repo_api(repo_row)}/issues/{number}"
    html = f"{v.repo_html(repo_row)}/pull/{number}"
    base = base_sha(v, repo_row, pull_row)
    reviewers = v.db.execute(
        "SELECT user_id FROM review_requests WHERE pull_id = ? ORDER BY user_id", (pull_row["id"],)
    ).fetchall()
    merged = pull_row["merged_at"] is not None
    out: dict[str, Any] = {
        "url": api,
        **ids("PullRequest", pull_row["id"]),
        "html_url": html,
        "diff_url": f"{html}.diff",
        "patch_url": f"{html}.patch",
        "issue_url": issue_api,
        "commits_url": f"{api}/commits",
        "review_comments_url": f"{api}/comments",
        "review_comment_url": f"{v.repo_api(repo_row)}/pulls/comments{{/number}}",
        "comments_url": f"{issue_api}/comments",
        "statuses_url": f"{v.repo_api(repo_row)}/statuses/{pull_row['head_sha']}",
        "number": number,
        "state": issue_row["state"],
        "locked": False,
        "title": issue_row["title"],
        "user": core.user(v, v.user_row(issue_row["user_id"])),
        "body": issue_row["body"],
        "labels": core.issue_labels(v, repo_row, issue_row["id"]),
        "milestone": None,
        "active_lock_reason": None,
        "created_at": issue_row["created_at"],
        "updated_at": issue_row["updated_at"],
        "closed_at": issue_row["closed_at"],
        "merged_at": pull_row["merged_at"],
        "merge_commit_sha": pull_row["merge_commit_sha"],
        "assignee": None,
        "assignees": [],
        "requested_reviewers": [core.user(v, v.user_row(r["user_id"])) for r in reviewers],
        "requested_teams": [],
        "head": _branch(v, repo_row, pull_row["head_ref"], pull_row["head_sha"]),
        "base": _branch(v, repo_row, pull_row["base_ref"], base),
        "_links": {
            "self": {"href": api},
            "html": {"href": html},
            "issue": {"href": issue_api},
            "comments": {"href": f"{issue_api}/comments"},
            "review_comments": {"href": f"{api}/comments"},
            "review_comment": {"href": f"{v.repo_api(repo_row)}/pulls/comments{{/number}}"},
            "commits": {"href": f"{api}/commits"},
            "statuses": {"href": f"{v.repo_api(repo_row)}/statuses/{pull_row['head_sha']}"},
        },
        "author_association": core.author_association(v, repo_row, issue_row["user_id"]),
        "auto_merge": None,
        "draft": bool(pull_row["draft"]),
    }
    if not full:
        return out
    git = v.git(repo_row)
    mergeable = mergeability(v, repo_row, issue_row, pull_row)
    if mergeable is None:
        state = "unknown"
    elif pull_row["draft"]:
        state = "draft"
    else:
        state = "clean" if mergeable else "dirty"
    fork_point = git.merge_base(base, pull_row["head_sha"])
    files = git.changes(fork_point, pull_row["head_sha"])
    out.update(
        {
            "merged": merged,
            "mergeable": mergeable,
            "rebaseable": None,
            "mergeable_state": state,
            "merged_by": core.user_by_id(v, pull_row["merged_by"]),
            "comments": v.db.execute("SELECT COUNT(*) FROM comments WHERE issue_id = ?", (issue_row["id"],)).fetchone()[
                0
            ],
            "review_comments": 0,
            "maintainer_can_modify": bool(pull_row["maintainer_can_modify"]),
            "commits": len(git.rev_list(pull_row["head_sha"], fork_point)),
            "additions": sum(f.additions for f in files),
            "deletions": sum(f.deletions for f in files),
            "changed_files": len(files),
        }
    )
    return out


def _issue_and_repo_of_pull(v: View, pull_id: int) -> tuple[sqlite3.Row, sqlite3.Row]:
    """The issue row a pull request is (its number, its state) and the repository row it is in."""
    pull_row = v.db.execute("SELECT * FROM pulls WHERE id = ?", (pull_id,)).fetchone()
    issue_row = v.db.execute("SELECT * FROM issues WHERE id = ?", (pull_row["issue_id"],)).fetchone()
    return issue_row, v.repo_row(issue_row["repo_id"])


def review(v: View, row: sqlite3.Row) -> dict[str, Any]:
    issue_row, repo_row = _issue_and_repo_of_pull(v, row["pull_id"])
    pull_api = f"{v.repo_api(repo_row)}/pulls/{issue_row['number']}"
    html = f"{v.repo_html(repo_row)}/pull/{issue_row['number']}#pullrequestreview-{row['id']}"
    out: dict[str, Any] = {
        **ids("PullRequestReview", row["id"]),
        "user": core.user(v, v.user_row(row["user_id"])),
        "body": row["body"],
        "state": row["state"],
        "html_url": html,
        "pull_request_url": pull_api,
        "author_association": core.author_association(v, repo_row, row["user_id"]),
        "_links": {"html": {"href": html}, "pull_request": {"href": pull_api}},
        "commit_id": row["commit_id"],
    }
    if row["submitted_at"] is not None:
        out["submitted_at"] = row["submitted_at"]
    return out


def review_comment(v: View, row: sqlite3.Row) -> dict[str, Any]:
    """A line comment of a review (GitHub's "pull request review comment")."""
    issue_row, repo_row = _issue_and_repo_of_pull(v, row["pull_id"])
    api = f"{v.repo_api(repo_row)}/pulls/comments/{row['id']}"
    html = f"{v.repo_html(repo_row)}/pull/{issue_row['number']}#discussion_r{row['id']}"
    pull_api = f"{v.repo_api(repo_row)}/pulls/{issue_row['number']}"
    return {
        **ids("PullRequestReviewComment", row["id"]),
        "url": api,
        "pull_request_review_id": row["review_id"],
        "diff_hunk": "",
        "path": row["path"],
        "position": row["line"],
        "original_position": row["line"],
        "commit_id": row["commit_id"],
        "original_commit_id": row["commit_id"],
        "user": core.user(v, v.user_row(row["user_id"])),
        "body": row["body"],
        "created_at": row["created_at"],
        "updated_at": row["created_at"],
        "html_url": html,
        "pull_request_url": pull_api,
        "author_association": core.author_association(v, repo_row, row["user_id"]),
        "_links": {"self": {"href": api}, "html": {"href": html}, "pull_request": {"href": pull_api}},
        "line": row["line"],
        "original_line": row["line"],
        "side": row["side"],
        "subject_type": "line" if row["line"] is not None else "file",
    }
