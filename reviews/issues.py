"""Reading the bug report: an issue's text and author, the open issues carrying a label, who added a label,
who closed an issue or pull request.

Read-only and safe to repeat. (Opening an issue is :meth:`reviews.adapter.GitHubForge.create_issue`.)
"""

from __future__ import annotations

from datetime import UTC, datetime

from github.Issue import Issue
from pydantic import BaseModel

from reviews.transport import Transport


class IssueInfo(BaseModel):
    """An issue as read: ``updated_at`` is when anything about it last changed (its text, a label, a comment),
    whole seconds as the forge keeps it."""

    number: int
    title: str
    body: str
    author: str
    state: str
    labels: list[str]
    updated_at: datetime | None = None


class LabelAdded(BaseModel):
    """Who added a label to an issue, and when (its ``labeled`` event)."""

    actor: str | None
    at: datetime


def _info(issue: Issue) -> IssueInfo:
    return IssueInfo(
        number=issue.number,
        title=issue.title,
        body=issue.body or "",
        author=issue.user.login,
        state=issue.state,
        labels=[label.name for label in issue.labels],
        updated_at=_utc(issue.updated_at),
    )


def _utc(at: datetime | None) -> datetime | None:
    # PyGithub parses GitHub's "...Z" as an aware datetime; a naive one is UTC all the same.
    if at is None:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def read_issue(t: Transport, number: int) -> IssueInfo:
    return t.read(f"read issue #{number}", lambda: _info(t.repo.get_issue(number)))


def open_issues_labelled(t: Transport, label: str) -> list[IssueInfo]:
    """Every open issue carrying ``label``, oldest first; pull requests (which GitHub lists as issues too) are
    left out. The whole listing is one read: a failure on any page fails it, never a partial list."""

    def fetch() -> list[IssueInfo]:
        found = t.repo.get_issues(state="open", labels=[label], sort="created", direction="asc")
        return [_info(issue) for issue in found if issue.pull_request is None]

    return t.read(f"list open issues labelled {label!r}", fetch)


def closed_by(t: Transport, number: int) -> str | None:
    """The login that closed issue or pull request ``number`` (None while it is open, or when the forge does not
    say)."""

    def fetch() -> str | None:
        closer = t.repo.get_issue(number).closed_by
        return closer.login if closer is not None else None

    return t.read(f"read who closed #{number}", fetch)


def label_added_by(t: Transport, number: int, label: str) -> str | None:
    """The login that last added ``label`` to issue ``number`` (see :func:`label_added`); None when the forge
    keeps no such events or none adds ``label``."""
    added = label_added(t, number, label)
    return added.actor if added is not None else None


def label_added(t: Transport, number: int, label: str) -> LabelAdded | None:
    """Who last added ``label`` to issue ``number`` and when, from the issue's events (``GET /repos/{owner}/
    {repo}/issues/{number}/events``); None when the forge keeps no such events (it answers 404) or none adds
    ``label``. Other failures are raised like every read's."""

    def fetch() -> LabelAdded | None:
        added: LabelAdded | None = None
        for event in t.repo.get_issue(number).get_events():
            if event.event == "labeled" and event.label is not None and event.label.name == label:
                at = _utc(event.created_at)
                if at is not None:
                    added = LabelAdded(actor=event.actor.login if event.actor is not None else None, at=at)
        return added

    return t.read_if_found(f"read the events of issue #{number}", fetch)
