"""GitHub's JSON shapes (REST 2022-11-28) for users, repositories, labels, issues and comments."""

from __future__ import annotations

import sqlite3
from typing import Any

from .auth import LEGACY_PERMISSION, ROLES, repo_role, role_at_least
from .view import View, ids


def user(v: View, row: sqlite3.Row) -> dict[str, Any]:
    login = row["login"]
    api = f"{v.api}/users/{login}"
    return {
        "login": login,
        **ids("User" if row["type"] == "User" else "Organization", row["id"]),
        "avatar_url": f"{v.base_url}/avatars/u/{row['id']}",
        "gravatar_id": "",
        "url": api,
        "html_url": f"{v.base_url}/{login}",
        "followers_url": f"{api}/followers",
        "following_url": f"{api}/following{{/other_user}}",
        "gists_url": f"{api}/gists{{/gist_id}}",
        "starred_url": f"{api}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{api}/subscriptions",
        "organizations_url": f"{api}/orgs",
        "repos_url": f"{api}/repos",
        "events_url": f"{api}/events{{/privacy}}",
        "received_events_url": f"{api}/received_events",
        "type": row["type"],
        "user_view_type": "public",
        "site_admin": False,
    }


def user_by_id(v: View, user_id: int | None) -> dict[str, Any] | None:
    return None if user_id is None else user(v, v.user_row(user_id))


def private_user(v: View, row: sqlite3.Row) -> dict[str, Any]:
    counts = v.db.execute(
        "SELECT COUNT(*) AS total, SUM(private) AS private FROM repos WHERE owner_id = ?", (row["id"],)
    ).fetchone()
    private_repos = counts["private"] or 0
    return {
        **user(v, row),
        "name": row["login"],
        "company": None,
        "blog": "",
        "location": None,
        "email": row["email"],
        "hireable": None,
        "bio": None,
        "twitter_username": None,
        "public_repos": counts["total"] - private_repos,
        "public_gists": 0,
        "followers": 0,
        "following": 0,
        "created_at": row["created_at"],
        "updated_at": row["created_at"],
        "private_gists": 0,
        "total_private_repos": private_repos,
        "owned_private_repos": private_repos,
        "disk_usage": 0,
        "collaborators": 0,
        "two_factor_authentication": False,
        "plan": {"name": "enterprise", "space": 976562499, "collaborators": 0, "private_repos": 9999},
    }


def organization(v: View, row: sqlite3.Row) -> dict[str, Any]:
    api = f"{v.api}/orgs/{row['login']}"
    return {
        "login": row["login"],
        **ids("Organization", row["id"]),
        "url": api,
        "repos_url": f"{api}/repos",
        "events_url": f"{api}/events",
        "hooks_url": f"{api}/hooks",
        "issues_url": f"{api}/issues",
        "members_url": f"{api}/members{{/member}}",
        "public_members_url": f"{api}/public_members{{/member}}",
        "avatar_url": f"{v.base_url}/avatars/u/{row['id']}",
        "description": None,
    }


def permissions(role: str | None) -> dict[str, bool]:
    return {
        "admin": role_at_least(role, "admin"),
        "maintain": role_at_least(role, "maintain"),
        "push": role_at_least(role, "write"),
        "triage": role_at_least(role, "triage"),
        "pull": role_at_least(role, "read"),
    }


