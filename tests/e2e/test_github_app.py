"""A run authenticated as a GitHub App, end to end: the worker and the receiver have no token, only the App's ID
and private key. The App is registered on the GitHub emulator and installed on the repositories' owner; its
installation tokens last 25 s, so several expire while the run goes from report to merge.

External truth: the ticket, the PR and the merge are the App's bot's (``SLUG[bot]``) on the forge, one of each;
the emulator issued more than one token and the first expired before the run ended; and no activity attempt
failed or timed out (a refused expired token would show as one).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from temporalio.api.enums.v1 import EventType

from infra import stack as local_stack
from infra.cli.demo import OWNER, ensure_user, issue_text
from pipeline import client as runs
from pipeline.config import DurafixConfig
from pipeline.ids import workflow_id_for
from pipeline.services import Services
from pipeline.state import Outcome
from tests.e2e.test_pipeline import awaiting_review, finished, state_when
from tests.support.e2e_stack import E2EStack, combined_model_script, running_e2e_stack

pytestmark = [pytest.mark.slow, pytest.mark.browser]

APP_ID = 31337
SLUG = "durafix-fixer"
BOT = f"{SLUG}[bot]"
TOKEN_LIFETIME_S = 25
PERMISSIONS = {"contents": "write", "pull_requests": "write", "issues": "write", "metadata": "read"}


def _admin(config: DurafixConfig, admin_token: str, method: str, path: str, body: Any = None) -> Any:
    answer = httpx.request(
        method, config.forge_api_url + path, json=body, headers={"Authorization": f"token {admin_token}"}, timeout=30
    )
    answer.raise_for_status()
    return answer.json()


def _as_app(state: Path) -> Any:
    """``configure`` for the stack: register the App with a fresh RSA key, install it on the owner (all
    repositories), and switch the worker from the token to the App."""

    def configure(config: DurafixConfig) -> None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = state / "github-app.pem"
        pem.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        pem.chmod(0o600)
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        admin = local_stack.read_stack(state).admin_token
        app = {"id": APP_ID, "slug": SLUG, "name": "durafix fixer", "public_key": public.decode()}
        _admin(config, admin, "POST", "/admin/apps", {**app, "token_lifetime_s": TOKEN_LIFETIME_S})
        ensure_user(config, admin, OWNER)  # the owner of every test repository, before any of them exists
        _admin(
            config, admin, "POST", f"/admin/apps/{SLUG}/installations", {"account": OWNER, "permissions": PERMISSIONS}
        )
        config.forge_token = ""
        config.github_app_id = APP_ID
        config.github_app_private_key_file = str(pem)

    return configure


@pytest.fixture
def app_stack(tmp_path: Path) -> Iterator[E2EStack]:
    state = tmp_path / "state"
    script = combined_model_script(tmp_path / "model-script.yaml")
    with running_e2e_stack(state, configure=_as_app(state), model_script=script) as e2e:
        e2e.spawn_worker()
        yield e2e


async def test_run_as_github_app_merges_with_expiring_tokens_and_no_failed_attempt(app_stack: E2EStack) -> None:
    stack = app_stack
    client = await runs.connect(stack.config)
    repository = stack.new_repository()
    owner = stack.github(stack.owner_token()).get_repo(repository)
    title, body = issue_text()
    issue = owner.create_issue(title=title, body=body, labels=[stack.config.trigger_label]).number
    wf = workflow_id_for(repository, issue)

    state = await state_when(client, wf, awaiting_review)
    assert state.pending_approval is not None, state.outcome_detail
    pr_number, head = state.pending_approval.pr_number, state.pending_approval.head_sha
    # The approval waits for the first installation token to expire, so the rest of the run (the merge) must
    # refresh it: a run quicker than the token's lifetime would otherwise never exercise the refresh.
    admin = local_stack.read_stack(stack.state_dir).admin_token
    issued = _admin(stack.config, admin, "GET", f"/admin/apps/{SLUG}/tokens")
    first = datetime.strptime(issued[0]["expires_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    await asyncio.sleep(max(0.0, first.timestamp() + 1 - time.time()))
    stack.approve_on_forge(repository, pr_number, head)
    final = await state_when(client, wf, finished)
    ended = time.time()
    assert final.outcome == Outcome.MERGED, final.outcome_detail

    pr = owner.get_pull(pr_number)
    assert pr.merged and pr.merge_commit_sha == final.merged_sha
    assert (pr.user.login, pr.user.type, pr.merged_by.login) == (BOT, "Bot", BOT)
    fp = Services(stack.config).forge(repository).footprint(wf, issue)
    assert len(fp.tickets) == 1 and fp.pull_requests == [pr_number] and len(fp.branches) == 1, fp
    kind, _, ticket_id = fp.tickets[0].partition(":")
    ticket = (
        owner.get_issue(issue).get_comment(int(ticket_id)) if kind == "comment" else owner.get_issue(int(ticket_id))
    )
    assert ticket.user.login == BOT

    tokens = _admin(stack.config, admin, "GET", f"/admin/apps/{SLUG}/tokens")
    assert len(tokens) > 1, tokens
    first_expiry = datetime.strptime(tokens[0]["expires_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert first_expiry.timestamp() < ended, "no installation token expired during the run"

    history = await client.get_workflow_handle(wf).fetch_history()
    names = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    failed = [
        names[e.activity_task_failed_event_attributes.scheduled_event_id]
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
        else names[e.activity_task_timed_out_event_attributes.scheduled_event_id]
        for e in history.events
        if e.event_type in (EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED, EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT)
    ]
    # Temporal records only an activity's last attempt: a retried one shows as a started attempt above 1.
    retried = [
        names[e.activity_task_started_event_attributes.scheduled_event_id]
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.attempt > 1
    ]
    assert any(name.startswith("forge.") for name in names.values())
    assert failed == [] and retried == [], (failed, retried)
