"""The webhook receiver under hostile clients, over real sockets (``durafix serve``'s own server).

Each test starts a receiver connected to the real Temporal dev server with small limits (body, connection
cap, read timeout) so the refusals and timeouts are reached in a second or two, and checks that a valid,
signed delivery (GitHub's ``ping``) is still answered within 2 s while the hostile connections are open.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from temporalio.testing import WorkflowEnvironment

from pipeline.config import DurafixConfig
from pipeline.receiver.server import ReceiverLimits
from pipeline.receiver.webhooks import WebhookReceiver

LIMITS = ReceiverLimits(max_body=64 * 1024, max_connections=60, read_timeout_s=1.5)
PING = json.dumps({"zen": "Design for failure.", "hook_id": 1}).encode()


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    secret: str


@contextmanager
def receiver(temporal_env: WorkflowEnvironment, tmp_path: Path, limits: ReceiverLimits = LIMITS) -> Iterator[Target]:
    config = DurafixConfig(
        state_dir=tmp_path,
        temporal_address=temporal_env.client.service_client.config.target_host,
        webhook_secret=secrets.token_hex(16),
    )
    rec = WebhookReceiver(config, "127.0.0.1", 0, limits=limits)
    rec.start()
    try:
        parts = urlsplit(rec.url)
        yield Target(str(parts.hostname), int(parts.port or 0), config.webhook_secret)
    finally:
        rec.stop()


def head(event: str, length: str | None, signature: str = "sha256=" + "0" * 64) -> bytes:
    lines = [
        "POST /webhook HTTP/1.1",
        "Host: 127.0.0.1",
        "Content-Type: application/json",
        f"X-GitHub-Event: {event}",
        "X-GitHub-Delivery: 00000000-0000-0000-0000-000000000000",
        f"X-Hub-Signature-256: {signature}",
    ]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def connect(target: Target) -> socket.socket:
    sock = socket.create_connection((target.host, target.port), timeout=10)
    return sock


@contextmanager
def receiver_and_connections(
    temporal_env: WorkflowEnvironment, tmp_path: Path, count: int, limits: ReceiverLimits = LIMITS
) -> Iterator[tuple[Target, list[socket.socket]]]:
    """A receiver with ``limits`` and ``count`` connections open to it, for the block."""
    with receiver(temporal_env, tmp_path, limits) as target, ExitStack() as stack:
        yield target, [stack.enter_context(connect(target)) for _ in range(count)]


def read_answer(sock: socket.socket, timeout_s: float) -> tuple[int, bytes] | None:
    """The status and body of the answer on ``sock``, or None when it was closed without one."""
    sock.settimeout(timeout_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    if not data:
        return None
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def valid_ping(target: Target) -> tuple[int, bytes]:
    """A signed ping as GitHub sends it: its status and body (``read_answer`` waits at most 5 s for them)."""
    signature = "sha256=" + hmac.new(target.secret.encode(), PING, hashlib.sha256).hexdigest()
    with connect(target) as sock:
        sock.sendall(head("ping", str(len(PING)), signature) + PING)
        answer = read_answer(sock, 5)
    assert answer is not None, "the ping got no answer"
    return answer


def assert_ping_answered(target: Target) -> None:
    """A valid delivery still gets a handler and its answer, whatever the attack holds."""
    status, body = valid_ping(target)
    assert (status, json.loads(body)) == (200, {"message": "pong"})


def test_negative_content_length_is_refused_without_reading_the_body(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    with receiver(temporal_env, tmp_path) as target, connect(target) as sock:
        # Before, ``read(-1)`` buffered until the client closed: the answer came only at EOF, with all of it read.
        # The socket stays open here, so an answer at all means the receiver did not wait for the end.
        sock.sendall(head("issues", "-1") + b"x" * 4096)
        answer = read_answer(sock, 5)
        assert answer is not None and answer[0] == 400, answer
        assert b"not a non-negative integer" in answer[1]
        assert_ping_answered(target)


@pytest.mark.parametrize(("declared", "status"), [(None, 411), ("+12", 400), ("1e3", 400), ("", 411)])
def test_missing_or_malformed_content_length_is_refused(
    temporal_env: WorkflowEnvironment, tmp_path: Path, declared: str | None, status: int
) -> None:
    with receiver(temporal_env, tmp_path) as target, connect(target) as sock:
        sock.sendall(head("issues", declared))
        answer = read_answer(sock, 5)
        assert answer is not None and answer[0] == status, answer


def test_body_over_the_limit_is_refused_before_it_is_read(temporal_env: WorkflowEnvironment, tmp_path: Path) -> None:
    too_big = LIMITS.max_body + 1
    with receiver(temporal_env, tmp_path) as target, connect(target) as sock:
        # Headers first, then the body in a trickle: the 413 must come before the body has been sent.
        sock.sendall(head("issues", str(too_big)))
        sock.sendall(b"{" * 1024)
        answer = read_answer(sock, 5)
        assert answer is not None and answer[0] == 413, answer
        assert f"{too_big} bytes declared".encode() in answer[1]
        assert_ping_answered(target)


def test_fifty_connections_sending_no_body_are_timed_out_and_a_valid_delivery_is_answered(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    with receiver_and_connections(temporal_env, tmp_path, 50) as (target, idle):
        for sock in idle:
            sock.sendall(head("issues", "512"))
        # Every idle connection holds a handler now; the delivery must still get one and its answer.
        time.sleep(0.3)
        assert_ping_answered(target)

        # Timed out by the receiver (408, its answer) rather than held until the client gives up.
        answers = [read_answer(sock, LIMITS.read_timeout_s + 5) for sock in idle]
        assert [a[0] if a else None for a in answers] == [408] * 50, answers
        assert_ping_answered(target)


def test_connections_that_send_nothing_are_closed_after_the_read_timeout(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    with receiver_and_connections(temporal_env, tmp_path, 50) as (target, silent):
        time.sleep(0.3)
        assert_ping_answered(target)
        # No request line ever came: the server closes without an answer (a client timeout would raise).
        assert [read_answer(sock, LIMITS.read_timeout_s + 5) for sock in silent] == [None] * 50


def test_a_connection_over_the_cap_is_answered_503_at_once(temporal_env: WorkflowEnvironment, tmp_path: Path) -> None:
    limits = ReceiverLimits(max_body=LIMITS.max_body, max_connections=3, read_timeout_s=1.5)
    with receiver_and_connections(temporal_env, tmp_path, 3, limits) as (target, held):
        for sock in held:
            sock.sendall(head("issues", "512"))
        time.sleep(0.3)
        with connect(target) as extra:
            # It sends nothing: a handler given to it would time it out (408) or close it; only the cap says 503.
            answer = read_answer(extra, 5)
            assert answer is not None and answer[0] == 503, answer
        # Once the held connections time out their slots are free again.
        assert [a[0] if a else None for a in (read_answer(s, 5) for s in held)] == [408] * 3
        assert_ping_answered(target)


def test_a_body_over_the_unverified_budget_is_answered_503_before_it_is_read(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    # Room for 4 small bodies (16 KiB slots) and one large one of up to 48 KiB: the 40 KiB body held below
    # leaves no room for a second; a small delivery still has its slot.
    limits = ReceiverLimits(
        max_body=LIMITS.max_body, max_connections=4, read_timeout_s=3.0, buffer_budget=112 * 1024, small_body=16 * 1024
    )
    with receiver(temporal_env, tmp_path, limits) as target, connect(target) as holder, connect(target) as second:
        holder.sendall(head("issues", str(40 * 1024)) + b"{" * 1024)
        time.sleep(0.3)
        second.sendall(head("issues", str(40 * 1024)))
        second.settimeout(5)
        raw = b""
        while chunk := second.recv(65536):
            raw += chunk
        status_line, _, rest = raw.partition(b"\r\n")
        assert status_line.split()[1] == b"503", raw
        assert b"retry-after: 1" in rest.lower() and b"unverified bytes" in rest, raw
        assert_ping_answered(target)
        # The held body, once complete, is checked (and refused: unsigned); its room is given back.
        holder.sendall(b"{" * (39 * 1024))
        held = read_answer(holder, 5)
        assert held is not None and held[0] == 401, held
        with connect(target) as third:
            third.sendall(head("issues", str(40 * 1024)) + b"{" * (40 * 1024))
            again = read_answer(third, 5)
            assert again is not None and again[0] == 401, again
