"""The adapter's reads the reconciler relies on: the open issues carrying a label, and who added a label."""

from __future__ import annotations

import pytest

from reviews.errors import ForgeTransientError
from reviews.markers import run_branch_prefix
from tests.support.review_site import Site

LABEL = "durafix"


def test_open_issues_labelled_lists_only_open_labelled_issues_not_pull_requests(site: Site) -> None:
    labelled = site.adapter.create_issue("Labelled", "body", labels=[LABEL])
    other = site.adapter.create_issue("Other label", "body", labels=["bug"])
    closed = site.adapter.create_issue("Closed", "body", labels=[LABEL])
    site.repo().get_issue(closed).edit(state="closed")
    # A labelled pull request is listed by GitHub's issues endpoint too; it is not a report.
    branch = run_branch_prefix("run") + "fix"
    site.adapter.publish_branch(branch, site.commit("cart.py", "x = 1\n"), None, site.workdir)
    pr = site.adapter.ensure_draft_pr("run", branch, "main", "Fix", "Body")
    site.adapter.add_labels(pr.number, [LABEL])

    found = site.adapter.open_issues_labelled(LABEL)

    assert [i.number for i in found] == [labelled]
    assert other not in [i.number for i in found]
    [issue] = found
    assert (issue.title, issue.author, issue.state, issue.labels) == ("Labelled", "bot", "open", [LABEL])


def test_label_added_by_is_none_on_a_forge_that_keeps_no_issue_events(site: Site) -> None:
    # The emulator has no issue events endpoint (404, as for any unknown path): the reader says it cannot tell.
    site.adapter.add_labels(site.issue, [LABEL])
    assert site.adapter.label_added_by(site.issue, LABEL) is None


def test_label_added_names_the_last_adder_and_when_on_a_forge_that_keeps_issue_events(site: Site) -> None:
    site.handle.keep_issue_events(True)
    try:
        site.adapter.add_labels(site.issue, [LABEL])
        added = site.adapter.label_added(site.issue, LABEL)
        issue = site.adapter.read_issue(site.issue)
        assert added is not None and added.actor == "bot" and added.at.tzinfo is not None
        # Labelling is the issue's last change: it stamped both, in the forge's whole seconds.
        assert issue.updated_at == added.at
        assert site.adapter.label_added_by(site.issue, LABEL) == "bot"
        assert site.adapter.label_added(site.issue, "other") is None
    finally:
        site.handle.keep_issue_events(False)


def test_a_listing_the_forge_cannot_answer_now_is_a_transient_failure_not_an_empty_list(site: Site) -> None:
    site.adapter.create_issue("Labelled", "body", labels=[LABEL])
    site.fault("GET", rf"/repos/{site.full_name}/issues$", "status", status=503)
    with pytest.raises(ForgeTransientError):
        site.adapter.open_issues_labelled(LABEL)
