"""footprint counts what one run left on the forge, and nothing of other runs."""

from __future__ import annotations

from reviews.markers import run_branch_prefix
from tests.support.review_site import Site


def _leave_traces(site: Site, run: str, content: str) -> int:
    site.adapter.ensure_ticket(f"{run}:ticket", site.issue, "t", f"Status of {run}")
    sha = site.commit("cart.py", content)
    branch = run_branch_prefix(run) + "attempt-1"
    site.adapter.publish_branch(branch, sha, None, site.workdir)
    pr = site.adapter.ensure_draft_pr(run, branch, "main", f"Fix from {run}", "Body")
    site.adapter.ensure_comment(pr.number, f"{run}:evidence:bundle", "Evidence bundle")
    site.adapter.ensure_comment(site.issue, f"{run}:status", "Not evidence")
    return pr.number


def test_footprint_counts_one_runs_tickets_prs_evidence_branches_and_claims(site: Site) -> None:
    pr = _leave_traces(site, "run-1", "total = 1\n")
    _leave_traces(site, "run-10", "total = 10\n")

    footprint = site.adapter.footprint("run-1", site.issue)

    assert len(footprint.tickets) == 1 and footprint.tickets[0].startswith("comment:")
    assert footprint.pull_requests == [pr]
    assert len(footprint.evidence_comments) == 1
    assert footprint.branches == ["durafix/run-1/attempt-1"]
    assert len(footprint.claims) == 3
    assert all("/run-1-" in claim for claim in footprint.claims)
    # The same traces as GitHub lists them, so a footprint blind to some of them would not pass.
    repo = site.repo()
    ticket_ids = site.marked_comments(site.issue, "durafix:ticket op=run-1:ticket")
    assert footprint.tickets == [f"comment:{i}" for i in ticket_ids]
    assert footprint.evidence_comments == site.marked_comments(pr, "durafix:comment key=run-1:evidence:bundle")
    assert footprint.branches == [b.name for b in repo.get_branches() if b.name.startswith("durafix/run-1/")]
    claim_refs = [r.ref for r in repo.get_git_matching_refs("durafix/claims/") if "/run-1-" in r.ref]
    assert sorted(footprint.claims) == sorted(claim_refs)


def test_footprint_of_a_run_that_left_nothing_is_empty(site: Site) -> None:
    footprint = site.adapter.footprint("run-2", site.issue)
    assert (footprint.tickets, footprint.pull_requests, footprint.evidence_comments) == ([], [], [])
    assert (footprint.branches, footprint.claims) == ([], [])
