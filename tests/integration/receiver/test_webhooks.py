"""``durafix serve`` (the webhook receiver) over real HTTP against the real Temporal dev server.

Deliveries are GitHub's own example payloads (``tests/infra/forge/data/webhook-examples``) with the repository,
issue, labels and review edited per test, signed like GitHub (``X-Hub-Signature-256``: HMAC-SHA256 of the
raw body). No worker runs unless a test needs the workflow to answer: a started run just waits, is checked
with ``describe`` and the started event in its history, and is terminated in teardown.

The receiver reads reviewers' permissions from the project's GitHub emulator, in which each test's
repository exists, owned by ``acme`` (admin), with the receiver's bot and GitHub's example reviewer
``Codertocat`` as write collaborators and ``reader`` as a read collaborator; ``stranger`` is a user with no
role on it.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from infra.forge.testing import ForgeHandle, running_forge
from pipeline.client import handle_for
from pipeline.config import DurafixConfig
from pipeline.receiver.webhooks import MAX_BODY, WebhookReceiver
from pipeline.state import Delivered, Phase, Rejection, RunState
from pipeline.steps import TaskQueue
from pipeline.workflow import WORKFLOWS, RepairBugWorkflow
from reviews.markers import pull_marker
from tests.support.run_history import started_input
from tests.support.security_harness import example, receiver, receiver_config, serving, sign

__all__ = ["receiver"]  # a fixture of the harness, on this module's own config

TRIGGER = "durafix"
OWNER = "acme"
BOT = "durafix-bot"
WRITER = "Codertocat"  # the reviewer of GitHub's example payload
READER = "reader"
STRANGER = "stranger"
# What a decision sent to a run leaves in its history: a signal (reject) or an Update (approve).
DECISION_EVENTS = (
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ADMITTED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED,
)


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]


def post(
    url: str,
    event: str,
    body: bytes,
    signature: str | None,
    *,
    declared_length: int | None = None,
    send_body: bool = True,
) -> Answer:
    """One delivery as GitHub makes it: POST with event, delivery ID and signature headers."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        conn.putrequest("POST", parts.path)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("User-Agent", "GitHub-Hookshot/durafix-test")
        conn.putheader("X-GitHub-Event", event)
        conn.putheader("X-GitHub-Delivery", str(uuid.uuid4()))
        if signature is not None:
            conn.putheader("X-Hub-Signature-256", signature)
        conn.putheader("Content-Length", str(len(body) if declared_length is None else declared_length))
        conn.endheaders(body if send_body else None)
        resp = conn.getresponse()
        raw = resp.read()
        return Answer(resp.status, json.loads(raw) if raw else {})
    finally:
        conn.close()


@dataclass
class Hook:
    """A receiver under test plus one fresh repository name, and the runs a test may have started."""

    url: str
    secret: str
    client: Client
    repository: str = field(default_factory=lambda: f"acme/shop-{uuid.uuid4().hex[:10]}")
    touched: set[str] = field(default_factory=set)

    def run_id(self, issue: int, repository: str | None = None) -> str:
        workflow_id = f"repair:{repository or self.repository}#{issue}"
        self.touched.add(workflow_id)
        return workflow_id

    async def deliver(self, event: str, payload: dict[str, Any] | bytes, *, secret: str | None = None) -> Answer:
        """Sign with the receiver's secret (or ``secret``) and post off the test's event loop, which a
        worker in the same test may need while the receiver waits on Temporal."""
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return await asyncio.to_thread(post, self.url, event, body, sign(secret or self.secret, body))

    async def deliver_raw(self, event: str, body: bytes, signature: str | None, **kwargs: Any) -> Answer:
        return await asyncio.to_thread(post, self.url, event, body, signature, **kwargs)

    def with_repository(self, payload: dict[str, Any], repository: str | None = None) -> dict[str, Any]:
        owner, name = (repository or self.repository).split("/")
        repo = payload["repository"]
        repo["full_name"], repo["name"] = f"{owner}/{name}", name
        repo["owner"]["login"] = owner
        return payload

    def issue_event(
        self, action: str, number: int, labels: list[str], label: str | None = None, repository: str | None = None
    ) -> dict[str, Any]:
        payload = self.with_repository(example("issues", action), repository)
        template = payload["issue"]["labels"][0]
        payload["issue"]["number"] = number
        payload["issue"]["labels"] = [{**template, "name": name} for name in labels]
        if label is not None:
            payload["label"] = {**payload["label"], "name": label}
        return payload

    def review_event(
        self, state: str, pr_body: str, repository: str | None = None, reviewer: str = WRITER
    ) -> dict[str, Any]:
        payload = self.with_repository(example("pull_request_review", "submitted"), repository)
        payload["review"].update(state=state, id=secrets.randbelow(10**9), commit_id="0" * 40, body="looks wrong")
        payload["review"]["user"]["login"] = payload["sender"]["login"] = reviewer
        payload["pull_request"]["body"] = pr_body
        # durafix's PRs are opened by its bot; the receiver ignores reviews of anyone else's.
        payload["pull_request"]["user"]["login"] = BOT
        return payload

    async def started_run(self, issue: int) -> str:
        """Start the run for ``issue`` through the receiver; returns a PR body carrying the run's marker."""
        workflow_id = self.run_id(issue)
        start = await self.deliver("issues", self.issue_event("labeled", issue, [TRIGGER], TRIGGER))
        assert start.status == 202 and start.body["workflow_id"] == workflow_id, start
        return f"Fix for #{issue}\n\n{pull_marker(workflow_id).render()}"


