"""Forge steps check the run's tombstone: once ``env.cleanup_run`` ran, a late attempt writes nothing.

The activities are the ones a worker registers (``Services.forge_activities``), run as attempts of the run's
workflow (``ActivityEnvironment`` with the run's workflow ID) against the GitHub emulator over HTTP; the
tombstone is written by the real ``env.cleanup_run``. What is asserted is read back from the forge with
PyGithub: the PRs, branches, comments and ticket body before and after the late attempts.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from github.Repository import Repository
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from evidence.interface import ArtifactKind
from infra.forge.testing import ForgeHandle, running_forge
from infra.forge.testing import client as forge_client
from pipeline.activities.forge import ForgeActivities
from pipeline.config import DurafixConfig
from pipeline.services import Services
from pipeline.steps import (
    CleanupRunInput,
    EnsureCommentInput,
    EnsureDraftPrInput,
    EnsureTicketInput,
    MergeInput,
    MergeStatus,
    PublishBranchInput,
    ReadPullInput,
    RequestReviewInput,
    UpdateTicketInput,
)
from tests.support.forge import branch_with

OWNER = "acme"
BOT = "durafix-bot"
MAINTAINER = "maintainer"
BRANCH = "durafix/fix"


@dataclasses.dataclass
class Site:
    """One fresh repository with an issue, the bot's configuration and clients of the bot and a maintainer."""

    config: DurafixConfig
    services: Services
    repository: str
    issue: int
    bot: Repository
    maintainer: Repository

    @property
    def run_id(self) -> str:
        return f"repair:{self.repository}#{self.issue}"

    def attempt(self, fn: Callable[..., Any], inp: Any, run_id: str | None = None) -> Any:
        """One attempt of ``fn`` as a step of the run's workflow (``run_id``, else this site's run)."""
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, workflow_id=run_id or self.run_id)
        return env.run(fn, inp)

    @property
    def forge(self) -> ForgeActivities:
        return self.services.forge_activities()


@pytest.fixture(scope="module")
def handle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ForgeHandle, dict[str, str]]]:
    with running_forge(tmp_path_factory.mktemp("forge")) as forge:
        yield forge, {login: forge.create_user(login) for login in (OWNER, BOT, MAINTAINER)}


@pytest.fixture
def site(handle: tuple[ForgeHandle, dict[str, str]], tmp_path: Path) -> Site:
    forge, tokens = handle
    name = f"cart-{uuid.uuid4().hex[:8]}"
    repository = f"{OWNER}/{name}"
    forge.create_repo(tokens[OWNER], name, auto_init=True)
    for login in (BOT, MAINTAINER):
        forge.add_collaborator(tokens[OWNER], repository, login, "push")
    config = DurafixConfig(
        state_dir=tmp_path / "state",
        forge_api_url=forge.api_url,
        forge_git_base=forge.base_url,
        forge_token=tokens[BOT],
    )

    def repo(login: str) -> Repository:
        gh = forge_client(forge.api_url, tokens[login])
        return gh.get_repo(repository)

    issue = repo(MAINTAINER).create_issue(title="Total is wrong", body="The cart total ignores quantities.")
    return Site(config, Services(config), repository, issue.number, repo(BOT), repo(MAINTAINER))


def cleaned_up(site: Site) -> None:
    report = site.attempt(site.services.environment_activities().cleanup_run, CleanupRunInput(run_id=site.run_id))
    assert report.complete, report.errors


def refused(site: Site, fn: Callable[..., Any], inp: Any) -> ApplicationError:
    with pytest.raises(ApplicationError) as raised:
        site.attempt(fn, inp)
    assert raised.value.type == "Policy" and raised.value.non_retryable, raised.value
    assert "cleaned up" in str(raised.value)
    return raised.value


def ticket_input(site: Site, op_id: str, body: str) -> EnsureTicketInput:
    return EnsureTicketInput(op_id=op_id, repository=site.repository, issue_number=site.issue, title="t", body=body)


def draft_pr_input(site: Site) -> EnsureDraftPrInput:
    return EnsureDraftPrInput(
        op_id=f"{site.run_id}:pr",
        run_id=site.run_id,
        repository=site.repository,
        branch=BRANCH,
        base="main",
        title="Fix the total",
        body="The fix.",
    )


def forge_truth(site: Site) -> dict[str, Any]:
    """What the repository holds: its PRs (state, merged), branches, and every comment of the issue and PRs."""
    pulls = list(site.maintainer.get_pulls(state="all"))
    return {
        "pulls": sorted((p.number, p.state, p.merged) for p in pulls),
        "branches": sorted(b.name for b in site.maintainer.get_branches()),
        "comments": {
            n: [c.body for c in site.maintainer.get_issue(n).get_comments()]
            for n in [site.issue, *(p.number for p in pulls)]
        },
    }


