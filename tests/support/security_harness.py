"""A receiver wired to the project's GitHub emulator and the real Temporal dev server, for the trust tests.

Each test gets a fresh repository owned by ``acme`` (admin) with ``durafix-bot`` (the receiver's and the
workers' token, push), ``maintainer`` (push), ``triager`` (triage) and ``reader`` (read) as collaborators;
``outsider`` has no role. The repository's webhook points at the receiver with its secret, so the deliveries
the tests act on are the emulator's own, signed like GitHub's. A crafted delivery (``Site.deliver``) is used
only for what the emulator refuses to do itself (an outsider cannot add a label on it, as on GitHub) but a
forge can still send: a label added through an issue form, a review by an account the receiver must ignore.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import http.client
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from github import Auth, Github
from github.Issue import Issue
from github.Repository import Repository
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from infra.forge.testing import ForgeHandle, running_forge
from pipeline.config import DurafixConfig
from pipeline.inputs import RepairInput
from pipeline.ops import forge_setup
from pipeline.receiver.webhooks import WebhookReceiver
from pipeline.services import Services
from pipeline.steps import TaskQueue
from pipeline.workflow import WORKFLOWS
from tests.support.forge_logins import BOT, MAINTAINER, OUTSIDER, OWNER, READER, ROLES, TRIAGER, TRIGGER
from tests.support.run_history import started_input
from tests.support.stamps import stamped_now
from tests.support.waiting import eventually as eventually  # the harness's tests wait with it

EXAMPLES = Path(__file__).resolve().parents[1] / "infra" / "forge" / "data" / "webhook-examples"
# What a decision sent to a run leaves in its history: a signal (reject, withdraw) or an Update (approve).
DECISION_EVENTS = (
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ADMITTED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
)


def example(event: str, action: str | None = None) -> dict[str, Any]:
    """GitHub's own example payload for ``event`` (and ``action``; a fresh copy), stamped as happening now."""
    name = f"{action}.payload.json" if action else "payload.json"
    payload: dict[str, Any] = json.loads((EXAMPLES / event / name).read_text())
    return stamped_now(payload)


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def post(url: str, event: str, body: bytes, signature: str) -> tuple[int, dict[str, Any]]:
    """A delivery of ``event`` with a fresh GUID, signed with ``signature``: the status and the JSON answer."""
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": signature,
    }
    return post_raw(url, body, headers)


def post_raw(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """``body`` POSTed to ``url`` with exactly ``headers``: the status and the JSON answer."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        conn.request("POST", parts.path, body=body, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else {}
    finally:
        conn.close()


@dataclass
class Forge:
    handle: ForgeHandle
    tokens: dict[str, str]

    def github(self, login: str) -> Github:
        return Github(
            base_url=self.handle.api_url,
            auth=Auth.Token(self.tokens[login]),
            retry=None,
            seconds_between_requests=None,
            seconds_between_writes=None,
        )

    def repo(self, login: str, full_name: str) -> Repository:
        return self.github(login).get_repo(full_name)


@dataclass
class Site:
    """One fresh repository on the forge, hooked to the receiver, and the runs its tests started."""

    forge: Forge
    config: DurafixConfig
    receiver_url: str
    client: Client
    repository: str
    touched: set[str] = field(default_factory=set)

    def repo(self, login: str = MAINTAINER) -> Repository:
        return self.forge.repo(login, self.repository)

    def run_id(self, issue: int) -> str:
        workflow_id = f"repair:{self.repository}#{issue}"
        self.touched.add(workflow_id)
        return workflow_id

    async def deliver(self, event: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """A delivery signed with the hook's secret, posted off the event loop (a worker may need it)."""
        body = json.dumps(payload).encode()
        return await asyncio.to_thread(post, self.receiver_url, event, body, sign(self.config.webhook_secret, body))

    def repository_payload(self) -> dict[str, Any]:
        """The repository as the forge's own deliveries carry it."""
        owner, name = self.repository.split("/")
        repo = example("issues", "labeled")["repository"]
        repo.update(full_name=self.repository, name=name)
        repo["owner"]["login"] = owner
        return dict(repo)

    def deliveries(self, event: str, action: str | None = None) -> list[dict[str, Any]]:
        """The emulator's deliveries of ``event`` (and ``action``) for this repository, once all are sent."""
        found = []
        for d in self.forge.handle.wait_for_deliveries():
            payload = json.loads(d["request"]["body"])
            if d["event"] != event or not isinstance(payload, dict):
                continue
            if (payload.get("repository") or {}).get("full_name") != self.repository:
                continue
            if action is None or payload.get("action") == action:
                found.append(d)
        return found

    def fail_role_reads(self, login: str, count: int) -> None:
        """The forge answers 503 to the next ``count`` reads of ``login``'s permission on this repository."""
        self.forge.handle.set_faults(
            {
                "method": "GET",
                "path_regex": rf"/repos/{self.repository}/collaborators/{login}/permission$",
                "action": "status",
                "status": 503,
                "count": count,
            }
        )

    async def status(self, workflow_id: str) -> WorkflowExecutionStatus | None:
        try:
            desc = await self.client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        return desc.status

    async def started_input(self, workflow_id: str) -> RepairInput:
        return await started_input(self.client, workflow_id)

    async def events(self, workflow_id: str, *types: int) -> list[Any]:
        history = await self.client.get_workflow_handle(workflow_id).fetch_history()
        return [ev for ev in history.events if ev.event_type in types]

    def labelled_run(
        self, labeller: str = TRIAGER, title: str = "Total is wrong", body: str = "see title"
    ) -> tuple[Issue, str, dict[str, Any]]:
        """An outsider's issue ``labeller`` labelled through the forge's API, whose delivery started its run
        (answered 202). The issue as the labeller sees it, the run's workflow ID and the ``labeled`` delivery."""
        issue = self.repo(OUTSIDER).create_issue(title=title, body=body)
        labelled = self.repo(labeller).get_issue(issue.number)
        labelled.add_to_labels(TRIGGER)
        workflow_id = self.run_id(issue.number)
        [delivery] = self.deliveries("issues", "labeled")
        assert delivery["status_code"] == 202, delivery
        return labelled, workflow_id, delivery

    async def ended_labelled_run(self) -> tuple[Issue, str, dict[str, Any]]:
        """A triager's :meth:`labelled_run`, then terminated."""
        triager, workflow_id, delivery = self.labelled_run()
        await self.client.get_workflow_handle(workflow_id).terminate("ended for the test")
        return triager, workflow_id, delivery


@pytest.fixture(scope="module")
def forge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forge]:
    with running_forge(tmp_path_factory.mktemp("forge")) as handle:
        tokens = {login: handle.create_user(login) for login in (OWNER, BOT, MAINTAINER, TRIAGER, READER, OUTSIDER)}
        yield Forge(handle, tokens)