@dataclass(frozen=True)
class Forge:
    """The emulator the receiver reads permissions from, with the tokens of the owner and the bot."""

    handle: ForgeHandle
    owner_token: str
    bot_token: str

    def create_repository(self, full_name: str) -> None:
        owner, name = full_name.split("/")
        assert owner == OWNER, full_name
        self.handle.create_repo(self.owner_token, name, auto_init=False)
        for login, permission in ((BOT, "push"), (WRITER, "push"), (READER, "pull")):
            self.handle.add_collaborator(self.owner_token, full_name, login, permission)


async def describe_status(client: Client, workflow_id: str) -> WorkflowExecutionStatus | None:
    """The run's status, or None when Temporal has never heard of it."""
    try:
        desc = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return desc.status


async def state_once_running(client: Client, workflow_id: str, timeout_s: float = 20) -> RunState:
    """The run's state as soon as a worker has run its first workflow task (a query cannot be answered before)."""
    handle = handle_for(client, workflow_id)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            return await handle.query(RepairBugWorkflow.state)
        except RPCError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


async def events_of(client: Client, workflow_id: str, *event_types: int) -> list[Any]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [ev for ev in history.events if ev.event_type in event_types]


async def rejections(client: Client, workflow_id: str) -> list[Rejection]:
    """Every rejection sent to the run (a ``reject`` signal, or a delivery of one: the ``deliver`` Update the
    run accepted), decoded from its history."""
    found: list[Rejection] = []
    for event in await events_of(
        client,
        workflow_id,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
    ):
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            attrs = event.workflow_execution_signaled_event_attributes
            assert attrs.signal_name == "reject"
            found += await client.data_converter.decode(attrs.input.payloads, [Rejection])
            continue
        request = event.workflow_execution_update_accepted_event_attributes.accepted_request.input
        assert request.name == "deliver"
        [delivered] = await client.data_converter.decode(request.args.payloads, [Delivered])
        if delivered.rejection is not None:
            found.append(delivered.rejection)
    return found


@asynccontextmanager
async def workflows_running(client: Client) -> AsyncIterator[None]:
    """The workflow worker alone: runs stay in intake (no activity worker), and answer Updates and queries."""
    async with Worker(client, task_queue=TaskQueue.ORCHESTRATION.value, workflows=list(WORKFLOWS)):
        yield


@pytest.fixture(scope="module")
def forge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forge]:
    with running_forge(tmp_path_factory.mktemp("forge")) as handle:
        owner_token = handle.create_user(OWNER)
        bot_token = handle.create_user(BOT)
        for login in (WRITER, READER, STRANGER):
            handle.create_user(login)
        yield Forge(handle, owner_token, bot_token)


@pytest.fixture(scope="module")
def config(temporal_env: WorkflowEnvironment, forge: Forge, tmp_path_factory: pytest.TempPathFactory) -> DurafixConfig:
    return receiver_config(temporal_env, forge.handle, forge.bot_token, tmp_path_factory.mktemp("webhooks"))


