"""Webhook deliveries: recorded in the same transaction as the change that caused them, sent by one thread.

Contract, as on GitHub:

- ``enqueue`` writes one pending delivery per active hook subscribed to the event, inside the caller's
  transaction, so an event exists exactly when its cause was committed.
- One background thread sends pending deliveries in id order (hence in order per hook), each as a POST with
  ``X-GitHub-Event``, ``X-GitHub-Delivery`` (a GUID), ``X-Hub-Signature-256`` (HMAC-SHA256 of the raw body
  with the hook's secret) and a 10 s timeout. The outcome (status, headers, body, duration) is recorded.
- A failed delivery is never retried by the forge; ``redeliver`` sends a copy with the same GUID and
  ``redelivery: true``. A delivery that was in flight when the process died is marked as interrupted on the
  next start, not sent again.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import sqlite3
import threading
import time
import urllib.parse
import uuid
from typing import Any

from .names import now_iso
from .store import Store

TIMEOUT_S = 10.0
USER_AGENT = "GitHub-Hookshot/forge"


def _matches(events: list[str], event: str) -> bool:
    return "*" in events or event in events


def encode_body(content_type: str, payload: dict[str, Any]) -> str:
    raw = json.dumps(payload, separators=(",", ":"))
    if content_type == "form":
        return urllib.parse.urlencode({"payload": raw})
    return raw


def sign(secret: str | None, body: str) -> dict[str, str]:
    if not secret:
        return {}
    key = secret.encode()
    return {
        "X-Hub-Signature": "sha1=" + hmac.new(key, body.encode(), hashlib.sha1).hexdigest(),
        "X-Hub-Signature-256": "sha256=" + hmac.new(key, body.encode(), hashlib.sha256).hexdigest(),
    }


def insert_delivery(
    db: sqlite3.Connection,
    hook: sqlite3.Row,
    event: str,
    payload: dict[str, Any],
    guid: str | None = None,
    redelivery: bool = False,
) -> int:
    guid = guid or str(uuid.uuid4())
    body = encode_body(hook["content_type"], payload)
    headers = {
        "Accept": "*/*",
        "Content-Type": "application/x-www-form-urlencoded" if hook["content_type"] == "form" else "application/json",
        "User-Agent": USER_AGENT,
        "X-GitHub-Delivery": guid,
        "X-GitHub-Event": event,
        "X-GitHub-Hook-ID": str(hook["id"]),
        "X-GitHub-Hook-Installation-Target-ID": str(hook["repo_id"]),
        "X-GitHub-Hook-Installation-Target-Type": "repository",
        **sign(hook["secret"], body),
    }
    cur = db.execute(
        "INSERT INTO deliveries (hook_id, repo_id, guid, event, action, redelivery, request_headers, request_body,"
        " state, delivered_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?)",
        (
            hook["id"],
            hook["repo_id"],
            guid,
            event,
            payload.get("action"),
            int(redelivery),
            json.dumps(headers),
            body,
            now_iso(),
        ),
    )
    return int(cur.lastrowid or 0)


def enqueue(db: sqlite3.Connection, repo_id: int, event: str, payload: dict[str, Any]) -> None:
    """Record a delivery of ``payload`` for every active hook on the repository subscribed to ``event``."""
    for hook in db.execute("SELECT * FROM hooks WHERE repo_id = ? AND active = 1 ORDER BY id", (repo_id,)):
        if _matches(json.loads(hook["events"]), event):
            insert_delivery(db, hook, event, payload)


def _post(url: str, headers: dict[str, str], body: str) -> tuple[int, dict[str, str], str]:
    parts = urllib.parse.urlsplit(url)
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(parts.hostname or "", parts.port, timeout=TIMEOUT_S)
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("POST", target, body=body.encode(), headers=headers)
        resp = conn.getresponse()
        text = resp.read(1024 * 1024).decode(errors="replace")
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, text
    finally:
        conn.close()


class Deliverer:
    """The single thread that sends pending deliveries in order."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="forge-webhooks", daemon=True)

    def start(self) -> None:
        with self._store.tx() as db:
            db.execute(
                "UPDATE deliveries SET state = 'done', status = 'delivery interrupted', status_code = 0,"
                " response_headers = '{}', response_body = '', duration = 0 WHERE state = 'sending'"
            )
        self._thread.start()

    def wake(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=TIMEOUT_S + 2)

    def _next(self) -> tuple[sqlite3.Row, sqlite3.Row] | None:
        with self._store.tx() as db:
            row = db.execute("SELECT * FROM deliveries WHERE state = 'pending' ORDER BY id LIMIT 1").fetchone()
            if row is None:
                return None
            db.execute("UPDATE deliveries SET state = 'sending' WHERE id = ?", (row["id"],))
            hook = db.execute("SELECT * FROM hooks WHERE id = ?", (row["hook_id"],)).fetchone()
            return row, hook

    def _run(self) -> None:
        while True:
            with self._wake:
                if self._stopping:
                    return
            item = self._next()
            if item is None:
                with self._wake:
                    if not self._stopping:
                        self._wake.wait(timeout=1.0)
                continue
            self._send(*item)

    def _send(self, row: sqlite3.Row, hook: sqlite3.Row) -> None:
        started = time.monotonic()
        try:
            code, headers, text = _post(hook["url"], json.loads(row["request_headers"]), row["request_body"])
            status = "OK" if 200 <= code < 300 else f"Invalid HTTP Response: {code}"
        except TimeoutError:
            code, headers, text, status = 0, {}, "", "timed out"
        except OSError as exc:
            code, headers, text, status = 0, {}, "", f"failed to connect: {exc.__class__.__name__}"
        duration = round(time.monotonic() - started, 3)
        with self._store.tx() as db:
            db.execute(
                "UPDATE deliveries SET state = 'done', status = ?, status_code = ?, response_headers = ?,"
                " response_body = ?, duration = ?, delivered_at = ? WHERE id = ?",
                (status, code, json.dumps(headers), text, duration, now_iso(), row["id"]),
            )
            db.execute(
                "UPDATE hooks SET last_code = ?, last_status = ?, last_message = ? WHERE id = ?",
                (code, "active" if 200 <= code < 300 else "misconfigured", status, hook["id"]),
            )
