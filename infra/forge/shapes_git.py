"""GitHub's JSON shapes for git data (refs, commits, trees, blobs), branches and commit statuses."""

from __future__ import annotations

import base64
import hashlib
import sqlite3
from typing import Any

from . import shapes_core as core
from .gitrepo import CommitInfo, GitRepo, Identity
from .view import View, ids, node_id


def _git_node(kind: str, sha: str) -> str:
    return node_id(kind, int(sha[:12], 16))


def git_ref(v: View, repo_row: sqlite3.Row, ref: str, sha: str, kind: str) -> dict[str, Any]:
    api = v.repo_api(repo_row)
    return {
        "ref": ref,
        "node_id": node_id("Ref", int(hashlib.sha1(f"{repo_row['id']}:{ref}".encode()).hexdigest()[:12], 16)),
        "url": f"{api}/git/{ref}",
        "object": {"sha": sha, "type": kind, "url": f"{api}/git/{kind}s/{sha}"},
    }


def _identity(who: Identity) -> dict[str, Any]:
    return {"name": who.name, "email": who.email, "date": who.date}


def _unverified() -> dict[str, Any]:
    return {"verified": False, "reason": "unsigned", "signature": None, "payload": None, "verified_at": None}


def git_commit(v: View, repo_row: sqlite3.Row, info: CommitInfo) -> dict[str, Any]:
    api = v.repo_api(repo_row)
    return {
        "sha": info.sha,
        "node_id": _git_node("Commit", info.sha),
        "url": f"{api}/git/commits/{info.sha}",
        "html_url": f"{v.repo_html(repo_row)}/commit/{info.sha}",
        "author": _identity(info.author),
        "committer": _identity(info.committer),
        "message": info.message,
        "tree": {"sha": info.tree, "url": f"{api}/git/trees/{info.tree}"},
        "parents": [
            {"sha": p, "url": f"{api}/git/commits/{p}", "html_url": f"{v.repo_html(repo_row)}/commit/{p}"}
            for p in info.parents
        ],
        "verification": _unverified(),
    }


def _account(v: View, who: Identity) -> dict[str, Any] | None:
    row = v.db.execute("SELECT * FROM users WHERE email = ? COLLATE NOCASE", (who.email,)).fetchone()
    return core.user(v, row) if row is not None else None


def commit(v: View, repo_row: sqlite3.Row, info: CommitInfo, with_files: bool = True) -> dict[str, Any]:
    """The ``/repos/{o}/{r}/commits/{ref}`` shape: a git commit wrapped with accounts, stats and files."""
    api = v.repo_api(repo_row)
    html = f"{v.repo_html(repo_row)}/commit/{info.sha}"
    inner = git_commit(v, repo_row, info)
    inner.pop("sha")
    inner.pop("node_id")
    inner.pop("html_url")
    inner["tree"] = {"sha": info.tree, "url": f"{api}/git/trees/{info.tree}"}
    inner["comment_count"] = 0
    out: dict[str, Any] = {
        "url": f"{api}/commits/{info.sha}",
        "sha": info.sha,
        "node_id": _git_node("Commit", info.sha),
        "html_url": html,
        "comments_url": f"{api}/commits/{info.sha}/comments",
        "commit": inner,
        "author": _account(v, info.author),
        "committer": _account(v, info.committer),
        "parents": [
            {"sha": p, "url": f"{api}/commits/{p}", "html_url": f"{v.repo_html(repo_row)}/commit/{p}"}
            for p in info.parents
        ],
    }
    if with_files:
        git = v.git(repo_row)
        files = git.changes(info.parents[0] if info.parents else None, info.sha)
        out["stats"] = {
            "total": sum(f.additions + f.deletions for f in files),
            "additions": sum(f.additions for f in files),
            "deletions": sum(f.deletions for f in files),
        }
        out["files"] = [
            {
                "sha": _blob_sha(git, info.sha, f.filename) if f.status != "removed" else None,
                "filename": f.filename,
                "status": f.status,
                "additions": f.additions,
                "deletions": f.deletions,
                "changes": f.additions + f.deletions,
                "blob_url": f"{v.repo_html(repo_row)}/blob/{info.sha}/{f.filename}",
                "raw_url": f"{v.repo_html(repo_row)}/raw/{info.sha}/{f.filename}",
                "contents_url": f"{api}/contents/{f.filename}?ref={info.sha}",
            }
            for f in files
        ]
    return out