@asynccontextmanager
async def hooked(
    receiver: WebhookReceiver, forge: Forge, client: Client, runs: Callable[[Hook], Awaitable[Iterable[str]]], why: str
) -> AsyncIterator[Hook]:
    """A :class:`Hook` on a fresh repository of the forge; afterwards, those of its ``runs`` still running are
    terminated, saying ``why``."""
    h = Hook(url=receiver.url, secret=receiver.config.webhook_secret, client=client)
    forge.create_repository(h.repository)
    try:
        yield h
    finally:
        for workflow_id in await runs(h):
            if await describe_status(client, workflow_id) == WorkflowExecutionStatus.RUNNING:
                await client.get_workflow_handle(workflow_id).terminate(why)


async def touched_runs(h: Hook) -> set[str]:
    return h.touched


@pytest.fixture
async def hook(receiver: WebhookReceiver, forge: Forge, temporal_client: Client) -> AsyncIterator[Hook]:
    async with hooked(receiver, forge, temporal_client, touched_runs, "webhook test over") as h:
        yield h


# ---- signatures and malformed deliveries ------------------------------------------------------------


async def test_delivery_signed_with_another_secret_is_refused_and_starts_nothing(hook: Hook) -> None:
    answer = await hook.deliver("issues", hook.issue_event("labeled", 1, [TRIGGER], TRIGGER), secret="not-it")
    assert answer.status == 401, answer
    assert await describe_status(hook.client, hook.run_id(1)) is None


async def test_delivery_without_signature_is_refused_and_starts_nothing(hook: Hook) -> None:
    body = json.dumps(hook.issue_event("labeled", 2, [TRIGGER], TRIGGER)).encode()
    answer = await hook.deliver_raw("issues", body, None)
    assert answer.status == 401, answer
    assert await describe_status(hook.client, hook.run_id(2)) is None


async def test_body_altered_after_signing_is_refused_and_starts_nothing(hook: Hook) -> None:
    signed = json.dumps(hook.issue_event("labeled", 3, [], "bug")).encode()
    altered = json.dumps(hook.issue_event("labeled", 3, [TRIGGER], TRIGGER)).encode()
    answer = await hook.deliver_raw("issues", altered, sign(hook.secret, signed))
    assert answer.status == 401, answer
    assert await describe_status(hook.client, hook.run_id(3)) is None


async def test_signature_with_non_ascii_characters_is_refused_with_401(hook: Hook) -> None:
    body = json.dumps(hook.issue_event("labeled", 4, [TRIGGER], TRIGGER)).encode()
    answer = await hook.deliver_raw("issues", body, "sha256=" + "\u00e9" * 64)
    assert answer.status == 401, answer
    assert await describe_status(hook.client, hook.run_id(4)) is None


async def test_ping_is_answered(hook: Hook) -> None:
    answer = await hook.deliver("ping", example("ping"))
    assert answer.status == 200, answer
    assert answer.body == {"message": "pong"}


async def test_signed_malformed_json_is_a_bad_request(hook: Hook) -> None:
    answer = await hook.deliver("issues", b'{"action": "labeled", "issue": ')
    assert answer.status == 400, answer
    assert answer.body["message"] == "malformed JSON"


async def test_signed_json_that_is_not_an_object_is_a_bad_request(hook: Hook) -> None:
    answer = await hook.deliver("issues", b"[]")
    assert answer.status == 400, answer


async def test_oversized_delivery_is_refused_from_its_declared_length(hook: Hook) -> None:
    # Only the headers are sent: the receiver must refuse before reading (and buffering) the body, and a
    # server closing a socket with unread data resets it, which would hide the answer from this client.
    answer = await hook.deliver_raw("issues", b"", "sha256=" + "0" * 64, declared_length=MAX_BODY + 1, send_body=False)
    assert answer.status == 413, answer


# ---- issues: starting and attaching -----------------------------------------------------------------


