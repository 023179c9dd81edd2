"""The run's ticket: one marked status comment on the triggering issue, or one marked issue.

Contract of `ensure_ticket(op_id, ...)`: at most one ticket per op id, across overlapping attempts and
processes. Lookup by marker (`<!-- durafix:ticket op=... -->`, authored by our login) comes first; a
create happens only under the claim `refs/durafix/claims/ticket/<op id>` (see `claims`). After an
ambiguous create the same lookup settles it; if it cannot, the claim stays with the silent attempt until
its lease ends, and the next attempt looks again before creating.
"""

from __future__ import annotations

from datetime import timedelta

from github.Issue import Issue
from github.IssueComment import IssueComment

from reviews.claims import ClaimState, ClaimStore
from reviews.markers import TICKET, find_marker, ticket_marker, with_marker
from reviews.models import Ticket
from reviews.transport import Transport

KIND = "ticket"
# Issue `since` filters on updated_at; a small margin absorbs clock steps between GitHub's own hosts.
_SINCE_MARGIN = timedelta(minutes=5)


def _is_ticket(body: str | None, op_id: str) -> bool:
    marker = find_marker(body, TICKET)
    return marker is not None and marker.attrs.get("op") == op_id


def _from_comment(op_id: str, issue_number: int, comment: IssueComment, created: bool) -> Ticket:
    return Ticket(
        op_id=op_id,
        kind="comment",
        issue_number=issue_number,
        comment_id=comment.id,
        html_url=comment.html_url,
        created=created,
    )


def _from_issue(op_id: str, issue: Issue, created: bool) -> Ticket:
    return Ticket(op_id=op_id, kind="issue", issue_number=issue.number, html_url=issue.html_url, created=created)


class Tickets:
    def __init__(self, transport: Transport, claims: ClaimStore) -> None:
        self._t = transport
        self._claims = claims

    def ensure(self, op_id: str, issue_number: int | None, title: str, body: str) -> Ticket:
        """Find or create the ticket for `op_id` (a comment on `issue_number`, or a new issue if None)."""
        text = with_marker(body, ticket_marker(op_id))
        repo = self._t.repo
        if issue_number is not None:
            number = issue_number

            def post_comment() -> Ticket:
                comment = self._t.mutate(
                    f"comment ticket on #{number}", lambda: repo.get_issue(number).create_comment(text)
                )
                return _from_comment(op_id, number, comment, created=True)

            return self._claims.create_once(
                KIND,
                op_id,
                f"issue:{number}",
                lambda _claim: self._find_comment(op_id, number),
                post_comment,
                lambda t: f"comment:{t.comment_id}",
            )

        def post_issue() -> Ticket:
            issue = self._t.mutate("create ticket issue", lambda: repo.create_issue(title=title, body=text))
            return _from_issue(op_id, issue, created=True)

        return self._claims.create_once(
            KIND,
            op_id,
            "repo",
            lambda claim: self._find_issue(op_id, claim),
            post_issue,
            lambda t: f"issue:{t.issue_number}",
        )

    def find(self, op_id: str) -> Ticket | None:
        """The ticket for `op_id`, located through its claim (which names the target issue)."""
        claim = self._claims.observe(KIND, op_id)
        if claim is None:
            return None
        target, _, number = claim.record.target.partition(":")
        if target == "issue":
            return self._find_comment(op_id, int(number))
        return self._find_issue(op_id, claim)

    def update(self, ticket: Ticket, body: str) -> Ticket:
        """Replace the ticket's text, keeping its marker. Idempotent: an identical body is not re-sent."""
        text = with_marker(body, ticket_marker(ticket.op_id))
        repo = self._t.repo
        if ticket.kind == "comment":
            assert ticket.comment_id is not None
            comment_id = ticket.comment_id
            comment = self._t.read(
                f"read ticket comment {comment_id}",
                lambda: repo.get_issue(ticket.issue_number).get_comment(comment_id).complete(),
            )
            if comment.body != text:
                self._t.mutate(f"edit ticket comment {comment_id}", lambda: comment.edit(text))
            return _from_comment(ticket.op_id, ticket.issue_number, comment, created=False)
        issue = self._t.read(
            f"read ticket issue #{ticket.issue_number}", lambda: repo.get_issue(ticket.issue_number).complete()
        )
        if issue.body != text:
            self._t.mutate(f"edit ticket issue #{issue.number}", lambda: issue.edit(body=text))
        return _from_issue(ticket.op_id, issue, created=False)

    def _find_comment(self, op_id: str, issue_number: int) -> Ticket | None:
        matches = self._t.our_comments(
            f"find ticket comment on #{issue_number}", issue_number, lambda body: _is_ticket(body, op_id)
        )
        comment = min(matches, key=lambda c: c.id, default=None)
        return _from_comment(op_id, issue_number, comment, created=False) if comment else None

    def _find_issue(self, op_id: str, claim: ClaimState | None) -> Ticket | None:
        # Every ticket issue is created under a claim, so no claim means no issue; once the claim is
        # done it names the issue; while it is open, the issue can only be newer than the claim.
        if claim is None:
            return None
        login = self._t.login()
        kind, _, number = claim.record.result.partition(":")
        if kind == "issue":
            issue = self._t.read_if_found(
                f"read ticket issue #{number}", lambda: self._t.repo.get_issue(int(number)).complete()
            )
            if issue is None or not _is_ticket(issue.body, op_id):
                return None
            return _from_issue(op_id, issue, created=False)

        def scan() -> Issue | None:
            since = claim.since - _SINCE_MARGIN
            matches = [
                i
                for i in self._t.repo.get_issues(state="all", since=since, sort="created", direction="asc")
                if i.pull_request is None and i.user.login == login and _is_ticket(i.body, op_id)
            ]
            return matches[0] if matches else None

        scanned = self._t.read("find ticket issue", scan)
        return _from_issue(op_id, scanned, created=False) if scanned else None
