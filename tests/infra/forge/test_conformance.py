"""The JSON the forge answers and the webhooks it emits validate against githubkit's GitHub 2022-11-28 models,
and webhook payloads have the same top-level keys as GitHub's own examples (tests/infra/forge/data/webhook-examples).

One forge is populated once per module by a scenario that touches every endpoint PyGithub uses here; each
test then checks one answer or one payload.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import githubkit_schemas.v2022_11_28.models as gh_models
import httpx
import pytest
from pydantic import BaseModel

from infra.forge.testing import ForgeHandle, running_forge

EXAMPLES = Path(__file__).resolve().parent / "data" / "webhook-examples"
# GitHub adds ``installation`` only for GitHub App deliveries, which the forge does not model, and
# ``organization`` only for organisation-owned repositories (checked on its own below).
CONTEXTUAL_KEYS = {"installation", "organization"}

REST_MODELS = {
    "get_user": ("PrivateUser", False),
    "get_public_user": ("SimpleUser", False),
    "create_repo": ("FullRepository", False),
    "get_repo": ("FullRepository", False),
    "list_branches": ("ShortBranch", True),
    "get_branch": ("BranchWithProtection", False),
    "create_blob": ("ShortBlob", False),
    "get_blob": ("Blob", False),
    "create_tree": ("GitTree", False),
    "get_tree": ("GitTree", False),
    "create_git_commit": ("GitCommit", False),
    "get_git_commit": ("GitCommit", False),
    "create_ref": ("GitRef", False),
    "get_ref": ("GitRef", False),
    "update_ref": ("GitRef", False),
    "matching_refs": ("GitRef", True),
    "get_commit": ("Commit", False),
    "list_commits": ("Commit", True),
    "create_status": ("Status", False),
    "list_statuses": ("Status", True),
    "combined_status": ("CombinedCommitStatus", False),
    "create_issue": ("Issue", False),
    "get_issue": ("Issue", False),
    "list_issues": ("Issue", True),
    "edit_issue": ("Issue", False),
    "issue_labels": ("Label", True),
    "create_comment": ("IssueComment", False),
    "list_comments": ("IssueComment", True),
    "create_pull": ("PullRequest", False),
    "get_pull": ("PullRequest", False),
    "list_pulls": ("PullRequestSimple", True),
    "request_reviewers": ("PullRequestSimple", False),
    "requested_reviewers": ("PullRequestReviewRequest", False),
    "create_review": ("PullRequestReview", False),
    "list_reviews": ("PullRequestReview", True),
    "dismiss_review": ("PullRequestReview", False),
    "merge": ("PullRequestMergeResult", False),
    "merged_pull": ("PullRequest", False),
    "pull_commits": ("Commit", True),
    "create_hook": ("Hook", False),
    "list_hooks": ("Hook", True),
    "list_deliveries": ("HookDeliveryItem", True),
    "get_delivery": ("HookDelivery", False),
    "collaborators": ("Collaborator", True),
    "permission": ("RepositoryCollaboratorPermission", False),
}

WEBHOOK_MODELS = {
    ("ping", None): "WebhookPing",
    ("issues", "opened"): "WebhookIssuesOpened",
    ("issues", "edited"): "WebhookIssuesEdited",
    ("issues", "labeled"): "WebhookIssuesLabeled",
    ("issues", "unlabeled"): "WebhookIssuesUnlabeled",
    ("issues", "closed"): "WebhookIssuesClosed",
    ("issues", "reopened"): "WebhookIssuesReopened",
    ("issue_comment", "created"): "WebhookIssueCommentCreated",
    ("issue_comment", "edited"): "WebhookIssueCommentEdited",
    ("issue_comment", "deleted"): "WebhookIssueCommentDeleted",
    ("pull_request", "opened"): "WebhookPullRequestOpened",
    ("pull_request", "edited"): "WebhookPullRequestEdited",
    ("pull_request", "synchronize"): "WebhookPullRequestSynchronize",
    ("pull_request", "ready_for_review"): "WebhookPullRequestReadyForReview",
    ("pull_request", "converted_to_draft"): "WebhookPullRequestConvertedToDraft",
    ("pull_request", "review_requested"): "WebhookPullRequestReviewRequestedOneof0",
    ("pull_request", "labeled"): "WebhookPullRequestLabeled",
    ("pull_request", "closed"): "WebhookPullRequestClosed",
    ("pull_request", "reopened"): "WebhookPullRequestReopened",
    ("pull_request_review", "submitted"): "WebhookPullRequestReviewSubmitted",
    ("pull_request_review", "dismissed"): "WebhookPullRequestReviewDismissed",
    ("push", None): "WebhookPush",
}


class World:
    def __init__(self, forge: ForgeHandle) -> None:
        self.forge = forge
        self.answers: dict[str, Any] = {}
        self.alice = forge.create_user("alice")
        self.bob = forge.create_user("bob")

    def call(self, name: str | None, method: str, path: str, token: str, body: Any = None) -> Any:
        resp = self.forge.http.request(
            method, self.forge.api_url + path, json=body, headers={"Authorization": f"token {token}"}
        )
        assert resp.status_code < 400, f"{method} {path}: {resp.status_code} {resp.text}"
        data = resp.json() if resp.content else None
        if name is not None:
            self.answers[name] = data
        return data


def _populate(w: World) -> None:
    a, b = w.alice, w.bob
    r = "/repos/alice/shop"
    w.call("get_user", "GET", "/user", a)
    w.call("get_public_user", "GET", "/users/bob", a)
    w.call("create_repo", "POST", "/user/repos", a, {"name": "shop", "auto_init": True})
    w.call(None, "PUT", f"{r}/collaborators/bob", a, {"permission": "push"})
    w.call(
        "create_hook",
        "POST",
        f"{r}/hooks",
        a,
        {"config": {"url": "http://127.0.0.1:9/", "content_type": "json", "secret": "s"}, "events": ["*"]},
    )
    w.call("get_repo", "GET", r, a)
    w.call("list_branches", "GET", f"{r}/branches", a)
    main = w.call("get_branch", "GET", f"{r}/branches/main", a)["commit"]["sha"]
    blob = w.call("create_blob", "POST", f"{r}/git/blobs", a, {"content": "x = 1\n", "encoding": "utf-8"})
    w.call("get_blob", "GET", f"{r}/git/blobs/{blob['sha']}", a)
    base_tree = w.call("get_git_commit", "GET", f"{r}/git/commits/{main}", a)["tree"]["sha"]
    w.call("get_tree", "GET", f"{r}/git/trees/{base_tree}?recursive=1", a)
    tree = w.call(
        "create_tree",
        "POST",
        f"{r}/git/trees",
        a,
        {"base_tree": base_tree, "tree": [{"path": "app.py", "mode": "100644", "type": "blob", "sha": blob["sha"]}]},
    )
    head = w.call(
        "create_git_commit", "POST", f"{r}/git/commits", a, {"message": "app", "tree": tree["sha"], "parents": [main]}
    )["sha"]
    w.call("create_ref", "POST", f"{r}/git/refs", a, {"ref": "refs/heads/fix", "sha": main})
    w.call("update_ref", "PATCH", f"{r}/git/refs/heads/fix", a, {"sha": head})
    w.call(None, "POST", f"{r}/git/refs", a, {"ref": "refs/durafix/claims/one", "sha": main})
    w.call("get_ref", "GET", f"{r}/git/ref/heads/fix", a)
    w.call("matching_refs", "GET", f"{r}/git/matching-refs/durafix/", a)
    w.call("get_commit", "GET", f"{r}/commits/{head}", a)
    w.call("list_commits", "GET", f"{r}/commits?sha=fix", a)
    w.call("create_status", "POST", f"{r}/statuses/{head}", a, {"state": "success", "context": "ci"})
    w.call("list_statuses", "GET", f"{r}/commits/{head}/statuses", a)
    w.call("combined_status", "GET", f"{r}/commits/{head}/status", a)

    number = w.call("create_issue", "POST", f"{r}/issues", a, {"title": "Bug", "body": "broken"})["number"]
    w.call("edit_issue", "PATCH", f"{r}/issues/{number}", a, {"title": "Bug!", "body": "very broken"})
    w.call("issue_labels", "POST", f"{r}/issues/{number}/labels", a, {"labels": ["bug"]})
    w.call(None, "DELETE", f"{r}/issues/{number}/labels/bug", a)
    comment = w.call("create_comment", "POST", f"{r}/issues/{number}/comments", b, {"body": "me too"})
    w.call(None, "PATCH", f"{r}/issues/comments/{comment['id']}", b, {"body": "me too!"})
    w.call(None, "DELETE", f"{r}/issues/comments/{comment['id']}", b)
    w.call(None, "POST", f"{r}/issues/{number}/comments", a, {"body": "kept"})
    w.call("list_comments", "GET", f"{r}/issues/{number}/comments", a)
    w.call(None, "PATCH", f"{r}/issues/{number}", a, {"state": "closed"})
    w.call(None, "PATCH", f"{r}/issues/{number}", a, {"state": "open"})
    w.call("get_issue", "GET", f"{r}/issues/{number}", a)
    w.call("list_issues", "GET", f"{r}/issues?state=all", a)

    pull = w.call(
        "create_pull",
        "POST",
        f"{r}/pulls",
        a,
        {"title": "Fix", "body": "Fixes #1", "head": "fix", "base": "main", "draft": True},
    )
    pn = pull["number"]
    w.call(None, "PATCH", f"{r}/pulls/{pn}", a, {"title": "Fix it"})
    w.call(None, "POST", f"{r}/issues/{pn}/labels", a, ["durafix"])
    w.call("request_reviewers", "POST", f"{r}/pulls/{pn}/requested_reviewers", a, {"reviewers": ["bob"]})
    w.call("requested_reviewers", "GET", f"{r}/pulls/{pn}/requested_reviewers", a)
    node = pull["node_id"]
    mutation = (
        "mutation Mutation($input: {0}Input!) {{ {1}(input: $input) {{ clientMutationId pullRequest {{ isDraft }} }} }}"
    )
    for name in ("markPullRequestReadyForReview", "convertPullRequestToDraft", "markPullRequestReadyForReview"):
        query = mutation.format(name[0].upper() + name[1:], name)
        resp = w.forge.http.post(
            f"{w.forge.base_url}/api/graphql",
            json={"query": query, "variables": {"input": {"pullRequestId": node}}},
            headers={"Authorization": f"token {a}"},
        )
        assert "errors" not in resp.json(), resp.text
    w.call(None, "POST", f"{r}/pulls/{pn}/requested_reviewers", a, {"reviewers": []})
    first = w.call("create_review", "POST", f"{r}/pulls/{pn}/reviews", b, {"body": "ok", "event": "APPROVE"})
    w.call("dismiss_review", "PUT", f"{r}/pulls/{pn}/reviews/{first['id']}/dismissals", a, {"message": "stale"})
    newer = w.call(None, "POST", f"{r}/git/commits", a, {"message": "more", "tree": tree["sha"], "parents": [head]})
    w.call(None, "PATCH", f"{r}/git/refs/heads/fix", a, {"sha": newer["sha"]})
    w.call(None, "POST", f"{r}/pulls/{pn}/reviews", b, {"body": "ok again", "event": "APPROVE"})
    w.call("list_reviews", "GET", f"{r}/pulls/{pn}/reviews", a)
    w.call("list_pulls", "GET", f"{r}/pulls?state=all", a)
    w.call("get_pull", "GET", f"{r}/pulls/{pn}", a)
    w.call("pull_commits", "GET", f"{r}/pulls/{pn}/commits", a)
    w.call("merge", "PUT", f"{r}/pulls/{pn}/merge", a, {"sha": newer["sha"], "merge_method": "merge"})
    w.call("merged_pull", "GET", f"{r}/pulls/{pn}", a)
    side = w.call(None, "POST", f"{r}/git/commits", a, {"message": "side", "tree": tree["sha"], "parents": [head]})
    w.call(None, "POST", f"{r}/git/refs", a, {"ref": "refs/heads/other", "sha": side["sha"]})
    other = w.call(None, "POST", f"{r}/pulls", a, {"title": "Other", "head": "other", "base": "main"})
    w.call(None, "PATCH", f"{r}/pulls/{other['number']}", a, {"state": "closed"})
    w.call(None, "PATCH", f"{r}/pulls/{other['number']}", a, {"state": "open"})
    hooks = w.call("list_hooks", "GET", f"{r}/hooks", a)
    w.forge.wait_for_deliveries()
    deliveries = w.call("list_deliveries", "GET", f"{r}/hooks/{hooks[0]['id']}/deliveries?per_page=100", a)
    w.call("get_delivery", "GET", f"{r}/hooks/{hooks[0]['id']}/deliveries/{deliveries[0]['id']}", a)
    w.call("collaborators", "GET", f"{r}/collaborators", a)
    w.call("permission", "GET", f"{r}/collaborators/bob/permission", a)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with running_forge(tmp_path_factory.mktemp("conformance")) as forge:
        w = World(forge)
        _populate(w)
        yield w


def _model(name: str) -> type[BaseModel]:
    model: type[BaseModel] = getattr(gh_models, name)
    return model


@pytest.mark.parametrize("answer", sorted(REST_MODELS))
def test_rest_answer_validates_against_githubs_model(world: World, answer: str) -> None:
    model_name, is_list = REST_MODELS[answer]
    data = world.answers[answer]
    items = data if is_list else [data]
    assert items, f"{answer} returned nothing to validate"
    for item in items:
        _model(model_name).model_validate(item)


def _payloads(world: World, event: str, action: str | None) -> list[dict[str, Any]]:
    found = []
    for delivery in world.forge.deliveries():
        payload = json.loads(delivery["request"]["body"])
        if delivery["event"] == event and payload.get("action") == action:
            found.append(payload)
    return found


@pytest.mark.parametrize(("event", "action"), sorted(WEBHOOK_MODELS, key=str))
def test_webhook_payload_validates_against_githubs_model(world: World, event: str, action: str | None) -> None:
    payloads = _payloads(world, event, action)
    assert payloads, f"the scenario emitted no {event} {action}"
    for payload in payloads:
        _model(WEBHOOK_MODELS[(event, action)]).model_validate(payload)


# Examples in the corpus for the receiver's tests (every payload GitHub may send it) of actions the emulator
# does not emulate (assignees, milestones, locks, pins, transfers, deletions), and the variant of ``opened``
# that follows a transfer (its ``changes`` key): the emulator's payloads are compared with the rest.
NOT_EMULATED = {
    ("issues", "assigned"),
    ("issues", "unassigned"),
    ("issues", "deleted"),
    ("issues", "milestoned"),
    ("issues", "demilestoned"),
    ("issues", "locked"),
    ("issues", "unlocked"),
    ("issues", "pinned"),
    ("issues", "unpinned"),
    ("issues", "transferred"),
    ("pull_request", "assigned"),
    ("pull_request", "unassigned"),
    ("pull_request", "locked"),
    ("pull_request", "unlocked"),
    ("pull_request", "unlabeled"),
    ("pull_request", "review_request_removed"),
}
NOT_EMULATED_FILES = {"opened.with-transfer.payload.json"}


def _examples() -> list[tuple[str, str | None, Path]]:
    out = []
    for path in sorted(EXAMPLES.glob("*/*.json")):
        action = None if path.parent.name == "ping" else path.name.split(".")[0]
        if (path.parent.name, action) in NOT_EMULATED or path.name in NOT_EMULATED_FILES:
            continue
        out.append((path.parent.name, action, path))
    return out


@pytest.mark.parametrize(("event", "action", "example"), _examples(), ids=lambda v: str(getattr(v, "name", v)))
def test_webhook_payload_has_the_example_top_level_keys(
    world: World, event: str, action: str | None, example: Path
) -> None:
    expected = set(json.loads(example.read_text())) - CONTEXTUAL_KEYS
    payloads = _payloads(world, event, action)
    assert payloads, f"the scenario emitted no {event} {action}"
    for payload in payloads:
        assert set(payload) - CONTEXTUAL_KEYS == expected


def test_organization_repositories_add_the_organization_key(tmp_path: Path) -> None:
    with running_forge(tmp_path) as forge:
        token = forge.create_user("olga")
        forge.create_org("acme", admin="olga")
        forge.create_repo(token, "tool", owner="acme")
        resp = httpx.post(
            f"{forge.api_url}/repos/acme/tool/issues", json={"title": "x"}, headers={"Authorization": f"token {token}"}
        )
        assert resp.status_code == 201
        forge.http.post(
            f"{forge.api_url}/repos/acme/tool/hooks",
            headers={"Authorization": f"token {token}"},
            json={"config": {"url": "http://127.0.0.1:9/", "content_type": "json"}, "events": ["*"]},
        )
        httpx.post(
            f"{forge.api_url}/repos/acme/tool/issues", json={"title": "y"}, headers={"Authorization": f"token {token}"}
        )
        opened = [json.loads(d["request"]["body"]) for d in forge.deliveries() if d["event"] == "issues"]
        assert [p["organization"]["login"] for p in opened] == ["acme"]
        gh_models.WebhookIssuesOpened.model_validate(opened[0])