async def test_issue_labelled_with_the_trigger_label_starts_the_run_for_that_issue(hook: Hook) -> None:
    workflow_id = hook.run_id(7)
    answer = await hook.deliver("issues", hook.issue_event("labeled", 7, ["bug", TRIGGER], TRIGGER))
    assert answer.status == 202, answer
    assert answer.body["workflow_id"] == workflow_id
    assert answer.body["attached"] is False

    desc = await hook.client.get_workflow_handle(workflow_id).describe()
    assert desc.status == WorkflowExecutionStatus.RUNNING
    assert desc.run_id == answer.body["run_id"]
    assert desc.workflow_type == "repair_bug"
    assert desc.task_queue == TaskQueue.ORCHESTRATION.value
    inp = await started_input(hook.client, workflow_id)
    assert (inp.repository, inp.issue_number) == (hook.repository, 7)
    assert inp.trigger.startswith("webhook:")


async def test_second_delivery_for_the_same_issue_attaches_to_the_running_run(hook: Hook) -> None:
    workflow_id = hook.run_id(8)
    first = await hook.deliver("issues", hook.issue_event("labeled", 8, [TRIGGER], TRIGGER))
    again = await hook.deliver("issues", hook.issue_event("labeled", 8, [TRIGGER], TRIGGER))
    assert first.status == again.status == 202, (first, again)
    assert first.body["attached"] is False
    assert {k: again.body[k] for k in ("workflow_id", "run_id", "attached")} == {
        "workflow_id": workflow_id,
        "run_id": first.body["run_id"],
        "attached": True,
    }
    desc = await hook.client.get_workflow_handle(workflow_id).describe()
    assert desc.run_id == first.body["run_id"]


async def test_issue_labelled_with_another_label_is_ignored(hook: Hook) -> None:
    # GitHub's example as it is: the "bug" label was added.
    answer = await hook.deliver("issues", hook.issue_event("labeled", 9, ["bug"], "bug"))
    assert answer.status == 202, answer
    assert "ignored" in answer.body["message"]
    assert "workflow_id" not in answer.body
    assert await describe_status(hook.client, hook.run_id(9)) is None


async def test_issue_opened_already_carrying_the_trigger_label_starts_the_run(hook: Hook) -> None:
    workflow_id = hook.run_id(10)
    answer = await hook.deliver("issues", hook.issue_event("opened", 10, ["bug", TRIGGER]))
    assert answer.status == 202, answer
    assert answer.body["workflow_id"] == workflow_id and answer.body["attached"] is False
    assert await describe_status(hook.client, workflow_id) == WorkflowExecutionStatus.RUNNING


async def test_issue_opened_without_the_trigger_label_is_ignored(hook: Hook) -> None:
    answer = await hook.deliver("issues", hook.issue_event("opened", 11, ["bug"]))
    assert answer.status == 202, answer
    assert "ignored" in answer.body["message"]
    assert await describe_status(hook.client, hook.run_id(11)) is None


# ---- pull request reviews -----------------------------------------------------------------------------


async def test_review_of_a_pr_without_the_durafix_marker_is_ignored(hook: Hook) -> None:
    # GitHub's example PR body, which carries no durafix marker.
    payload = hook.review_event("approved", example("pull_request_review", "submitted")["pull_request"]["body"])
    answer = await hook.deliver("pull_request_review", payload)
    assert answer.status == 202, answer
    assert "ignored" in answer.body["message"]


async def test_review_whose_marker_names_another_repositorys_run_is_forbidden(hook: Hook, forge: Forge) -> None:
    foreign = f"acme/elsewhere-{uuid.uuid4().hex[:6]}"
    forge.create_repository(foreign)
    foreign_run = hook.run_id(1, foreign)
    start = await hook.deliver("issues", hook.issue_event("labeled", 1, [TRIGGER], TRIGGER, foreign))
    assert start.status == 202 and start.body["workflow_id"] == foreign_run, start

    body = f"Fixes the cart total.\n\n{pull_marker(foreign_run).render()}"
    answer = await hook.deliver("pull_request_review", hook.review_event("approved", body))
    assert answer.status == 403, answer
    assert foreign_run in answer.body["message"]
    updates = await events_of(hook.client, foreign_run, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED)
    assert updates == []


