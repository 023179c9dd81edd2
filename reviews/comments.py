"""Keyed comments (evidence, status) on issues and pull requests.

Contract of `ensure_comment(number, key, body)`: one comment per (issue or PR, key), carrying
`<!-- durafix:comment key=<key> sha256=<content hash> -->`.

- Same key and same hash already there: returned as is, nothing is posted (`unchanged`).
- Same key, other hash: that comment is edited in place (`updated`); an edit is idempotent.
- No comment with the key: created under the claim `refs/durafix/claims/comment/<key>@<number>`, so
  overlapping calls post once; an ambiguous post is settled by listing the comments again (see `claims`).
"""

from __future__ import annotations

from github.IssueComment import IssueComment

from reviews.claims import ClaimStore
from reviews.markers import COMMENT, comment_marker, content_sha256, find_marker, with_marker
from reviews.models import CommentRef
from reviews.transport import Transport

KIND = "comment"


def claim_name(number: int, key: str) -> str:
    """Claim names start with the key, so a run's claims share its keys' prefix (the run id)."""
    return f"{key}@{number}"


def _ref(number: int, key: str, comment: IssueComment, action: str) -> CommentRef:
    marker = find_marker(comment.body, COMMENT)
    return CommentRef(
        issue_number=number,
        comment_id=comment.id,
        key=key,
        sha256=marker.attrs.get("sha256", "") if marker else "",
        html_url=comment.html_url,
        action=action,  # type: ignore[arg-type]
    )


class Comments:
    def __init__(self, transport: Transport, claims: ClaimStore) -> None:
        self._t = transport
        self._claims = claims

    def ensure(self, number: int, key: str, body: str) -> CommentRef:
        digest = content_sha256(body)
        text = with_marker(body, comment_marker(key, digest))
        repo = self._t.repo

        posted: list[int] = []

        def post() -> IssueComment:
            comment = self._t.mutate(
                f"post comment {key} on #{number}", lambda: repo.get_issue(number).create_comment(text)
            )
            posted.append(comment.id)
            return comment

        comment = self.find(number, key) or self._claims.create_once(
            KIND,
            claim_name(number, key),
            f"issue:{number}",
            lambda _claim: self.find(number, key),
            post,
            lambda c: f"comment:{c.id}",
        )
        marker = find_marker(comment.body, COMMENT)
        if marker is not None and marker.attrs.get("sha256") == digest:
            return _ref(number, key, comment, "created" if comment.id in posted else "unchanged")
        self._t.mutate(f"edit comment {key} on #{number}", lambda: comment.edit(text))
        return _ref(number, key, comment, "updated")

    def find(self, number: int, key: str) -> IssueComment | None:
        """Our oldest comment on `number` carrying `key` (any content hash)."""
        matches = self._t.our_comments(f"find comment {key} on #{number}", number, lambda body: _has_key(body, key))
        return min(matches, key=lambda c: c.id, default=None)

    def list_keyed(self, number: int, key_prefix: str) -> list[IssueComment]:
        """Our comments on `number` whose key starts with `key_prefix`."""
        return self._t.our_comments(
            f"list comments {key_prefix}* on #{number}", number, lambda body: _key_starts(body, key_prefix)
        )


def _key_of(body: str | None) -> str | None:
    marker = find_marker(body, COMMENT)
    return marker.attrs.get("key") if marker else None


def _has_key(body: str | None, key: str) -> bool:
    return _key_of(body) == key


def _key_starts(body: str | None, prefix: str) -> bool:
    key = _key_of(body)
    return key is not None and key.startswith(prefix)
