"""What a review asks for, and asking a reviewer again: the forge side of a revision.

`read(number, review_id)` reads the review (`GET /pulls/{n}/reviews/{id}`) and its line comments
(`GET /pulls/{n}/reviews/{id}/comments`) as the forge holds them now. Read-only: a retry reads again.

`request_review(number, logins)` asks the given accounts to review the PR (`POST .../requested_reviewers`).
Idempotent on GitHub: a login already requested stays requested; a login that reviewed before is asked again
(which is how GitHub "re-requests" a review). The PR's author cannot be asked (422): callers leave it out.
"""

from __future__ import annotations

from reviews.errors import ForgeAmbiguousError
from reviews.models import ReviewFeedback, ReviewLineComment
from reviews.transport import Transport


class Feedback:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def read(self, number: int, review_id: int) -> ReviewFeedback:
        def read() -> ReviewFeedback:
            pr = self._t.repo.get_pull(number)
            review = pr.get_review(review_id)
            comments = [
                ReviewLineComment(path=c.path, line=c.line if c.line is not None else c.original_line, body=c.body)
                for c in pr.get_single_review_comments(review_id)
            ]
            return ReviewFeedback(
                review_id=review.id,
                reviewer=review.user.login if review.user else "",
                state=review.state,
                body=review.body or "",
                commit_id=review.commit_id,
                comments=comments,
            )

        return self._t.read(f"read review {review_id} of PR #{number}", read)

    def request_review(self, number: int, logins: list[str]) -> None:
        if not logins:
            return
        pr = self._t.read(f"read PR #{number}", lambda: self._t.repo.get_pull(number))
        # Adding a reviewer is a set operation on GitHub: sending it again after an unanswered try is harmless.
        try:
            self._t.mutate(f"request a review of PR #{number}", lambda: pr.create_review_request(reviewers=logins))
        except ForgeAmbiguousError:
            self._t.mutate(f"request a review of PR #{number}", lambda: pr.create_review_request(reviewers=logins))
