"""Webhooks delivered to a real local receiver: signatures, headers, order, records, redelivery, no retries."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.support.forge import Receiver, Team, branch_with, git

SECRET = "s3cr3t"


def _arrived(receiver: Receiver, count: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while len(receiver.events()) < count:
        assert time.monotonic() < deadline, f"only {len(receiver.events())} of {count} deliveries arrived"
        time.sleep(0.05)


def _wait(receiver: Receiver, count: int) -> list[dict[str, Any]]:
    """Wait for ``count`` JSON deliveries and return their payloads."""
    _arrived(receiver, count)
    return [json.loads(r.body) for r in receiver.events()]


def _hook(team: Team, receiver: Receiver, events: list[str], content_type: str = "json") -> int:
    hook = team.shop.create_hook(
        "web", {"url": receiver.url, "content_type": content_type, "secret": SECRET}, events=events, active=True
    )
    return hook.id


def test_ping_then_events_arrive_signed_with_github_headers(team: Team, receiver: Receiver) -> None:
    hook_id = _hook(team, receiver, ["issues"])
    team.shop.create_issue("broken cart")
    bodies = _wait(receiver, 2)
    ping, opened = receiver.events()
    assert ping.headers["X-GitHub-Event"] == "ping"
    assert bodies[0]["hook_id"] == hook_id
    assert opened.headers["X-GitHub-Event"] == "issues"
    assert bodies[1]["action"] == "opened"
    for delivery in (ping, opened):
        expected = "sha256=" + hmac.new(SECRET.encode(), delivery.body, hashlib.sha256).hexdigest()
        assert delivery.headers["X-Hub-Signature-256"] == expected
        assert delivery.headers["User-Agent"].startswith("GitHub-Hookshot/")
        assert delivery.headers["X-GitHub-Hook-ID"] == str(hook_id)
        uuid.UUID(delivery.headers["X-GitHub-Delivery"])


def test_hook_receives_only_subscribed_events_in_order(team: Team, receiver: Receiver) -> None:
    _hook(team, receiver, ["issue_comment", "pull_request"])
    issue = team.shop.create_issue("not delivered")
    for n in range(3):
        issue.create_comment(f"comment {n}")
    branch_with(team.shop, "f", {"f.txt": "f\n"})
    team.shop.create_pull(title="pr", body="", head="f", base="main")
    bodies = _wait(receiver, 5)
    events = [(r.headers["X-GitHub-Event"], b.get("action")) for r, b in zip(receiver.events(), bodies, strict=True)]
    assert events == [("ping", None)] + [("issue_comment", "created")] * 3 + [("pull_request", "opened")]
    assert [b["comment"]["body"] for b in bodies[1:4]] == ["comment 0", "comment 1", "comment 2"]


def test_push_over_git_emits_push_and_synchronize(team: Team, receiver: Receiver, tmp_path: Path) -> None:
    repo = team.shop
    before = branch_with(repo, "topic", {"t.txt": "1\n"})
    pull = repo.create_pull(title="t", body="", head="topic", base="main")
    _hook(team, receiver, ["push", "pull_request"])
    wc = tmp_path / "wc"
    git("clone", "-q", "-b", "topic", team.forge.clone_url("alice/shop", team.bob), str(wc))
    (wc / "t.txt").write_text("2\n")
    git("commit", "-qam", "second", cwd=wc)
    after = git("rev-parse", "HEAD", cwd=wc).stdout.strip()
    git("push", "-q", "origin", "topic", cwd=wc)
    bodies = _wait(receiver, 3)
    push, sync = bodies[1], bodies[2]
    assert (push["ref"], push["before"], push["after"]) == ("refs/heads/topic", before, after)
    assert push["pusher"] == {"name": "bob", "email": "bob@example.com"}
    assert [c["id"] for c in push["commits"]] == [after]
    assert (sync["action"], sync["before"], sync["after"], sync["number"]) == (
        "synchronize",
        before,
        after,
        pull.number,
    )
    assert sync["sender"]["login"] == "bob"


def test_a_push_of_more_than_three_tags_creates_no_tag_events(team: Team, receiver: Receiver, tmp_path: Path) -> None:
    # GitHub: "Events will not be created for tags when more than three tags are pushed at once."
    _hook(team, receiver, ["push"])
    wc = tmp_path / "wc"
    git("clone", "-q", team.forge.clone_url("alice/shop", team.bob), str(wc))
    for n in range(1, 8):
        git("tag", f"v{n}", cwd=wc)
    git("push", "-q", "origin", "v1", "v2", "v3", cwd=wc)
    (wc / "t.txt").write_text("t\n")
    git("add", "t.txt", cwd=wc)
    git("commit", "-qm", "t", cwd=wc)
    git("push", "-q", "origin", "main", "v4", "v5", "v6", "v7", cwd=wc)
    _arrived(receiver, 5)
    time.sleep(1.0)  # the deliveries a wrong forge would add after these
    refs = [json.loads(r.body).get("ref") for r in receiver.events()[1:]]
    assert refs == ["refs/tags/v1", "refs/tags/v2", "refs/tags/v3", "refs/heads/main"]


def test_deliveries_are_recorded_and_listed_newest_first(team: Team, receiver: Receiver) -> None:
    hook_id = _hook(team, receiver, ["issues"])
    team.shop.create_issue("recorded")
    _wait(receiver, 2)
    team.forge.wait_for_deliveries()
    summaries = list(team.shop.get_hook_deliveries(hook_id))
    assert [(d.event, d.action) for d in summaries] == [("issues", "opened"), ("ping", None)]
    assert all(d.status_code == 200 and d.status == "OK" for d in summaries)
    assert summaries[0].id is not None
    full = team.shop.get_hook_delivery(hook_id, summaries[0].id)
    assert full.request is not None and full.response is not None
    assert full.request.headers is not None and full.request.payload is not None
    assert full.request.headers["X-GitHub-Event"] == "issues"
    assert full.request.payload["issue"]["title"] == "recorded"
    assert full.response.payload == '{"ok": true}'
    assert full.redelivery is False


def test_failed_delivery_is_recorded_and_not_retried(team: Team, receiver: Receiver) -> None:
    receiver.status = 500
    hook_id = _hook(team, receiver, ["issues"])
    team.shop.create_issue("fails")
    _wait(receiver, 2)
    team.forge.wait_for_deliveries()
    time.sleep(1.0)
    assert len(receiver.events()) == 2
    summaries = list(team.shop.get_hook_deliveries(hook_id))
    assert [d.status_code for d in summaries] == [500, 500]
    assert team.shop.get_hook(hook_id).last_response.code == 500


def test_unreachable_receiver_is_recorded_as_failed(team: Team) -> None:
    hook = team.shop.create_hook("web", {"url": "http://127.0.0.1:9/closed", "content_type": "json"}, ["issues"])
    deliveries = team.forge.wait_for_deliveries()
    assert [(d["event"], d["status_code"]) for d in deliveries] == [("ping", 0)]
    [only] = list(team.shop.get_hook_deliveries(hook.id))
    assert (only.status or "").startswith("failed to connect")


def test_redelivery_sends_the_same_guid_again_flagged(team: Team, receiver: Receiver) -> None:
    hook_id = _hook(team, receiver, ["issues"])
    team.shop.create_issue("again")
    _wait(receiver, 2)
    team.forge.wait_for_deliveries()
    original = next(iter(team.shop.get_hook_deliveries(hook_id)))
    resp = httpx.post(
        f"{team.forge.api_url}/repos/alice/shop/hooks/{hook_id}/deliveries/{original.id}/attempts",
        headers={"Authorization": f"token {team.alice}"},
    )
    assert resp.status_code == 202
    _wait(receiver, 3)
    first, again = receiver.events()[1], receiver.events()[2]
    assert again.headers["X-GitHub-Delivery"] == first.headers["X-GitHub-Delivery"] == original.guid
    assert again.body == first.body
    team.forge.wait_for_deliveries()
    newest = next(iter(team.shop.get_hook_deliveries(hook_id)))
    assert (newest.guid, newest.redelivery) == (original.guid, True)


def test_form_content_type_signs_the_encoded_body(team: Team, receiver: Receiver) -> None:
    _hook(team, receiver, ["issues"], content_type="form")
    team.shop.create_issue("form")
    _arrived(receiver, 2)
    delivery = receiver.events()[1]
    assert delivery.headers["Content-Type"] == "application/x-www-form-urlencoded"
    expected = "sha256=" + hmac.new(SECRET.encode(), delivery.body, hashlib.sha256).hexdigest()
    assert delivery.headers["X-Hub-Signature-256"] == expected
    payload = json.loads(urllib.parse.parse_qs(delivery.body.decode())["payload"][0])
    assert payload["issue"]["title"] == "form"


def test_hook_edit_and_delete(team: Team, receiver: Receiver) -> None:
    hook = team.shop.get_hook(_hook(team, receiver, ["issues"]))
    assert hook.config["secret"] == "********"
    hook.edit("web", {"url": receiver.url, "content_type": "json"}, events=["push"], active=False)
    edited = team.shop.get_hook(hook.id)
    assert (edited.events, edited.active) == (["push"], False)
    team.shop.create_issue("inactive hook hears nothing")
    hook.delete()
    assert list(team.shop.get_hooks()) == []
    team.forge.wait_for_deliveries()
    assert [r.headers["X-GitHub-Event"] for r in receiver.events()] == ["ping"]