def test_a_late_attempt_of_every_forge_write_after_cleanup_is_refused_and_the_forge_is_unchanged(site: Site) -> None:
    """The run's PR was merged and the run cleaned up; late attempts of each of its forge writes then act as a
    stale worker waking up would: every one is refused before it writes, and the forge reads the same."""
    forge = site.forge
    ticket = site.attempt(
        forge.ensure_ticket,
        ticket_input(site, f"{site.run_id}:ticket", "open"),
    )
    head = branch_with(site.bot, BRANCH, {"cart.py": "fixed = True\n"})
    pr = site.attempt(
        forge.ensure_draft_pr,
        draft_pr_input(site),
    )
    site.maintainer.get_pull(pr.number).create_review(commit=site.maintainer.get_commit(head), event="APPROVE")
    merge = MergeInput(op_id=f"{site.run_id}:merge:1", repository=site.repository, number=pr.number, approved_sha=head)
    assert site.attempt(forge.merge, merge).status == MergeStatus.MERGED
    cleaned_up(site)
    before = forge_truth(site)
    assert before["pulls"] == [(pr.number, "closed", True)]

    patch_ref = site.services.store.put_bytes(
        b"", kind=ArtifactKind.PATCH, run_id=site.run_id, name="candidate.patch", media_type="text/x-diff"
    )
    # A worker that never saw the cleanup: nothing but the tombstone tells it the run is over.
    late = Services(site.config).forge_activities()
    refused(
        site,
        late.ensure_ticket,
        ticket_input(site, f"{site.run_id}:ticket:2", "b"),
    )
    refused(
        site,
        late.update_ticket,
        UpdateTicketInput(
            repository=site.repository,
            issue_number=site.issue,
            comment_id=ticket.comment_id,
            op_id=f"{site.run_id}:ticket",
            body="stale: awaiting review",
        ),
    )
    refused(
        site,
        late.publish_branch,
        PublishBranchInput(
            op_id=f"{site.run_id}:push",
            run_id=site.run_id,
            repository=site.repository,
            clone_url=site.config.clone_url(site.repository),
            branch=f"{BRANCH}-again",
            base_revision=head,
            patch_ref=patch_ref,
            expected_commit=head,
            message="late",
            commit_timestamp=0,
        ),
    )
    # The adapter finds only an open PR for the branch; the run's is merged, so only the fence stops a second.
    refused(
        site,
        late.ensure_draft_pr,
        draft_pr_input(site),
    )
    refused(
        site,
        late.ensure_comment,
        EnsureCommentInput(
            repository=site.repository, number=pr.number, key=f"{site.run_id}:evidence:{head}", body="evidence"
        ),
    )
    refused(
        site,
        late.request_review,
        RequestReviewInput(repository=site.repository, number=pr.number, reviewers=[MAINTAINER]),
    )
    refused(site, late.merge, merge)

    assert forge_truth(site) == before
    # The late push was refused before its candidate was rebuilt: no workspace of the run exists.
    assert site.services.workspaces.list_owned(site.run_id) == []
    # Reads are not fenced: the reconciler and the run's own ending may still look.
    assert site.attempt(late.read_pr, ReadPullInput(repository=site.repository, number=pr.number)).merged


def test_the_runs_closing_ticket_update_is_the_one_write_after_cleanup(site: Site) -> None:
    forge = site.forge
    op_id = f"{site.run_id}:ticket"
    ticket = site.attempt(
        forge.ensure_ticket,
        ticket_input(site, op_id, "open"),
    )
    cleaned_up(site)

    def update(body: str, *, closing: bool) -> UpdateTicketInput:
        return UpdateTicketInput(
            repository=site.repository,
            issue_number=site.issue,
            comment_id=ticket.comment_id,
            op_id=op_id,
            body=body,
            closing=closing,
        )

    refused(site, forge.update_ticket, update("stale: verifying", closing=False))
    site.attempt(forge.update_ticket, update("merged; cleaned up", closing=True))
    # A stale retry of the closing update carries the same body: it edits nothing new.
    site.attempt(forge.update_ticket, update("merged; cleaned up", closing=True))

    [status] = [c for c in site.maintainer.get_issue(site.issue).get_comments()]
    assert "merged; cleaned up" in status.body and "stale" not in status.body


def test_the_fence_is_the_runs_own_another_run_on_the_repository_still_writes(site: Site) -> None:
    cleaned_up(site)
    other = f"repair:{site.repository}#{site.issue + 1000}"
    comment = site.attempt(
        site.forge.ensure_comment,
        EnsureCommentInput(repository=site.repository, number=site.issue, key=f"{other}:note", body="another run"),
        run_id=other,
    )
    assert comment.created
    assert [c.body for c in site.maintainer.get_issue(site.issue).get_comments()][-1].startswith("another run")