@pytest.fixture(scope="module")
def config(temporal_env: WorkflowEnvironment, forge: Forge, tmp_path_factory: pytest.TempPathFactory) -> DurafixConfig:
    return receiver_config(temporal_env, forge.handle, forge.tokens[BOT], tmp_path_factory.mktemp("state"))


def receiver_config(
    temporal_env: WorkflowEnvironment, handle: ForgeHandle, bot_token: str, state_dir: Path
) -> DurafixConfig:
    """The configuration of a receiver on the test's Temporal and forge emulator, acting with ``bot_token``: a
    fresh webhook secret, the trigger label :data:`TRIGGER`."""
    return DurafixConfig(
        state_dir=state_dir,
        temporal_address=temporal_env.client.service_client.config.target_host,
        forge_api_url=handle.api_url,
        forge_git_base=handle.base_url,
        forge_token=bot_token,
        webhook_secret=uuid.uuid4().hex,
        trigger_label=TRIGGER,
    )


@contextmanager
def serving(config: DurafixConfig) -> Iterator[WebhookReceiver]:
    rec = WebhookReceiver(config, "127.0.0.1", 0)
    rec.start()
    try:
        yield rec
    finally:
        rec.stop()


@pytest.fixture(scope="module")
def receiver(config: DurafixConfig) -> Iterator[WebhookReceiver]:
    with serving(config) as rec:
        yield rec


def hooked_repository(forge: Forge, hook_url: str, webhook_secret: str) -> str:
    """A fresh repository of ``acme`` with each role of :data:`ROLES`, the trigger label, and a webhook to
    ``hook_url`` signed with ``webhook_secret``; its full name."""
    name = f"shop-{uuid.uuid4().hex[:8]}"
    full_name = f"{OWNER}/{name}"
    forge.handle.create_repo(forge.tokens[OWNER], name, auto_init=True)
    for login, permission in ROLES.items():
        forge.handle.add_collaborator(forge.tokens[OWNER], full_name, login, permission)
    owner_api = forge_setup.ForgeApi(forge.handle.api_url, forge.tokens[OWNER])
    forge_setup.ensure_label(owner_api, full_name, TRIGGER)
    forge_setup.ensure_webhook(owner_api, full_name, hook_url, webhook_secret)
    return full_name


@pytest.fixture
async def site(
    forge: Forge, config: DurafixConfig, receiver: WebhookReceiver, temporal_client: Client
) -> AsyncIterator[Site]:
    full_name = hooked_repository(forge, receiver.url, config.webhook_secret)
    s = Site(forge, config, receiver.url, temporal_client, full_name)
    try:
        yield s
    finally:
        for workflow_id in s.touched:
            if await s.status(workflow_id) == WorkflowExecutionStatus.RUNNING:
                await temporal_client.get_workflow_handle(workflow_id).terminate("trust test over")


@asynccontextmanager
async def workers(client: Client, config: DurafixConfig, *, procedure: bool = False) -> AsyncIterator[None]:
    """The workflow and the real forge activities (with ``procedure``, the real parsing of the report's
    procedure too), each on its queue, as ``durafix worker`` builds them. No environment, model or browser-run
    worker: a run that gets that far waits at provisioning, which is where these tests look at it."""
    services = Services(config)
    with ThreadPoolExecutor(max_workers=4) as pool:
        queues = [
            Worker(client, task_queue=TaskQueue.ORCHESTRATION.value, workflows=list(WORKFLOWS)),
            Worker(
                client,
                task_queue=TaskQueue.FORGE.value,
                activities=list(services.forge_activities().all()),
                activity_executor=pool,
            ),
        ]
        if procedure:
            queues.append(
                Worker(
                    client,
                    task_queue=TaskQueue.BROWSER.value,
                    activities=[services.browser_activities().prepare_procedure],
                    activity_executor=pool,
                )
            )
        async with AsyncExitStack() as stack:
            for worker in queues:
                await stack.enter_async_context(worker)
            yield
