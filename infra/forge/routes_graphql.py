"""The GraphQL endpoint, serving only the draft-state mutations REST cannot do.

Served: ``markPullRequestReadyForReview`` and ``convertPullRequestToDraft`` in the form PyGithub sends them
(``mutation Mutation($input: ...Input!) { name(input: $input) { ... } }`` with ``pullRequestId`` and an optional
``clientMutationId``). The answer carries ``clientMutationId`` and ``pullRequest { isDraft }``; anything else
is a GraphQL error, as GitHub reports an unknown field. Both mutations are idempotent: marking a ready pull
request ready again changes nothing and emits nothing.
"""

from __future__ import annotations

import re
from typing import Any

from .auth import repo_role, role_at_least
from .router import Ctx, RouteTable
from .routes_pulls import emit_pull
from .view import parse_node_id
from .wire import ApiError, Response

routes = RouteTable()
MUTATIONS = {
    "markPullRequestReadyForReview": (False, "ready_for_review"),
    "convertPullRequestToDraft": (True, "converted_to_draft"),
}
FIELD = re.compile(r"^\s*mutation\b[^{]*\{\s*(\w+)\s*\(\s*input\s*:\s*\$input\s*\)", re.S)


def _error(message: str, kind: str | None = None, path: list[str] | None = None) -> Response:
    err: dict[str, Any] = {"message": message}
    if kind:
        err["type"] = kind
    if path:
        err["path"] = path
    return Response.json(200, {"data": {path[0]: None} if path else None, "errors": [err]})


@routes.add("POST", "/api/graphql")
def graphql(ctx: Ctx) -> Response:
    if ctx.viewer is None:
        raise ApiError(
            401,
            "This endpoint requires you to be authenticated.",
            documentation_url="https://docs.github.com/graphql/guides/forming-calls-with-graphql"
            "#authenticating-with-graphql",
        )
    data = ctx.request.json_object()
    query, variables = data.get("query"), data.get("variables") or {}
    if not isinstance(query, str) or not isinstance(variables, dict):
        raise ApiError(400, "Problems parsing JSON")
    m = FIELD.match(query)
    if m is None or m.group(1) not in MUTATIONS:
        name = m.group(1) if m else "query"
        return _error(f"Field '{name}' doesn't exist on type 'Mutation'")
    name = m.group(1)
    draft, action = MUTATIONS[name]
    payload = variables.get("input") or {}
    node = payload.get("pullRequestId") if isinstance(payload, dict) else None
    parsed = parse_node_id(node) if isinstance(node, str) else None
    pull = (
        ctx.db.execute("SELECT * FROM pulls WHERE id = ?", (parsed[1],)).fetchone()
        if (parsed and parsed[0] == "PullRequest")
        else None
    )
    issue = ctx.db.execute("SELECT * FROM issues WHERE id = ?", (pull["issue_id"],)).fetchone() if pull else None
    repo = ctx.repo_row(issue["repo_id"]) if issue else None
    role = repo_role(ctx.db, repo, ctx.viewer) if repo is not None else None
    if pull is None or issue is None or repo is None or role is None:
        return _error(f"Could not resolve to a node with the global id of '{node}'", "NOT_FOUND", [name])
    if not (role_at_least(role, "write") or issue["user_id"] == ctx.viewer["id"]):
        return _error(
            f"{ctx.viewer['login']} does not have the correct permissions to execute `{name[0].upper()}{name[1:]}`",
            "FORBIDDEN",
            [name],
        )
    if bool(pull["draft"]) != draft:
        ctx.db.execute("UPDATE pulls SET draft = ? WHERE id = ?", (int(draft), pull["id"]))
        emit_pull(ctx, repo, action, pull["id"])
    result = {"clientMutationId": payload.get("clientMutationId"), "pullRequest": {"isDraft": draft}}
    return Response.json(200, {"data": {name: result}})
