"""Pull requests: create, list, read, edit, commits, files, and merge.

Contracts the pipeline relies on:

- At most one open pull request per (head, base): a second create answers 422 "A pull request already exists
  for OWNER:BRANCH.", so a create keyed by branch can be retried and then reconciled by listing with
  ``head=OWNER:BRANCH``.
- Merge is conditional on ``sha``: if it is not the current head the answer is 409 "Head branch was
  modified. Review and try the merge again." and nothing changes. A successful merge writes a real merge (or
  squash) commit with git plumbing and moves the base branch with a compare-and-swap, so a concurrent push
  to the base makes the merge fail instead of being overwritten.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from . import events, payloads, shapes_git, shapes_pulls
from .auth import no_access, require_role, role_at_least
from .gitrepo import GitRepo
from .listing import ListQuery
from .names import now_iso, valid_branch
from .paging import paginate
from .router import Ctx, RouteTable
from .routes_issues import close_or_reopen, issue_row, load_issue, next_number
from .routes_repos import load_repo
from .wire import ApiError, Response, invalid_field, not_found, validation_failed

routes = RouteTable()
# Each merge method, the repository setting that allows it, and GitHub's 405 when the setting is off.
MERGE_METHODS = {
    "merge": ("allow_merge_commit", "Merge commits are not allowed on this repository."),
    "squash": ("allow_squash_merge", "Squash merges are not allowed on this repository."),
    "rebase": ("allow_rebase_merge", "Rebase merges are not allowed on this repository."),
}


def load_pull(ctx: Ctx, repo: sqlite3.Row) -> tuple[sqlite3.Row, sqlite3.Row]:
    issue = load_issue(ctx, repo)
    return issue, ctx.existing("SELECT * FROM pulls WHERE issue_id = ?", (issue["id"],))


def reload(ctx: Ctx, pull_id: int) -> tuple[sqlite3.Row, sqlite3.Row]:
    pull = ctx.db.execute("SELECT * FROM pulls WHERE id = ?", (pull_id,)).fetchone()
    return issue_row(ctx, pull["issue_id"]), pull


def emit_pull(ctx: Ctx, repo: sqlite3.Row, action: str, pull_id: int, **extra: Any) -> None:
    issue, pull = reload(ctx, pull_id)
    events.emit(ctx, repo, "pull_request", payloads.pull_body(ctx, action, issue, pull, **extra), ctx.require_viewer())


def _head_branch(ctx: Ctx, repo: sqlite3.Row, head: str) -> str:
    owner = ctx.user_row(repo["owner_id"])["login"]
    if ":" in head:
        head_owner, _, branch = head.partition(":")
        if head_owner.lower() != owner.lower():
            raise invalid_field("PullRequest", "head")
        return branch
    return head


@routes.add("POST", "/repos/{owner}/{repo}/pulls")
def create_pull(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    viewer = ctx.require_viewer()
    git = ctx.git(repo)
    data = ctx.request.json_object()
    for name in ("title", "head", "base"):
        if not isinstance(data.get(name), str) or not data[name]:
            raise invalid_field("PullRequest", name, "missing_field")
    if data.get("body") is not None and not isinstance(data["body"], str):
        raise invalid_field("PullRequest", "body")
    draft = data.get("draft", False)
    if not isinstance(draft, bool):
        raise invalid_field("PullRequest", "draft")
    base, head = data["base"], _head_branch(ctx, repo, data["head"])
    base_sha = git.read_ref(f"refs/heads/{base}") if valid_branch(base) else None
    if base_sha is None:
        raise invalid_field("PullRequest", "base")
    head_sha = git.read_ref(f"refs/heads/{head}") if valid_branch(head) else None
    if head_sha is None:
        raise invalid_field("PullRequest", "head")
    owner = ctx.user_row(repo["owner_id"])["login"]
    existing = ctx.db.execute(
        "SELECT 1 FROM pulls JOIN issues ON issues.id = pulls.issue_id WHERE issues.repo_id = ? "
        "AND issues.state = 'open' AND pulls.head_ref = ? AND pulls.base_ref = ?",
        (repo["id"], head, base),
    ).fetchone()
    if existing:
        raise validation_failed(
            {
                "resource": "PullRequest",
                "code": "custom",
                "message": f"A pull request already exists for {owner}:{head}.",
            }
        )
    if not git.rev_list(head_sha, base_sha, limit=1):
        raise validation_failed(
            {"resource": "PullRequest", "code": "custom", "message": f"No commits between {base} and {head}"}
        )
    now = now_iso()
    number = next_number(ctx, repo)
    cur = ctx.db.execute(
        "INSERT INTO issues (repo_id, number, title, body, state, user_id, is_pull, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, 'open', ?, 1, ?, ?)",
        (repo["id"], number, data["title"], data.get("body"), viewer["id"], now, now),
    )
    pull_cur = ctx.db.execute(
        "INSERT INTO pulls (issue_id, head_ref, head_sha, base_ref, base_sha, draft, maintainer_can_modify)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (cur.lastrowid, head, head_sha, base, base_sha, int(draft), int(bool(data.get("maintainer_can_modify")))),
    )
    pull_id = int(pull_cur.lastrowid or 0)
    git.update_ref(f"refs/pull/{number}/head", head_sha, git.read_ref(f"refs/pull/{number}/head"))
    emit_pull(ctx, repo, "opened", pull_id)
    return Response.json(201, _answer_then_compute(ctx, pull_id))


def _answer_then_compute(ctx: Ctx, pull_id: int) -> dict[str, Any]:
    """The pull request as it reads now, after which its mergeability is computed, as GitHub starts that job when
    a pull request is read or changed: an answer given before the job says ``mergeable: null``."""
    issue, pull = reload(ctx, pull_id)
    answer = shapes_pulls.pull(ctx, issue, pull)
    shapes_pulls.compute_mergeability(ctx, issue, pull)
    return answer


@routes.add("GET", "/repos/{owner}/{repo}/pulls")
def list_pulls(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    req = ctx.request
    query = ListQuery(
        req,
        "PullRequest",
        "SELECT pulls.id FROM pulls JOIN issues ON issues.id = pulls.issue_id WHERE issues.repo_id = ?",
        repo["id"],
        state_column="issues.state",
    )
    head = req.arg("head")
    # GitHub filters by head only when it is spelled OWNER:BRANCH; a bare branch name is silently ignored.
    if head and ":" in head:
        head_owner, _, branch = head.partition(":")
        owner = ctx.user_row(repo["owner_id"])["login"]
        if head_owner.lower() != owner.lower():
            return Response.json(200, [])
        query.where("pulls.head_ref = ?", branch)
    base = req.arg("base")
    if base:
        query.where("pulls.base_ref = ?", base)
    ids = [
        r["id"]
        for r in query.rows(ctx.db, {"created": "issues.created_at", "updated": "issues.updated_at"}, "pulls.id")
    ]
    return paginate(ctx, ids, lambda pull_id: shapes_pulls.pull(ctx, *reload(ctx, pull_id), full=False))


@routes.add("GET", "/repos/{owner}/{repo}/pulls/{number}")
def get_pull(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    _, pull = load_pull(ctx, repo)
    return Response.json(200, _answer_then_compute(ctx, pull["id"]))


@routes.add("PATCH", "/repos/{owner}/{repo}/pulls/{number}")
def edit_pull(ctx: Ctx) -> Response:
    """Edit title, body, state or base; ``draft`` cannot change here (GitHub needs GraphQL for that)."""
    repo = load_repo(ctx)
    viewer = ctx.require_viewer()
    issue, pull = load_pull(ctx, repo)
    role = require_role(ctx.db, repo, viewer, "read")
    if issue["user_id"] != viewer["id"] and not role_at_least(role, "write"):
        raise no_access(viewer)
    data = ctx.request.json_object()
    changes: dict[str, Any] = {}
    for name in ("title", "body"):
        if name in data:
            if data[name] is not None and not isinstance(data[name], str):
                raise invalid_field("PullRequest", name)
            if data[name] != issue[name]:
                changes[name] = {"from": issue[name]}
                ctx.db.execute(
                    f"UPDATE issues SET {name} = ?, updated_at = ? WHERE id = ?", (data[name], now_iso(), issue["id"])
                )
    if "base" in data and data["base"] != pull["base_ref"]:
        base = data["base"]
        base_sha = (
            ctx.git(repo).read_ref(f"refs/heads/{base}") if isinstance(base, str) and valid_branch(base) else None
        )
        if base_sha is None:
            raise invalid_field("PullRequest", "base")
        changes["base"] = {"ref": {"from": pull["base_ref"]}, "sha": {"from": pull["base_sha"]}}
        ctx.db.execute("UPDATE pulls SET base_ref = ?, base_sha = ? WHERE id = ?", (base, base_sha, pull["id"]))
    if changes:
        emit_pull(ctx, repo, "edited", pull["id"], changes=changes)
    state = data.get("state")
    if state is not None:
        if state not in ("open", "closed"):
            raise invalid_field("PullRequest", "state")
        if pull["merged_at"] is not None and state == "open":
            raise validation_failed(
                {
                    "resource": "PullRequest",
                    "code": "custom",
                    "field": "state",
                    "message": "state cannot be changed. The pull request has been merged.",
                }
            )
        close_or_reopen(ctx, repo, issue_row(ctx, issue["id"]), state, None)
    return Response.json(200, _answer_then_compute(ctx, pull["id"]))


def _pull_span(ctx: Ctx) -> tuple[sqlite3.Row, sqlite3.Row, GitRepo, str | None]:
    """The pull request named by the path, its repository and git, and where its commits start: the merge base
    of its head with its base."""
    repo = load_repo(ctx)
    _, pull = load_pull(ctx, repo)
    git = ctx.git(repo)
    return repo, pull, git, git.merge_base(shapes_pulls.base_sha(ctx, repo, pull), pull["head_sha"])


@routes.add("GET", "/repos/{owner}/{repo}/pulls/{number}/commits")
def list_pull_commits(ctx: Ctx) -> Response:
    repo, pull, git, start = _pull_span(ctx)
    shas = list(reversed(git.rev_list(pull["head_sha"], start, limit=250)))
    return paginate(ctx, shas, lambda s: shapes_git.commit(ctx, repo, git.commit_info(s), with_files=False))


@routes.add("GET", "/repos/{owner}/{repo}/pulls/{number}/files")
def list_pull_files(ctx: Ctx) -> Response:
    repo, pull, git, start = _pull_span(ctx)
    files = git.changes(start, pull["head_sha"])
    return paginate(
        ctx,
        files,
        lambda f: {
            "sha": None
            if f.status == "removed"
            else git.run("rev-parse", f"{pull['head_sha']}:{f.filename}").decode().strip(),
            "filename": f.filename,
            "status": f.status,
            "additions": f.additions,
            "deletions": f.deletions,
            "changes": f.additions + f.deletions,
            "blob_url": f"{ctx.repo_html(repo)}/blob/{pull['head_sha']}/{f.filename}",
            "raw_url": f"{ctx.repo_html(repo)}/raw/{pull['head_sha']}/{f.filename}",
            "contents_url": f"{ctx.repo_api(repo)}/contents/{f.filename}?ref={pull['head_sha']}",
        },
    )


@routes.add("GET", "/repos/{owner}/{repo}/pulls/{number}/merge")
def check_merged(ctx: Ctx) -> Response:
    repo = load_repo(ctx)
    _, pull = load_pull(ctx, repo)
    if pull["merged_at"] is None:
        raise not_found()
    return Response.empty()


@routes.add("PUT", "/repos/{owner}/{repo}/pulls/{number}/merge")
def merge_pull(ctx: Ctx) -> Response:
    repo = load_repo(ctx, "write")
    viewer = ctx.require_viewer()
    issue, pull = load_pull(ctx, repo)
    data = ctx.request.json_object()
    method = data.get("merge_method", "merge")
    if method not in MERGE_METHODS:
        raise invalid_field("PullRequest", "merge_method")
    setting, refusal = MERGE_METHODS[method]
    if not repo[setting]:
        raise ApiError(405, refusal)
    if issue["state"] != "open":
        raise ApiError(405, "Pull Request is not mergeable")
    if pull["draft"]:
        raise ApiError(405, "Pull Request is still a draft")
    expected = data.get("sha")
    if expected is not None and expected != pull["head_sha"]:
        raise ApiError(409, "Head branch was modified. Review and try the merge again.")
    git = ctx.git(repo)
    base_ref = f"refs/heads/{pull['base_ref']}"
    base_sha = git.read_ref(base_ref)
    if base_sha is None:
        raise ApiError(405, "Pull Request is not mergeable")
    clean, tree = git.merge_tree(base_sha, pull["head_sha"])
    if not clean or tree is None:
        raise ApiError(405, "Pull Request is not mergeable")
    owner = ctx.user_row(repo["owner_id"])["login"]
    who = ctx.identity(viewer)
    if method == "merge":
        title = data.get("commit_title") or f"Merge pull request #{issue['number']} from {owner}/{pull['head_ref']}"
        message = data.get("commit_message") or issue["title"]
        parents = [base_sha, pull["head_sha"]]
    else:
        title = data.get("commit_title") or f"{issue['title']} (#{issue['number']})"
        message = data.get("commit_message") or "\n\n".join(
            "* " + git.commit_info(s).message.strip() for s in reversed(git.rev_list(pull["head_sha"], base_sha))
        )
        parents = [base_sha]
    sha = git.commit_tree(tree, parents, f"{title}\n\n{message}\n", who, who)
    if not git.update_ref(base_ref, sha, base_sha):
        # The base moved under us; GitHub answers the same when its own merge loses that race.
        raise ApiError(405, "Base branch was modified. Review and try the merge again.")
    now = now_iso()
    ctx.db.execute(
        "UPDATE pulls SET merged_at = ?, merged_by = ?, merge_commit_sha = ?, base_sha = ? WHERE id = ?",
        (now, viewer["id"], sha, base_sha, pull["id"]),
    )
    ctx.db.execute(
        "UPDATE issues SET state = 'closed', closed_at = ?, closed_by = ?, updated_at = ? WHERE id = ?",
        (now, viewer["id"], now, issue["id"]),
    )
    events.refs_changed(ctx, repo, [(base_ref, base_sha, sha)], viewer)
    emit_pull(ctx, repo, "closed", pull["id"])
    return Response.json(200, {"sha": sha, "merged": True, "message": "Pull Request successfully merged"})
