"""The bytes a receiver buffers before it checks a signature are capped across all connections.

``durafix serve`` runs as its own process (its defaults: 64 connections, 25 MiB bodies, a 64 MiB budget of
unverified bytes) against the real Temporal dev server. 64 connections each declare and send a 25 MiB unsigned
body: without the budget the receiver would hold all of them at once (1.6 GB); with it, the one the budget
admits is read (and refused 401), the others are answered 503 before their bodies are read, and a signed
delivery is answered while the admitted body is held. The receiver's peak resident memory (``VmHWM`` in
``/proc``, reset through ``clear_refs`` before the attack) is what is measured.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from environments.ports import free_port
from pipeline.receiver.limits import MIB, ReceiverLimits

pytestmark = [pytest.mark.slow]

DEFAULTS = ReceiverLimits()
ATTACKERS = 64
# What the receiver's peak resident memory may grow by under the attack: its budget of unverified bytes and
# 32 MiB for the rest (an admitted body's buffer grows by up to an eighth over its size; the server's per-
# connection buffers; the interpreter's allocator).
RSS_CAP = DEFAULTS.buffer_budget + 32 * MIB
CHUNK = 256 * 1024
PING = json.dumps({"zen": "Design for failure.", "hook_id": 1}).encode()


@dataclass
class Receiver:
    pid: int
    port: int
    secret: str


@contextmanager
def receiver_process(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Receiver]:
    port = free_port()
    secret = secrets.token_hex(16)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DURAFIX_")},
        "DURAFIX_STATE_DIR": str(tmp_path / "state"),
        "DURAFIX_TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
        "DURAFIX_WEBHOOK_SECRET": secret,
    }
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "serve", "--port", str(port), "--no-reconcile"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not _healthy(port):
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, "the receiver did not start serving within 60 s"
            time.sleep(0.2)
        yield Receiver(proc.pid, port, secret)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _healthy(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            return sock.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def head(event: str, length: int, signature: str) -> bytes:
    return (
        "POST /webhook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"X-GitHub-Event: {event}\r\nX-GitHub-Delivery: {secrets.token_hex(8)}\r\n"
        f"X-Hub-Signature-256: {signature}\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def status_of(sock: socket.socket) -> int | None:
    """The status of the answer on ``sock``, or None when the connection ended without one."""
    data = b""
    # A reset instead of an answer (a refused connection still sending) is "no answer", not a failure here.
    with contextlib.suppress(OSError):
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return int(data.split()[1]) if data.startswith(b"HTTP/1.1 ") else None


def memory(pid: int, key: str) -> int:
    """``VmRSS`` or ``VmHWM`` of ``pid``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} for {pid}")


@dataclass
class Attacker:
    """One connection sending a 25 MiB unsigned body; an admitted one stops before its last MiB until ``go``."""

    port: int
    go: threading.Event
    outcome: str = ""
    status: int | None = None
    sent: int = 0
    paused: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        length = DEFAULTS.max_body
        chunk = b"x" * CHUNK
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=30) as sock:
                sock.sendall(head("issues", length, "sha256=" + "0" * 64))
                try:
                    while self.sent < length - MIB:
                        sock.sendall(chunk)
                        self.sent += CHUNK
                    # The receiver took all but the last MiB: this body is the one it holds.
                    self.paused.set()
                    self.go.wait(30)
                    while self.sent < length:
                        sock.sendall(chunk)
                        self.sent += CHUNK
                    self.outcome = "sent"
                except OSError:
                    # Refused and closed while sending: the answer, if it is still readable, says why.
                    self.outcome = "cut"
                self.status = status_of(sock)
        except OSError as err:
            self.outcome = f"connect failed: {err}"
        finally:
            self.done.set()


def valid_ping(target: Receiver) -> tuple[int | None, bytes]:
    signature = "sha256=" + hmac.new(target.secret.encode(), PING, hashlib.sha256).hexdigest()
    with socket.create_connection(("127.0.0.1", target.port), timeout=10) as sock:
        sock.sendall(head("ping", len(PING), signature) + PING)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status = int(data.split()[1]) if data.startswith(b"HTTP/1.1 ") else None
    return status, data.partition(b"\r\n\r\n")[2]


def test_64_unsigned_25_mib_bodies_stay_within_the_budget_and_a_delivery_is_answered(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    with receiver_process(temporal_env, tmp_path) as target:
        assert valid_ping(target)[0] == 200
        before = memory(target.pid, "VmRSS")
        # Peak resident memory from now on (Linux: writing 5 resets VmHWM to the current RSS).
        Path(f"/proc/{target.pid}/clear_refs").write_text("5")
        go = threading.Event()
        attackers = [Attacker(target.port, go) for _ in range(ATTACKERS)]
        threads = [threading.Thread(target=a.run, daemon=True) for a in attackers]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 120
        while not all(a.paused.is_set() or a.done.is_set() for a in attackers):
            assert time.monotonic() < deadline, "an attacker neither paused nor ended"
            time.sleep(0.1)
        held = [a for a in attackers if a.paused.is_set() and not a.done.is_set()]
        refused = [a for a in attackers if a.done.is_set()]
        # The budget (48 MiB of it for bodies over 256 KiB) admits one 25 MiB body at a time.
        assert len(held) == 1, [(a.outcome, a.status, a.sent) for a in attackers]
        # Refused before their bodies were read: 503, or a reset when the close overtook the answer while the
        # client was still sending.
        assert {a.status for a in refused} <= {503, None}, [(a.outcome, a.status) for a in refused]

        # While the admitted body is held (24 MiB of it in the receiver), a signed delivery is answered.
        status, body = valid_ping(target)
        assert (status, json.loads(body)) == (200, {"message": "pong"})
        go.set()
        for thread in threads:
            thread.join(60)
        assert [(a.outcome, a.status) for a in held] == [("sent", 401)]
        peak = memory(target.pid, "VmHWM")
        grew = peak - before
        print(f"receiver RSS {before / MIB:.1f} MiB before, peak {peak / MIB:.1f} MiB: grew {grew / MIB:.1f} MiB")
        assert grew <= RSS_CAP, f"the receiver's peak RSS grew by {grew / MIB:.1f} MiB, over {RSS_CAP / MIB:.0f} MiB"
        # The budget was given back: a signed delivery is still answered after the attack.
        assert valid_ping(target)[0] == 200
