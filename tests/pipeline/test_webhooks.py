"""``durafix serve`` (the webhook receiver) over real HTTP against the real Temporal dev server.

Deliveries are GitHub's own example payloads (``tests/forge/data/webhook-examples``) with the repository,
issue, labels and review edited per test, signed like GitHub (``X-Hub-Signature-256``: HMAC-SHA256 of the
raw body). No worker runs unless a test needs the workflow to answer: a started run just waits, is checked
with ``describe`` and the started event in its history, and is terminated in teardown.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import hmac
import http.client
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from pipeline.config import DurafixConfig
from pipeline.inputs import RepairInput
from pipeline.state import Phase, Rejection, RunState
from pipeline.steps import TaskQueue
from pipeline.webhooks import MAX_BODY, WebhookReceiver
from pipeline.workflow import RepairBugWorkflow
from reviews.markers import pull_marker

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[1] / "forge" / "data" / "webhook-examples"
TRIGGER = "durafix"


def example(event: str, action: str | None = None) -> dict[str, Any]:
    """A fresh copy of GitHub's example payload for ``event`` (and ``action``)."""
    name = f"{action}.payload.json" if action else "payload.json"
    payload: dict[str, Any] = json.loads((EXAMPLES / event / name).read_text())
    return copy.deepcopy(payload)


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


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

    def review_event(self, state: str, pr_body: str, repository: str | None = None) -> dict[str, Any]:
        payload = self.with_repository(example("pull_request_review", "submitted"), repository)
        payload["review"].update(state=state, id=secrets.randbelow(10**9), commit_id="0" * 40, body="looks wrong")
        payload["pull_request"]["body"] = pr_body
        return payload


async def describe_status(client: Client, workflow_id: str) -> WorkflowExecutionStatus | None:
    """The run's status, or None when Temporal has never heard of it."""
    try:
        desc = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return desc.status


async def started_input(client: Client, workflow_id: str) -> RepairInput:
    """The input the run was started with, read back from its history."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    attrs = history.events[0].workflow_execution_started_event_attributes
    [inp] = await client.data_converter.decode(attrs.input.payloads, [RepairInput])
    assert isinstance(inp, RepairInput)
    return inp


async def state_once_running(client: Client, workflow_id: str, timeout_s: float = 20) -> RunState:
    """The run's state as soon as a worker has run its first workflow task (a query cannot be answered before)."""
    handle = client.get_workflow_handle(workflow_id)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            state: RunState = await handle.query("state", result_type=RunState)
            return state
        except RPCError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


async def events_of(client: Client, workflow_id: str, event_type: int) -> list[Any]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [ev for ev in history.events if ev.event_type == event_type]


@pytest.fixture(scope="module")
def receiver(temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookReceiver]:
    config = DurafixConfig(
        state_dir=tmp_path_factory.mktemp("webhooks"),
        temporal_address=temporal_env.client.service_client.config.target_host,
        webhook_secret=secrets.token_hex(16),
        trigger_label=TRIGGER,
    )
    rec = WebhookReceiver(config, "127.0.0.1", 0)
    rec.start()
    try:
        yield rec
    finally:
        rec.stop()


@pytest.fixture
async def hook(receiver: WebhookReceiver, temporal_client: Client) -> AsyncIterator[Hook]:
    h = Hook(url=receiver.url, secret=receiver.config.webhook_secret, client=temporal_client)
    try:
        yield h
    finally:
        for workflow_id in h.touched:
            if await describe_status(temporal_client, workflow_id) == WorkflowExecutionStatus.RUNNING:
                await temporal_client.get_workflow_handle(workflow_id).terminate("webhook test over")


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
    assert again.body == {"workflow_id": workflow_id, "run_id": first.body["run_id"], "attached": True}
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


async def test_review_whose_marker_names_another_repositorys_run_is_forbidden(hook: Hook) -> None:
    foreign = f"acme/elsewhere-{uuid.uuid4().hex[:6]}"
    foreign_run = hook.run_id(1, foreign)
    start = await hook.deliver("issues", hook.issue_event("labeled", 1, [TRIGGER], TRIGGER, foreign))
    assert start.status == 202 and start.body["workflow_id"] == foreign_run, start

    body = f"Fixes the cart total.\n\n{pull_marker(foreign_run).render()}"
    answer = await hook.deliver("pull_request_review", hook.review_event("approved", body))
    assert answer.status == 403, answer
    assert foreign_run in answer.body["message"]
    updates = await events_of(hook.client, foreign_run, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED)
    assert updates == []


async def test_changes_requested_review_sends_the_rejection_to_the_run(hook: Hook) -> None:
    workflow_id = hook.run_id(12)
    start = await hook.deliver("issues", hook.issue_event("labeled", 12, [TRIGGER], TRIGGER))
    assert start.status == 202, start
    body = f"Fix for #12\n\n{pull_marker(workflow_id).render()}"
    answer = await hook.deliver("pull_request_review", hook.review_event("changes_requested", body))
    assert answer.status == 200, answer
    assert answer.body["workflow_id"] == workflow_id

    [signal] = await events_of(hook.client, workflow_id, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
    attrs = signal.workflow_execution_signaled_event_attributes
    assert attrs.signal_name == "reject"
    [rejection] = await hook.client.data_converter.decode(attrs.input.payloads, [Rejection])
    assert rejection == Rejection(reviewer="Codertocat", reason="looks wrong", source="webhook")


async def test_approval_for_a_run_not_awaiting_review_is_refused_with_the_validators_reason(
    hook: Hook, temporal_client: Client
) -> None:
    # Only the workflow itself runs (no activity worker), so the run stays in intake; its approve
    # validator is what refuses, and a refused Update never enters the history.
    workflow_id = hook.run_id(13)
    async with Worker(temporal_client, task_queue=TaskQueue.ORCHESTRATION.value, workflows=[RepairBugWorkflow]):
        start = await hook.deliver("issues", hook.issue_event("labeled", 13, [TRIGGER], TRIGGER))
        assert start.status == 202, start
        state = await state_once_running(temporal_client, workflow_id)
        assert state.phase == Phase.INTAKE

        body = f"Fix for #13\n\n{pull_marker(workflow_id).render()}"
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
