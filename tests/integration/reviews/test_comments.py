"""ensure_comment keeps one comment per key and never posts the same content twice."""

from __future__ import annotations

from reviews.markers import comment_marker, with_marker
from tests.support.review_site import Site

KEY = "repair-bot-shop-1:evidence:reproduction"
NEEDLE = "durafix:comment key=repair-bot-shop-1:evidence:reproduction"


def test_same_content_is_found_not_reposted_and_new_content_edits_the_same_comment(site: Site) -> None:
    first = site.adapter.ensure_comment(site.issue, KEY, "Reproduced: total shows 10 for 2 x 10.")
    same = site.adapter.ensure_comment(site.issue, KEY, "Reproduced: total shows 10 for 2 x 10.")
    changed = site.adapter.ensure_comment(site.issue, KEY, "Reproduced twice: total shows 10 for 2 x 10.")

    assert [first.action, same.action, changed.action] == ["created", "unchanged", "updated"]
    assert first.comment_id == same.comment_id == changed.comment_id
    assert first.sha256 == same.sha256 != changed.sha256
    assert site.marked_comments(site.issue, NEEDLE) == [first.comment_id]
    body = site.repo().get_issue(site.issue).get_comment(first.comment_id).body
    assert body.startswith("Reproduced twice") and f"sha256={changed.sha256}" in body


def test_comment_posted_but_response_dropped_ends_with_exactly_one_comment(site: Site) -> None:
    site.fault("POST", rf"/issues/{site.issue}/comments$", "drop_after_apply")

    ref = site.adapter.ensure_comment(site.issue, KEY, "Evidence bundle sha256 abc")
    again = site.adapter.ensure_comment(site.issue, KEY, "Evidence bundle sha256 abc")

    assert site.handle.faults() == []
    assert again.comment_id == ref.comment_id and again.action == "unchanged"
    assert site.marked_comments(site.issue, NEEDLE) == [ref.comment_id]


def test_overlapping_calls_with_one_key_post_one_comment(site: Site) -> None:
    site.fault("POST", rf"/issues/{site.issue}/comments$", "delay", seconds=1.0)
    refs = site.race(3, lambda adapter: adapter.ensure_comment(site.issue, KEY, "Evidence"))

    assert len({r.comment_id for r in refs}) == 1
    assert [r.action for r in refs].count("created") == 1
    assert site.marked_comments(site.issue, NEEDLE) == [refs[0].comment_id]


def test_a_marker_pasted_by_someone_else_does_not_count_as_ours(site: Site) -> None:
    mallory = site.handle.create_user("mallory")
    spoof = with_marker("Looks done to me", comment_marker(KEY, "0" * 64))
    site.repo(mallory).get_issue(site.issue).create_comment(spoof)

    ref = site.adapter.ensure_comment(site.issue, KEY, "Evidence")

    assert ref.action == "created"
    ours = [c for c in site.repo().get_issue(site.issue).get_comments() if c.user.login == "bot"]
    assert [c.id for c in ours] == [ref.comment_id]
