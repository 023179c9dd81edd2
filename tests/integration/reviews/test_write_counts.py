"""Writes per effectively-once object on the happy path, counted by the emulator: the claim, the object, the
record, and nothing more; an object found again costs no write at all."""

from __future__ import annotations

from reviews.adapter import GitHubForge
from tests.support.requests_seen import counting
from tests.support.review_site import Site

OP = "repair-bot-shop-1:ticket"
KEY = "repair-bot-shop-1:evidence:bundle"


def _claim_of(adapter: GitHubForge, kind: str, name: str) -> tuple[str, str]:
    claim = adapter.claims.observe(kind, name)
    assert claim is not None
    return claim.record.state, claim.record.result


def test_a_ticket_comment_costs_three_writes_two_of_them_claim_pushes(site: Site) -> None:
    with counting(site.handle) as seen:
        ticket = site.adapter.ensure_ticket(OP, site.issue, "t", "Status: reproducing")

    assert ticket.created
    assert seen.writes == 3
    assert (seen.by_kind["push"], seen.by_kind["POST"]) == (2, 1)
    assert _claim_of(site.adapter, "ticket", OP) == ("done", f"comment:{ticket.comment_id}")

    with counting(site.handle) as again:
        assert site.adapter.ensure_ticket(OP, site.issue, "t", "Status: reproducing").comment_id == ticket.comment_id
    assert again.writes == 0 and again.reads > 0


def test_a_ticket_issue_costs_three_writes(site: Site) -> None:
    with counting(site.handle) as seen:
        ticket = site.adapter.ensure_ticket(OP, None, "durafix run 1", "Tracking the repair.")

    assert ticket.created and ticket.kind == "issue"
    assert seen.writes == 3
    assert (seen.by_kind["push"], seen.by_kind["POST"]) == (2, 1)
    assert _claim_of(site.adapter, "ticket", OP) == ("done", f"issue:{ticket.issue_number}")


def test_a_keyed_comment_costs_three_writes_and_an_unchanged_one_none(site: Site) -> None:
    with counting(site.handle) as seen:
        ref = site.adapter.ensure_comment(site.issue, KEY, "Evidence bundle")

    assert ref.action == "created"
    assert seen.writes == 3
    assert (seen.by_kind["push"], seen.by_kind["POST"]) == (2, 1)
    assert _claim_of(site.adapter, "comment", f"{KEY}@{site.issue}") == ("done", f"comment:{ref.comment_id}")

    with counting(site.handle) as again:
        assert site.adapter.ensure_comment(site.issue, KEY, "Evidence bundle").action == "unchanged"
    assert again.writes == 0