async def test_changes_requested_review_by_a_writer_sends_a_request_for_changes_to_the_run(hook: Hook) -> None:
    async with workflows_running(hook.client):
        body = await hook.started_run(12)
        event = hook.review_event("changes_requested", body)
        answer = await hook.deliver("pull_request_review", event)
        assert answer.status == 200, answer
        assert answer.body["workflow_id"] == hook.run_id(12)
    review = event["review"]
    assert await rejections(hook.client, hook.run_id(12)) == [
        Rejection(
            reviewer=WRITER,
            reason="looks wrong",
            source="webhook",
            pr_number=2,
            changes_requested=True,
            review_id=str(review["id"]),
            head_sha="0" * 40,
        )
    ]


async def test_closing_durafix_pr_without_merging_rejects_the_run(hook: Hook) -> None:
    async with workflows_running(hook.client):
        body = await hook.started_run(14)
        closed = hook.with_repository(example("pull_request", "closed"), None)
        closed["pull_request"].update(body=body, merged=False, number=5)
        closed["pull_request"]["user"]["login"] = BOT
        closed["sender"]["login"] = WRITER
        answer = await hook.deliver("pull_request", closed)
        assert answer.status == 200, answer
    assert await rejections(hook.client, hook.run_id(14)) == [
        Rejection(reviewer=WRITER, reason="the PR was closed without merging", source="webhook", pr_number=5)
    ]
    merged = hook.with_repository(example("pull_request", "closed"), None)
    merged["pull_request"].update(body=body, merged=True, number=5)
    merged["pull_request"]["user"]["login"] = BOT
    assert (await hook.deliver("pull_request", merged)).status == 202


async def test_approval_for_a_run_not_awaiting_review_is_refused_with_the_validators_reason(
    hook: Hook, temporal_client: Client
) -> None:
    # Only the workflow itself runs (no activity worker), so the run stays in intake; its approve
    # validator is what refuses, and a refused Update never enters the history.
    workflow_id = hook.run_id(13)
    async with Worker(temporal_client, task_queue=TaskQueue.ORCHESTRATION.value, workflows=list(WORKFLOWS)):
        body = await hook.started_run(13)
        state = await state_once_running(temporal_client, workflow_id)
        assert state.phase == Phase.INTAKE

        # Codertocat has write permission: the approval passes the receiver and reaches the run.
        answer = await hook.deliver("pull_request_review", hook.review_event("approved", body))
    assert answer.status == 409, answer
    assert answer.body["workflow_id"] == workflow_id
    assert answer.body["message"].startswith("approval refused:")
    assert "run is not awaiting review (phase intake)" in answer.body["message"]
    updates = await events_of(temporal_client, workflow_id, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED)
    assert updates == []


async def test_signed_payload_missing_what_its_event_carries_is_a_bad_request(hook: Hook) -> None:
    payload = hook.issue_event("labeled", 5, [TRIGGER], TRIGGER)
    del payload["repository"]
    answer = await hook.deliver("issues", payload)
    assert answer.status == 400, answer
    assert "repository" in answer.body["message"]


async def test_approval_for_a_run_that_does_not_exist_is_not_found(hook: Hook) -> None:
    missing = hook.run_id(987654)
    body = f"Fixes the cart total.\n\n{pull_marker(missing).render()}"
    answer = await hook.deliver("pull_request_review", hook.review_event("approved", body))
    assert answer.status == 404, answer


# ---- who may decide: the reviewer's permission on the repository ------------------------------------


async def test_reader_can_neither_approve_nor_request_changes(hook: Hook, temporal_client: Client) -> None:
    # The workflow runs, so an approval let through would reach its validator (409) and a rejection would
    # be a delivery in its history; the writer's rejection at the end shows that history does record one.
    workflow_id = hook.run_id(20)
    async with Worker(temporal_client, task_queue=TaskQueue.ORCHESTRATION.value, workflows=list(WORKFLOWS)):
        body = await hook.started_run(20)
        await state_once_running(temporal_client, workflow_id)
        for state in ("approved", "changes_requested"):
            answer = await hook.deliver("pull_request_review", hook.review_event(state, body, reviewer=READER))
            assert answer.status == 403, (state, answer)
            assert answer.body["reviewer"] == READER
            assert (answer.body["permission"], answer.body["required"]) == ("read", "write")
            assert answer.body["message"] == (
                f"{READER} has read permission on {hook.repository}; approving or requesting changes on a "
                "durafix PR requires write or more"
            )
        assert await events_of(temporal_client, workflow_id, *DECISION_EVENTS) == []

        answer = await hook.deliver("pull_request_review", hook.review_event("changes_requested", body))
    assert answer.status == 200, answer
    assert [r.reviewer for r in await rejections(temporal_client, workflow_id)] == [WRITER]


