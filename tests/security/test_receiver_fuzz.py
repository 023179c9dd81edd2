"""The webhook receiver fuzzed with hypothesis, over real sockets, Temporal and the forge both up.

Two properties:
- A request without a valid signature (none, a random one, one over another body, one made with another
  secret, a valid one over a body changed afterwards, odd bytes in its headers) is refused with a 4xx, and
  reaches nothing: at the end the live run it targeted has no signal or Update in its history, and Temporal
  lists no other run of its repository.
- A signed request, however mangled (random bodies, truncated JSON, wrong types in known fields, fields
  removed or added, random event names, odd header bytes), is never answered 5xx (a repository or user the
  forge does not know is the payload's fault: 422).
Bounded: ``MAX_EXAMPLES`` requests per property, no deadline (the stack is shared and the machine is busy).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import secrets
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st
from temporalio.client import Client

from pipeline.receiver.webhooks import WebhookReceiver
from reviews.markers import pull_marker
from tests.integration.receiver.test_webhooks import (
    BOT,
    DECISION_EVENTS,
    TRIGGER,
    WRITER,
    Forge,
    Hook,
    config,
    events_of,
    forge,
    hooked,
)
from tests.support.security_harness import example, receiver

pytestmark = [pytest.mark.slow]

__all__ = ["config", "forge", "receiver"]  # fixtures shared with test_webhooks

MAX_EXAMPLES = 150
FUZZ = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
EVENTS = ["issues", "pull_request_review", "pull_request", "ping", "issue_comment", "push", ""]
# A run no fuzzed request names on purpose: a mutated decision is answered 404, not left waiting on a run
# without a worker.
NOBODYS_RUN_ISSUE = 987_654_321

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
# Header values with bytes a client may send: control bytes, latin-1, invalid UTF-8, but no line break (a
# line break ends the header, which is a different request, fuzzed by the bodies instead).
odd_header_values = st.binary(max_size=60).map(lambda raw: raw.replace(b"\r", b"").replace(b"\n", b""))


@dataclass(frozen=True)
class Sent:
    status: int | None
    body: bytes


def raw_post(url: str, headers: list[tuple[bytes, bytes]], body: bytes) -> Sent:
    """One POST written byte for byte (so headers may hold what ``http.client`` refuses to send); the answer's
    status (None when the connection closed without one) and body."""
    parts = urlsplit(url)
    head = b"POST /webhook HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    head += b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    head += f"Content-Length: {len(body)}\r\n\r\n".encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(head + body)
        data = b""
        # A receiver that answers and closes before reading a refused body resets the connection: what it sent
        # before the reset is the answer.
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                data += chunk
    if not data:
        return Sent(None, b"")
    status_line, _, rest = data.partition(b"\r\n")
    return Sent(int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2])


def sign(secret: str, body: bytes) -> bytes:
    return b"sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest().encode()


def mutate(value: Any, data: st.DataObject, depth: int = 0) -> Any:
    """``value`` with one change somewhere inside: a field replaced by a value of any JSON type, set to null,
    removed, or added. The top level stays an object (a whole body of another shape is drawn separately);
    hypothesis leans to small draws, so "stop here and replace" is the largest one, not the smallest."""
    stop = depth > 0 and data.draw(st.integers(0, 3)) == 3
    if stop or depth > 6 or not isinstance(value, (dict, list)) or not value:
        return data.draw(json_values)
    if isinstance(value, dict):
        key = data.draw(st.sampled_from(sorted(value)))
        choice = data.draw(st.sampled_from(["descend", "wrong type", "remove", "add", "null"]))
        changed = dict(value)
        if choice == "descend":
            changed[key] = mutate(value[key], data, depth + 1)
        elif choice == "wrong type":
            changed[key] = data.draw(json_values)
        elif choice == "remove":
            del changed[key]
        elif choice == "add":
            changed[data.draw(st.text(max_size=12))] = data.draw(json_values)
        else:
            changed[key] = None
        return changed
    index = data.draw(st.integers(0, len(value) - 1))
    return [*value[:index], mutate(value[index], data, depth + 1), *value[index + 1 :]]


class Deliveries:
    """Payloads of the events the receiver acts on, for one repository and one run's marker."""

    def __init__(self, hook: Hook, marker_run: str) -> None:
        self.hook = hook
        self.pr_body = f"Fix\n\n{pull_marker(marker_run).render()}"

    def trigger(self, number: int) -> dict[str, Any]:
        return self.hook.issue_event("labeled", number, [TRIGGER], TRIGGER)

    def review(self, state: str) -> dict[str, Any]:
        payload = self.hook.review_event(state, self.pr_body)
        # A fixed ID: what hypothesis draws (a cut of the body, say) must not depend on a random length.
        payload["review"]["id"] = 4242
        return payload

    def dismissal(self) -> dict[str, Any]:
        payload = self.review("approved")
        dismissed = example("pull_request_review", "dismissed")
        payload["action"] = dismissed["action"]
        return payload

    def closing(self) -> dict[str, Any]:
        closed = self.hook.with_repository(example("pull_request", "closed"))
        closed["pull_request"].update(body=self.pr_body, merged=False)
        closed["pull_request"]["user"]["login"] = BOT
        closed["sender"]["login"] = WRITER
        return closed

    def edit(self, number: int) -> dict[str, Any]:
        edited = self.hook.with_repository(example("issues", "edited"))
        edited["issue"]["number"] = number
        edited["changes"] = {"title": {"from": "before"}}
        return edited

    def any(self, data: st.DataObject, trigger_numbers: st.SearchStrategy[int]) -> tuple[str, dict[str, Any]]:
        kind = data.draw(st.sampled_from(["trigger", "approve", "changes", "dismiss", "close", "edit"]))
        if kind == "trigger":
            return "issues", self.trigger(data.draw(trigger_numbers))
        if kind == "approve":
            return "pull_request_review", self.review("approved")
        if kind == "changes":
            return "pull_request_review", self.review("changes_requested")
        if kind == "dismiss":
            return "pull_request_review", self.dismissal()
        if kind == "close":
            return "pull_request", self.closing()
        return "issues", self.edit(1)