def repo(v: View, row: sqlite3.Row) -> dict[str, Any]:
    owner = v.user_row(row["owner_id"])
    full_name = f"{owner['login']}/{row['name']}"
    api = f"{v.api}/repos/{full_name}"
    html = f"{v.base_url}/{full_name}"
    host = v.base_url.split("://", 1)[1].split(":")[0]
    open_issues = v.db.execute(
        "SELECT COUNT(*) FROM issues WHERE repo_id = ? AND state = 'open'", (row["id"],)
    ).fetchone()[0]
    out: dict[str, Any] = {
        **ids("Repository", row["id"]),
        "name": row["name"],
        "full_name": full_name,
        "private": bool(row["private"]),
        "owner": user(v, owner),
        "html_url": html,
        "description": row["description"],
        "fork": False,
        "url": api,
        "archive_url": f"{api}/{{archive_format}}{{/ref}}",
        "assignees_url": f"{api}/assignees{{/user}}",
        "blobs_url": f"{api}/git/blobs{{/sha}}",
        "branches_url": f"{api}/branches{{/branch}}",
        "collaborators_url": f"{api}/collaborators{{/collaborator}}",
        "comments_url": f"{api}/comments{{/number}}",
        "commits_url": f"{api}/commits{{/sha}}",
        "compare_url": f"{api}/compare/{{base}}...{{head}}",
        "contents_url": f"{api}/contents/{{+path}}",
        "contributors_url": f"{api}/contributors",
        "deployments_url": f"{api}/deployments",
        "downloads_url": f"{api}/downloads",
        "events_url": f"{api}/events",
        "forks_url": f"{api}/forks",
        "git_commits_url": f"{api}/git/commits{{/sha}}",
        "git_refs_url": f"{api}/git/refs{{/sha}}",
        "git_tags_url": f"{api}/git/tags{{/sha}}",
        "git_url": f"git://{host}/{full_name}.git",
        "issue_comment_url": f"{api}/issues/comments{{/number}}",
        "issue_events_url": f"{api}/issues/events{{/number}}",
        "issues_url": f"{api}/issues{{/number}}",
        "keys_url": f"{api}/keys{{/key_id}}",
        "labels_url": f"{api}/labels{{/name}}",
        "languages_url": f"{api}/languages",
        "merges_url": f"{api}/merges",
        "milestones_url": f"{api}/milestones{{/number}}",
        "notifications_url": f"{api}/notifications{{?since,all,participating}}",
        "pulls_url": f"{api}/pulls{{/number}}",
        "releases_url": f"{api}/releases{{/id}}",
        "ssh_url": f"git@{host}:{full_name}.git",
        "stargazers_url": f"{api}/stargazers",
        "statuses_url": f"{api}/statuses/{{sha}}",
        "subscribers_url": f"{api}/subscribers",
        "subscription_url": f"{api}/subscription",
        "tags_url": f"{api}/tags",
        "teams_url": f"{api}/teams",
        "trees_url": f"{api}/git/trees{{/sha}}",
        "clone_url": f"{html}.git",
        "mirror_url": None,
        "hooks_url": f"{api}/hooks",
        "svn_url": html,
        "homepage": None,
        "language": None,
        "forks_count": 0,
        "stargazers_count": 0,
        "watchers_count": 0,
        "size": 0,
        "default_branch": row["default_branch"],
        "open_issues_count": open_issues,
        "is_template": False,
        "topics": [],
        "has_issues": True,
        "has_projects": False,
        "has_wiki": False,
        "has_pages": False,
        "has_downloads": True,
        "has_discussions": False,
        "archived": False,
        "disabled": False,
        "visibility": "private" if row["private"] else "public",
        "pushed_at": row["pushed_at"] or row["created_at"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "allow_forking": True,
        "web_commit_signoff_required": False,
        "license": None,
        "forks": 0,
        "open_issues": open_issues,
        "watchers": 0,
    }
    if v.viewer is not None:
        out["permissions"] = permissions(repo_role(v.db, row, v.viewer))
    return out


def full_repo(v: View, row: sqlite3.Row) -> dict[str, Any]:
    out = repo(v, row)
    out.update(
        {
            "subscribers_count": 0,
            "network_count": 0,
            "allow_squash_merge": bool(row["allow_squash_merge"]),
            "allow_merge_commit": bool(row["allow_merge_commit"]),
            "allow_rebase_merge": bool(row["allow_rebase_merge"]),
            "allow_auto_merge": False,
            "delete_branch_on_merge": False,
            "allow_update_branch": False,
            "squash_merge_commit_title": "COMMIT_OR_PR_TITLE",
            "squash_merge_commit_message": "COMMIT_MESSAGES",
            "merge_commit_title": "MERGE_MESSAGE",
            "merge_commit_message": "PR_TITLE",
        }
    )
    owner = v.user_row(row["owner_id"])
    if owner["type"] == "Organization":
        out["organization"] = user(v, owner)
    return out


def collaborator(v: View, row: sqlite3.Row, role: str) -> dict[str, Any]:
    return {**user(v, row), "permissions": permissions(role), "role_name": role}


def collaborator_permission(v: View, row: sqlite3.Row, role: str | None) -> dict[str, Any]:
    return {
        "permission": LEGACY_PERMISSION.get(role or "", "none"),
        "role_name": role or "none",
        "user": collaborator(v, row, role) if role in ROLES else {**user(v, row), "role_name": "none"},
    }


def label(v: View, repo_row: sqlite3.Row, row: sqlite3.Row) -> dict[str, Any]:
    return {
        **ids("Label", row["id"]),
        "url": f"{v.repo_api(repo_row)}/labels/{row['name']}",
        "name": row["name"],
        "color": row["color"],
        "default": False,
        "description": row["description"],
        "archived_at": None,
        "archived_by": None,
    }


def issue_labels(v: View, repo_row: sqlite3.Row, issue_id: int) -> list[dict[str, Any]]:
    rows = v.db.execute(
        "SELECT labels.* FROM issue_labels JOIN labels ON labels.id = issue_labels.label_id "
        "WHERE issue_labels.issue_id = ? ORDER BY labels.name",
        (issue_id,),
    ).fetchall()
    return [label(v, repo_row, r) for r in rows]


def author_association(v: View, repo_row: sqlite3.Row, user_id: int) -> str:
    if user_id == repo_row["owner_id"]:
        return "OWNER"
    if repo_role(v.db, repo_row, v.user_row(user_id)) in ("write", "maintain", "admin"):
        return "COLLABORATOR"
    return "NONE"


def reactions(url: str) -> dict[str, Any]:
    return {
        "url": f"{url}/reactions",
        "total_count": 0,
        "+1": 0,
        "-1": 0,
        "laugh": 0,
        "hooray": 0,
        "confused": 0,
        "heart": 0,
        "rocket": 0,
        "eyes": 0,
    }


def issue(v: View, row: sqlite3.Row) -> dict[str, Any]:
    repo_row = v.repo_row(row["repo_id"])
    api = f"{v.repo_api(repo_row)}/issues/{row['number']}"
    comments = v.db.execute("SELECT COUNT(*) FROM comments WHERE issue_id = ?", (row["id"],)).fetchone()[0]
    out: dict[str, Any] = {
        "url": api,
        "repository_url": v.repo_api(repo_row),
        "labels_url": f"{api}/labels{{/name}}",
        "comments_url": f"{api}/comments",
        "events_url": f"{api}/events",
        "html_url": f"{v.repo_html(repo_row)}/{'pull' if row['is_pull'] else 'issues'}/{row['number']}",
        **ids("Issue", row["id"]),
        "number": row["number"],
        "title": row["title"],
        "user": user(v, v.user_row(row["user_id"])),
        "labels": issue_labels(v, repo_row, row["id"]),
        "state": row["state"],
        "locked": False,
        "assignee": None,
        "assignees": [],
        "milestone": None,
        "comments": comments,
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "closed_at": row["closed_at"],
        "author_association": author_association(v, repo_row, row["user_id"]),
        "active_lock_reason": None,
        "body": row["body"],
        "closed_by": user_by_id(v, row["closed_by"]),
        "reactions": reactions(api),
        "timeline_url": f"{api}/timeline",
        "performed_via_github_app": None,
        "state_reason": row["state_reason"],
    }
    if row["is_pull"]:
        pull = v.db.execute("SELECT merged_at, draft FROM pulls WHERE issue_id = ?", (row["id"],)).fetchone()
        pulls_api = f"{v.repo_api(repo_row)}/pulls/{row['number']}"
        out["draft"] = bool(pull["draft"])
        out["pull_request"] = {
            "url": pulls_api,
            "html_url": out["html_url"],
            "diff_url": out["html_url"] + ".diff",
            "patch_url": out["html_url"] + ".patch",
            "merged_at": pull["merged_at"],
        }
    return out


def comment(v: View, row: sqlite3.Row) -> dict[str, Any]:
    issue_row = v.db.execute("SELECT * FROM issues WHERE id = ?", (row["issue_id"],)).fetchone()
    repo_row = v.repo_row(issue_row["repo_id"])
    api = f"{v.repo_api(repo_row)}/issues/comments/{row['id']}"
    kind = "pull" if issue_row["is_pull"] else "issues"
    return {
        **ids("IssueComment", row["id"]),
        "url": api,
        "html_url": f"{v.repo_html(repo_row)}/{kind}/{issue_row['number']}#issuecomment-{row['id']}",
        "body": row["body"],
        "user": user(v, v.user_row(row["user_id"])),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "issue_url": f"{v.repo_api(repo_row)}/issues/{issue_row['number']}",
        "author_association": author_association(v, repo_row, row["user_id"]),
        "performed_via_github_app": None,
        "reactions": reactions(api),
    }
