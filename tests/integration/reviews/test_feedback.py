"""A revision's forge side through the adapter: a review's text and line comments read back, and the
reviewer asked again."""

from __future__ import annotations

from reviews.markers import run_branch_prefix
from reviews.models import ReviewLineComment
from tests.support.review_site import Site

RUN = "repair-bot-shop-2"
BRANCH = run_branch_prefix(RUN) + "fix"


def test_a_request_for_changes_is_read_with_its_line_comments_and_the_reviewer_is_asked_again(site: Site) -> None:
    sha = site.commit("cart.py", "total = sum(prices)\n")
    site.adapter.publish_branch(BRANCH, sha, None, site.workdir)
    ref = site.adapter.ensure_draft_pr(RUN, BRANCH, "main", "Fix", "Body")
    reviewer = site.handle.create_user("reviewer")
    site.handle.add_collaborator(site.token, site.full_name, "reviewer")
    review = (
        site.repo(reviewer)
        .get_pull(ref.number)
        .create_review(
            body="Say why.",
            event="REQUEST_CHANGES",
            comments=[{"path": "cart.py", "line": 1, "body": "quantities?"}],
        )
    )

    read = site.adapter.read_review(ref.number, review.id)

    assert (read.review_id, read.reviewer, read.state, read.body, read.commit_id) == (
        review.id,
        "reviewer",
        "CHANGES_REQUESTED",
        "Say why.",
        sha,
    )
    assert read.comments == [ReviewLineComment(path="cart.py", line=1, body="quantities?")]
    site.adapter.request_review(ref.number, ["reviewer"])
    site.adapter.request_review(ref.number, ["reviewer"])
    users, _ = site.repo().get_pull(ref.number).get_review_requests()
    assert [u.login for u in users] == ["reviewer"]
