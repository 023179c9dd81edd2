"""`GitHubForge`: the `ForgePort` implementation on unmodified PyGithub and the git CLI.

The operations live in small modules (tickets, comments, branches, pulls, claims); this class wires
them to one configured client and adds the run footprint, the permission read the webhook receiver
checks reviewers with, and a few thin setup helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from reviews.app_tokens import InstallationTokens
from reviews.branches import Branches
from reviews.claims import ClaimStore
from reviews.comments import KIND as COMMENT_CLAIMS
from reviews.comments import Comments
from reviews.config import ForgeConfig
from reviews.errors import ForgeNotFoundError, ForgePermanentError
from reviews.feedback import Feedback
from reviews.issues import (
    IssueInfo,
    LabelAdded,
    closed_by,
    label_added,
    label_added_by,
    open_issues_labelled,
    read_issue,
)
from reviews.markers import TICKET, find_marker, run_branch_prefix
from reviews.models import (
    CommentRef,
    MergeMethod,
    MergeResult,
    PublishResult,
    PullRef,
    PullState,
    ReviewFeedback,
    RunFootprint,
    Ticket,
)
from reviews.permissions import (
    REPO_PERMISSIONS,
    REPO_ROLES,
    ROLE_OF_PERMISSION,
    RepoPermission,
    RepoRole,
    role_at_least,
)
from reviews.pulls import Pulls
from reviews.tickets import KIND as TICKET_CLAIMS
from reviews.tickets import Tickets
from reviews.transport import Transport

__all__ = ["REPO_PERMISSIONS", "REPO_ROLES", "GitHubForge", "RepoPermission", "RepoRole", "role_at_least"]


class GitHubForge:
    """One repository on GitHub or GitHub Enterprise. Thread-compatible: use one instance per thread."""

    def __init__(self, config: ForgeConfig, app: InstallationTokens | None = None) -> None:
        """`app`: authenticate as that GitHub App's installation on the repository instead of with
        `config.token` (then the bot is the App's ``SLUG[bot]`` unless `config.bot_login` says otherwise)."""
        self.config = config
        self._t = Transport(config, app)
        self._claims = ClaimStore(self._t, config)
        self._tickets = Tickets(self._t, self._claims)
        self._comments = Comments(self._t, self._claims)
        self._branches = Branches(self._t)
        self._pulls = Pulls(self._t)
        self._feedback = Feedback(self._t)

    def close(self) -> None:
        self._t.close()

    def __enter__(self) -> GitHubForge:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def claims(self) -> ClaimStore:
        return self._claims

    def read_issue(self, number: int) -> IssueInfo:
        """Read-only: the report's title, body and author."""
        return read_issue(self._t, number)

    def open_issues_labelled(self, label: str) -> list[IssueInfo]:
        """Read-only: the open issues (not pull requests) carrying ``label``, oldest first; see `reviews.issues`."""
        return open_issues_labelled(self._t, label)

    def closed_by(self, number: int) -> str | None:
        """Read-only: who closed issue or pull request ``number`` (None while it is open)."""
        return closed_by(self._t, number)

    def label_added_by(self, number: int, label: str) -> str | None:
        """Read-only: who last added ``label`` to issue ``number`` (its events), or None when the forge cannot
        tell (it keeps no issue events) or nobody did."""
        return label_added_by(self._t, number, label)

    def label_added(self, number: int, label: str) -> LabelAdded | None:
        """Read-only: who last added ``label`` to issue ``number`` and when (its events), or None when the forge
        cannot tell (it keeps no issue events) or nobody did."""
        return label_added(self._t, number, label)

    def get_permission(self, login: str) -> RepoPermission:
        """Read-only: `login`'s permission on the repository (`GET /repos/{owner}/{repo}/collaborators/
        {user}/permission`), one of `REPO_PERMISSIONS`: `admin`; `write` (write or maintain); `read` (read
        or triage); `none`. Only `write` and `admin` mean the user may change the repository; anyone who can
        see it (on a public repository: anyone) may still submit reviews.

        Failures are classified like every read: 5xx, rate limits and missing answers are
        `ForgeTransientError`; 404 (no such user, or a repository the token cannot see) is
        `ForgeNotFoundError`; 401 is `ForgePermanentError`, and so is 403, which GitHub answers when the token
        itself lacks push access ("Must have push access to view collaborator permission."): the adapter's
        token needs write access to read reviewers' permissions. An answer naming another value is a
        `ForgePermanentError` too, so a caller deciding access on it fails closed.
        """
        answer = self._read_collaborator(f"read permission of {login}", self._t.repo.get_collaborator_permission, login)
        return _known_permission(login, answer)

    def get_role(self, login: str) -> RepoRole:
        """Read-only: `login`'s role on the repository, one of `REPO_ROLES` (the same endpoint as
        `get_permission`, its `role_name`), which tells `triage` from `read` and `maintain` from `write`. A
        custom role (an organisation's own name) counts as the base role its legacy permission names, read with
        a second request; failures as in `get_permission`."""
        answer = self._read_collaborator(f"read role of {login}", self._t.repo.get_collaborator_role_name, login)
        for role in REPO_ROLES:
            if answer == role:
                return role
        return ROLE_OF_PERMISSION[self.get_permission(login)]

    def is_team_member(self, team: str, login: str) -> bool:
        """Read-only: whether `login` is an active member of `team` (``org/team-slug``), by GitHub's
        `GET /orgs/{org}/teams/{team_slug}/memberships/{username}`: 200 with ``state: active`` is a member; 200
        with ``state: pending`` (an invitation not yet accepted) and 404 (no such team, not a member, or a team
        the token cannot see: the token needs to read the organisation's teams) are not. Other failures are
        classified like every read, so an unanswered read never becomes a membership."""
        org, _, slug = team.partition("/")
        if not org or not slug:
            raise ValueError(f"team {team!r} is not org/team-slug")
        path = f"/orgs/{quote(org, safe='')}/teams/{quote(slug, safe='')}/memberships/{quote(login, safe='')}"
        try:
            _, data = self._t.read(
                f"read membership of {login} in {team}",
                lambda: self._t.github.requester.requestJsonAndCheck("GET", path),
            )
        except ForgeNotFoundError:
            return False
        return isinstance(data, dict) and data.get("state") == "active"

    def _read_collaborator(self, what: str, read: Callable[[str], str], login: str) -> str:
        try:
            return self._t.read(what, lambda: read(login))
        except ForgePermanentError as exc:
            if exc.status != 403:
                raise
            # GitHub shows collaborator permissions only to callers with push access to the repository.
            raise ForgePermanentError(
                f"{what}: the token has no push access to {self.config.repository}, which GitHub requires to "
                f"read collaborator permissions (HTTP 403 {exc.github_message})",
                status=403,
                github_message=exc.github_message,
            ) from exc

    def login(self) -> str:
        """The login the adapter acts as (the bot): the configured `bot_login`, else the token's user (read
        once). What it authors is what counts as durafix's own (markers, PRs)."""
        return self._t.login()

    def ensure_ticket(self, op_id: str, issue_number: int | None, title: str, body: str) -> Ticket:
        """One ticket per op id; see `reviews.tickets` for the claim-based contract."""
        return self._tickets.ensure(op_id, issue_number, title, body)

    def update_ticket(self, ticket: Ticket, body: str) -> Ticket:
        """Edit the ticket in place, marker preserved; idempotent."""
        return self._tickets.update(ticket, body)

    def find_ticket(self, op_id: str) -> Ticket | None:
        return self._tickets.find(op_id)

    def publish_branch(self, branch: str, commit_sha: str, expected_old: str | None, local_repo: Path) -> PublishResult:
        """Conditional push with lease, reconciled by reading the remote ref; see `reviews.branches`."""
        return self._branches.publish(branch, commit_sha, expected_old, local_repo)

    def get_branch_sha(self, branch: str) -> str | None:
        return self._branches.sha(branch)

    def ensure_draft_pr(self, run_id: str, branch: str, base: str, title: str, body: str) -> PullRef:
        """One open draft PR per head, owned by the run's marker; see `reviews.pulls`."""
        return self._pulls.ensure_draft(run_id, branch, base, title, body)

    def ensure_comment(self, number: int, key: str, body: str) -> CommentRef:
        """One comment per key, never the same content twice; see `reviews.comments`."""
        return self._comments.ensure(number, key, body)

    def mark_ready_for_review(self, pr_number: int) -> None:
        self._pulls.mark_ready(pr_number)

    def read_review(self, pr_number: int, review_id: int) -> ReviewFeedback:
        return self._feedback.read(pr_number, review_id)

    def request_review(self, pr_number: int, logins: list[str]) -> None:
        self._feedback.request_review(pr_number, logins)

    def get_pr(self, number: int) -> PullState:
        return self._pulls.state(number)

    def merge(self, pr_number: int, approved_sha: str, method: MergeMethod | None = None) -> MergeResult:
        """Merge only at `approved_sha`; refusals are statuses. `method` None: the first method the repository
        allows (merge, squash, rebase); see `reviews.pulls`."""
        return self._pulls.merge(pr_number, approved_sha, method)

    def add_labels(self, number: int, labels: list[str]) -> None:
        """Add labels to an issue or PR. Idempotent: GitHub keeps a label once however often it is added."""
        self._t.mutate(f"label #{number}", lambda: self._t.repo.get_issue(number).add_to_labels(*labels))

    def create_issue(self, title: str, body: str, labels: list[str] | None = None) -> int:
        """Open an issue (demo and test setup; not deduplicated) and return its number."""
        issue = self._t.mutate(
            "create issue", lambda: self._t.repo.create_issue(title=title, body=body, labels=labels or [])
        )
        return issue.number

    def create_webhook(self, url: str, secret: str, events: list[str]) -> int:
        """The repository hook delivering `events` to `url`: an existing hook for `url` is reused."""

        def existing() -> int | None:
            return next((h.id for h in self._t.repo.get_hooks() if h.config.get("url") == url), None)

        found = self._t.read("list hooks", existing)
        if found is not None:
            return found
        config = {"url": url, "content_type": "json", "secret": secret, "insecure_ssl": "0"}
        hook = self._t.mutate("create hook", lambda: self._t.repo.create_hook("web", config, events, active=True))
        return hook.id

    def footprint(self, run_id: str, issue_number: int | None) -> RunFootprint:
        """What the run left on the forge. Op ids and comment keys of a run start with `<run_id>:`;
        evidence comment keys with `<run_id>:evidence`; branches live under `durafix/<run>/`."""
        op_prefix = f"{run_id}:"
        tickets: list[str] = []
        evidence: list[int] = []
        pulls = self._pulls.list_by_run(run_id)
        if issue_number is not None:
            ours = self._t.our_comments(
                f"list tickets on #{issue_number}", issue_number, lambda body: _ticket_op(body).startswith(op_prefix)
            )
            tickets += [f"comment:{c.id}" for c in ours]
        ticket_claims = self._claims.list_claims(TICKET_CLAIMS, op_prefix)
        tickets += [c.record.result for c in ticket_claims if c.record.result.startswith("issue:")]
        for number in [*([issue_number] if issue_number is not None else []), *pulls]:
            evidence += [c.id for c in self._comments.list_keyed(number, f"{run_id}:evidence")]
        claims = [*ticket_claims, *self._claims.list_claims(COMMENT_CLAIMS, op_prefix)]
        return RunFootprint(
            run_id=run_id,
            tickets=tickets,
            pull_requests=pulls,
            evidence_comments=evidence,
            branches=self._branches.list(run_branch_prefix(run_id)),
            claims=[f"refs/{c.ref}" for c in claims],
        )


def _known_permission(login: str, answer: str) -> RepoPermission:
    for permission in REPO_PERMISSIONS:
        if answer == permission:
            return permission
    # Fail closed: a caller deciding access on an unknown value must not read it as some permission.
    raise ForgePermanentError(f"read permission of {login}: unknown permission {answer!r}", status=200)


def _ticket_op(body: str | None) -> str:
    marker = find_marker(body, TICKET)
    return marker.attrs.get("op", "") if marker else ""