async def runs_of(client: Client, repository: str) -> list[str]:
    """Every workflow Temporal lists for ``repository``'s issues."""
    return [execution.id async for execution in client.list_workflows(f'WorkflowId STARTS_WITH "repair:{repository}#"')]


@pytest.fixture
async def fuzz_hook(receiver: WebhookReceiver, forge: Forge, temporal_client: Client) -> AsyncIterator[Hook]:
    async def listed(hook: Hook) -> list[str]:
        return await runs_of(temporal_client, hook.repository)

    async with hooked(receiver, forge, temporal_client, listed, "fuzzing over") as hook:
        yield hook


async def test_requests_without_a_valid_signature_are_refused_and_reach_no_run(fuzz_hook: Hook) -> None:
    hook = fuzz_hook
    await hook.started_run(1)
    live_run = hook.run_id(1)
    payloads = Deliveries(hook, live_run)
    other_secret = secrets.token_hex(16)

    @FUZZ
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        event, payload = payloads.any(data, st.integers(2, 40))
        body = json.dumps(payload).encode()
        how = data.draw(st.sampled_from(["none", "random", "other body", "other secret", "changed", "bad form"]))
        signature: bytes | None
        if how == "none":
            signature = None
        elif how == "random":
            signature = b"sha256=" + secrets.token_hex(32).encode()
        elif how == "other body":
            signature = sign(hook.secret, json.dumps(payloads.trigger(99)).encode())
        elif how == "other secret":
            signature = sign(other_secret, body)
        elif how == "changed":
            signature = sign(hook.secret, body)
            changed = json.dumps(mutate(payload, data)).encode()
            body = changed if changed != body else body + b" "
        else:
            signature = data.draw(odd_header_values)
        headers = [(b"X-GitHub-Event", event.encode()), (b"X-GitHub-Delivery", str(uuid.uuid4()).encode())]
        if data.draw(st.integers(0, 3)) == 3:
            headers.append(
                (data.draw(st.sampled_from([b"X-GitHub-Delivery", b"User-Agent"])), data.draw(odd_header_values))
            )
        if signature is not None:
            headers.append((b"X-Hub-Signature-256", signature))
        sent = raw_post(hook.url, headers, body)
        assert sent.status is not None, (how, event)
        hypothesis_event(f"{how}: {sent.status}")
        # 400 only when h11 refused an odd header value before the signature could be looked at.
        assert sent.status == 401 or (sent.status == 400 and b"malformed HTTP request" in sent.body), (
            how,
            event,
            sent,
        )

    await asyncio.to_thread(check)

    assert await events_of(hook.client, live_run, *DECISION_EVENTS) == []
    assert await runs_of(hook.client, hook.repository) == [live_run]


async def test_signed_requests_however_mangled_are_never_answered_5xx(fuzz_hook: Hook) -> None:
    hook = fuzz_hook
    payloads = Deliveries(hook, hook.run_id(NOBODYS_RUN_ISSUE))

    @FUZZ
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        event, payload = payloads.any(data, st.integers(1, 10**6))
        shape = data.draw(st.sampled_from(["mutated", "mutated twice", "truncated", "random bytes", "any JSON"]))
        if shape == "mutated":
            body = json.dumps(mutate(payload, data)).encode()
        elif shape == "mutated twice":
            body = json.dumps(mutate(mutate(payload, data), data)).encode()
        elif shape == "truncated":
            whole = json.dumps(payload).encode()
            body = whole[: data.draw(st.integers(0, len(whole) - 1))]
        elif shape == "random bytes":
            body = data.draw(st.binary(max_size=512))
        else:
            body = json.dumps(data.draw(json_values)).encode()
        if data.draw(st.integers(0, 3)) == 3:
            event = data.draw(st.sampled_from(EVENTS) | st.text(max_size=20))
        event_header = event.encode("utf-8", "surrogatepass")
        if data.draw(st.integers(0, 5)) == 5:
            event_header = data.draw(odd_header_values)
        headers = [
            (b"X-GitHub-Event", event_header),
            (b"X-GitHub-Delivery", data.draw(st.sampled_from([b"72d3162e-cc78-11e3-81ab-4c9367dc0958", b"-"]))),
            (b"X-Hub-Signature-256", sign(hook.secret, body)),
        ]
        sent = raw_post(hook.url, headers, body)
        assert sent.status is not None, (event, shape)
        hypothesis_event(f"{shape}: {sent.status}")
        assert sent.status < 500, (event, shape, body[:300], sent)

    await asyncio.to_thread(check)
