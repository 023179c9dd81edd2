"""Reading the bug report: an issue's text and author.

Read-only and safe to repeat. Also opening an issue from a local report file (``durafix start --report``),
which is a plain create: GitHub has no idempotency key for issues, so the CLI opens it once and then starts
the run for the number it got back.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from reviews.transport import Transport

if TYPE_CHECKING:
    from pipeline.config import DurafixConfig


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


def open_issue_from_file(config: DurafixConfig, repository: str, report: Path, *, label: str) -> int:
    """Open an issue from a markdown file (first line: title, the rest: body) with the trigger label."""
    from pipeline.services import Services

    text = report.read_text()
    title, _, body = text.partition("\n")
    title = title.lstrip("# ").strip()
    if not title:
        raise ValueError(f"{report}: the first line must be the report's title")
    return Services(config).forge(repository).create_issue(title, body.strip() + "\n", labels=[label])