@pytest.mark.parametrize("state", ["approved", "changes_requested"])
async def test_user_who_is_not_a_collaborator_is_refused(hook: Hook, state: str) -> None:
    body = await hook.started_run(21)
    answer = await hook.deliver("pull_request_review", hook.review_event(state, body, reviewer=STRANGER))
    assert answer.status == 403, answer
    assert (answer.body["reviewer"], answer.body["permission"]) == (STRANGER, "none")
    assert STRANGER in answer.body["message"] and "requires write" in answer.body["message"]
    assert await events_of(hook.client, hook.run_id(21), *DECISION_EVENTS) == []


async def test_commented_review_is_ignored_without_asking_who_wrote_it(hook: Hook) -> None:
    body = await hook.started_run(22)
    answer = await hook.deliver("pull_request_review", hook.review_event("commented", body, reviewer=STRANGER))
    assert answer.status == 202, answer
    assert answer.body["message"] == "review state commented: ignored"


async def test_unavailable_forge_is_503_and_nothing_reaches_the_run(hook: Hook, forge: Forge) -> None:
    async with workflows_running(hook.client):
        body = await hook.started_run(23)
        forge.handle.set_faults(
            {
                "method": "GET",
                "path_regex": rf"/repos/{hook.repository}/collaborators/{WRITER}/permission$",
                "action": "status",
                "status": 503,
            }
        )
        refused = await hook.deliver("pull_request_review", hook.review_event("changes_requested", body))
        assert refused.status == 503, refused
        assert refused.body["message"].startswith("forge unavailable: ")
        assert await events_of(hook.client, hook.run_id(23), *DECISION_EVENTS) == []

        # The fault fired once: redelivering the same review succeeds, as the hook-delivery API would.
        assert forge.handle.faults() == []
        again = await hook.deliver("pull_request_review", hook.review_event("changes_requested", body))
        assert again.status == 200, again
    assert [r.reviewer for r in await rejections(hook.client, hook.run_id(23))] == [WRITER]


async def test_reviewer_the_forge_does_not_know_is_422_and_nothing_reaches_the_run(hook: Hook) -> None:
    body = await hook.started_run(24)
    answer = await hook.deliver("pull_request_review", hook.review_event("changes_requested", body, reviewer="ghost"))
    assert answer.status == 422, answer
    assert "HTTP 404" in answer.body["message"]
    assert await events_of(hook.client, hook.run_id(24), *DECISION_EVENTS) == []


async def test_receiver_without_a_forge_token_refuses_decisions_with_500(hook: Hook, config: DurafixConfig) -> None:
    body = await hook.started_run(25)
    with serving(config.model_copy(update={"forge_token": ""})) as tokenless:
        target = Hook(url=tokenless.url, secret=hook.secret, client=hook.client, repository=hook.repository)
        answer = await target.deliver("pull_request_review", target.review_event("changes_requested", body))
    assert answer.status == 500, answer
    assert answer.body["message"].startswith("no forge token or GitHub App configured: ")
    assert await events_of(hook.client, hook.run_id(25), *DECISION_EVENTS) == []


async def test_receiver_requiring_admin_refuses_a_writer_and_takes_the_owners_decision(
    hook: Hook, config: DurafixConfig
) -> None:
    async with workflows_running(hook.client):
        body = await hook.started_run(26)
        with serving(config.model_copy(update={"approver_permission": "admin"})) as strict:
            target = Hook(url=strict.url, secret=hook.secret, client=hook.client, repository=hook.repository)
            refused = await target.deliver("pull_request_review", target.review_event("changes_requested", body))
            taken = await target.deliver(
                "pull_request_review", target.review_event("changes_requested", body, reviewer=OWNER)
            )
    assert refused.status == 403, refused
    assert (refused.body["permission"], refused.body["required"]) == ("write", "admin")
    assert taken.status == 200, taken
    assert [r.reviewer for r in await rejections(hook.client, hook.run_id(26))] == [OWNER]
