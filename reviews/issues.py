"""Reading the bug report: an issue's text and author.

Read-only and safe to repeat. (Opening an issue is :meth:`reviews.adapter.GitHubForge.create_issue`.)
"""

from __future__ import annotations

from pydantic import BaseModel

from reviews.transport import Transport


class IssueInfo(BaseModel):
    number: int
    title: str
    body: str
    author: str
    state: str
    labels: list[str]


def read_issue(t: Transport, number: int) -> IssueInfo:
    def fetch() -> IssueInfo:
        issue = t.repo.get_issue(number)
        return IssueInfo(
            number=issue.number,
            title=issue.title,
            body=issue.body or "",
            author=issue.user.login,
            state=issue.state,
            labels=[label.name for label in issue.labels],
        )

    return t.read(f"read issue #{number}", fetch)