def _blob_sha(git: GitRepo, commit_sha: str, path: str) -> str:
    return git.run("rev-parse", f"{commit_sha}:{path}").decode().strip()


def blob(v: View, repo_row: sqlite3.Row, sha: str, data: bytes) -> dict[str, Any]:
    encoded = base64.b64encode(data).decode()
    return {
        "sha": sha,
        "node_id": _git_node("Blob", sha),
        "size": len(data),
        "url": f"{v.repo_api(repo_row)}/git/blobs/{sha}",
        "content": "\n".join(encoded[i : i + 60] for i in range(0, len(encoded), 60)) + "\n",
        "encoding": "base64",
    }


def tree(v: View, repo_row: sqlite3.Row, sha: str, recursive: bool) -> dict[str, Any]:
    api = v.repo_api(repo_row)
    entries = []
    for e in v.git(repo_row).ls_tree(sha, recursive):
        entry: dict[str, Any] = {"path": e.path, "mode": e.mode, "type": e.type, "sha": e.sha}
        if e.size is not None:
            entry["size"] = e.size
        entry["url"] = f"{api}/git/{e.type}s/{e.sha}"
        entries.append(entry)
    return {"sha": sha, "url": f"{api}/git/trees/{sha}", "tree": entries, "truncated": False}


def branch(v: View, repo_row: sqlite3.Row, name: str, sha: str, full: bool) -> dict[str, Any]:
    api = v.repo_api(repo_row)
    out: dict[str, Any] = {
        "name": name,
        "commit": {"sha": sha, "url": f"{api}/commits/{sha}"},
        "protected": False,
    }
    if full:
        out["commit"] = commit(v, repo_row, v.git(repo_row).commit_info(sha), with_files=False)
        out["_links"] = {"self": f"{api}/branches/{name}", "html": f"{v.repo_html(repo_row)}/tree/{name}"}
        out["protection"] = {
            "enabled": False,
            "required_status_checks": {"enforcement_level": "off", "contexts": [], "checks": []},
        }
        out["protection_url"] = f"{api}/branches/{name}/protection"
    return out


def status(v: View, repo_row: sqlite3.Row, row: sqlite3.Row) -> dict[str, Any]:
    creator = v.user_row(row["creator_id"])
    return {
        "url": f"{v.repo_api(repo_row)}/statuses/{row['sha']}",
        "avatar_url": f"{v.base_url}/avatars/u/{creator['id']}",
        **ids("StatusContext", row["id"]),
        "state": row["state"],
        "description": row["description"],
        "target_url": row["target_url"],
        "context": row["context"],
        "created_at": row["created_at"],
        "updated_at": row["created_at"],
        "creator": core.user(v, creator),
    }


def combined_status(v: View, repo_row: sqlite3.Row, sha: str, rows: list[sqlite3.Row]) -> dict[str, Any]:
    """Latest status per context; failure if any failed or errored, pending if any pending or none at all."""
    latest: dict[str, sqlite3.Row] = {}
    for row in rows:  # newest first
        latest.setdefault(row["context"], row)
    states = {r["state"] for r in latest.values()}
    if states & {"failure", "error"}:
        overall = "failure"
    elif "pending" in states or not states:
        overall = "pending"
    else:
        overall = "success"
    statuses = []
    for row in latest.values():
        item = status(v, repo_row, row)
        item.pop("creator")
        statuses.append(item)
    return {
        "state": overall,
        "statuses": statuses,
        "sha": sha,
        "total_count": len(statuses),
        "repository": core.repo(v, repo_row),
        "commit_url": f"{v.repo_api(repo_row)}/commits/{sha}",
        "url": f"{v.repo_api(repo_row)}/commits/{sha}/status",
    }
