"""The receiver's HTTP surface besides the deliveries themselves, and GitHub's whole payload corpus.

Over real HTTP, against the real Temporal dev server and the project's GitHub emulator, as in
``test_webhooks`` (whose stack and helpers this reuses): ``/metrics`` after real deliveries, ``/healthz`` and
``/readyz`` with both dependencies up, with the forge gone and with Temporal unreachable, the JSON delivery
log, and every payload of ``tests/infra/forge/data/webhook-examples`` (and variants of each) answered as its event
demands.
"""

from __future__ import annotations

import asyncio
import copy
import http.client
import json
import logging
import math
import socket
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

from environments.ports import free_port
from infra.forge.testing import running_forge
from pipeline.config import DurafixConfig
from pipeline.receiver.logs import LOGGER_NAME
from pipeline.receiver.webhooks import WebhookReceiver
from reviews.markers import pull_marker
from tests.integration.receiver.test_webhooks import (
    BOT,
    TRIGGER,
    Hook,
    config,
    forge,
    hook,
    post,
)
from tests.support.security_harness import EXAMPLES, receiver, serving, sign

__all__ = ["config", "forge", "hook", "receiver"]  # fixtures shared with test_webhooks

# What each event of the corpus may be answered, as GitHub's example payloads are (no durafix marker, no
# trigger label, a repository with no run): ping is answered, an issue action is ignored (202) or, for an
# edit of an issue without a live run, noted as nothing to do (202); a PR or review of someone else's PR is
# ignored; any other event is ignored.
ALLOWED: dict[str, set[int]] = {"ping": {200}, "issues": {202}, "pull_request": {202}, "pull_request_review": {202}}
OTHER_EVENTS = {202}
# Fields GitHub's schema marks nullable or optional in these events, by event: the variants set each to null
# and remove it, and the answer must stay what the event demands.
OPTIONAL: dict[str, list[tuple[str, ...]]] = {
    "issues": [
        ("issue", "body"),
        ("issue", "milestone"),
        ("issue", "assignee"),
        ("issue", "closed_at"),
        ("issue", "labels"),
        ("label",),
        ("changes",),
        ("organization",),
        ("installation",),
    ],
    "pull_request": [
        ("pull_request", "body"),
        ("pull_request", "merged_at"),
        ("pull_request", "milestone"),
        ("pull_request", "assignee"),
        ("pull_request", "merged"),
        ("label",),
        ("organization",),
    ],
    "pull_request_review": [("review", "body"), ("pull_request", "body"), ("organization",)],
    "issue_comment": [("issue", "body"), ("comment", "body")],
    "ping": [("hook",), ("organization",)],
}


def corpus() -> list[Path]:
    return sorted(path for path in EXAMPLES.rglob("*.json"))


def corpus_id(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def get(url: str, path: str) -> tuple[int, bytes, str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read(), resp.getheader("Content-Type") or ""
    finally:
        conn.close()


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics`` as (name, sorted labels) -> value."""
    status, body, content_type = get(url, "/metrics")
    assert status == 200 and content_type.startswith("text/plain"), (status, content_type)
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def deliveries(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], event: str, action: str, status: int
) -> float:
    key = ("durafix_webhook_deliveries_total", (("action", action), ("event", event), ("status", str(status))))
    return samples.get(key, 0.0)


def deliver(
    url: str, secret: str, event: str, payload: dict[str, Any] | bytes, signed: bool = True
) -> tuple[int, dict[str, Any]]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    answer = post(url, event, body, sign(secret, body) if signed else None)
    return answer.status, answer.body


# ---- /metrics ------------------------------------------------------------------------------------------


def test_metrics_count_real_deliveries_by_event_action_and_status(config: DurafixConfig) -> None:
    ping = json.loads((EXAMPLES / "ping" / "payload.json").read_text())
    labeled = json.loads((EXAMPLES / "issues" / "labeled.payload.json").read_text())
    with serving(config) as rec:
        assert deliver(rec.url, config.webhook_secret, "ping", ping)[0] == 200
        assert deliver(rec.url, config.webhook_secret, "ping", ping)[0] == 200
        # GitHub's example adds the "bug" label: ignored.
        assert deliver(rec.url, config.webhook_secret, "issues", labeled)[0] == 202
        assert deliver(rec.url, config.webhook_secret, "issues", labeled, signed=False)[0] == 401
        assert deliver(rec.url, config.webhook_secret, "issues", b"[]")[0] == 400
        rec.metrics.reconciled(datetime.now(UTC) - timedelta(minutes=5))
        samples = scrape(rec.url)

    assert deliveries(samples, "ping", "", 200) == 2
    assert deliveries(samples, "issues", "labeled", 202) == 1
    # Unsigned: nothing it says is a label, not even its event.
    assert deliveries(samples, "unverified", "", 401) == 1
    assert deliveries(samples, "issues", "", 400) == 1
    assert samples[("durafix_webhook_handling_seconds_count", (("event", "ping"),))] == 2
    assert samples[("durafix_webhook_handling_seconds_count", (("event", "issues"),))] == 2
    assert samples[("durafix_reconciler_lag_seconds", ())] >= 300


def test_a_receiver_running_its_reconciler_reports_each_pass_as_the_lag_in_metrics(config: DurafixConfig) -> None:
    with serving(config) as rec:
        before = scrape(rec.url)[("durafix_reconciler_lag_seconds", ())]
        rec.start_reconciler(interval_s=0.5)
        lags: list[float] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            lag = scrape(rec.url)[("durafix_reconciler_lag_seconds", ())]
            if not math.isnan(lag):
                lags.append(lag)
                if len(lags) >= 3:
                    break
            time.sleep(0.3)
    # No pass before the reconciler started; then passes every half second keep the lag near zero.
    assert math.isnan(before)
    assert len(lags) >= 3, lags
    assert min(lags) < 5, lags


def test_refusals_before_the_app_are_counted_too(config: DurafixConfig) -> None:
    with serving(config) as rec:
        parts = urlsplit(rec.url)
        with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
            sock.sendall(b"POST /webhook HTTP/1.1\r\nHost: x\r\nX-GitHub-Event: issues\r\nContent-Length: -1\r\n\r\n")
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        samples = scrape(rec.url)
    assert deliveries(samples, "unverified", "", 400) == 1


def test_each_receiver_has_a_registry_of_its_own(config: DurafixConfig) -> None:
    ping = json.loads((EXAMPLES / "ping" / "payload.json").read_text())
    with serving(config) as first, serving(config) as second:
        assert deliver(first.url, config.webhook_secret, "ping", ping)[0] == 200
        assert deliveries(scrape(first.url), "ping", "", 200) == 1
        assert deliveries(scrape(second.url), "ping", "", 200) == 0


# ---- one JSON log line per delivery --------------------------------------------------------------------


def test_each_delivery_is_one_json_log_line_without_payload_or_secret(
    config: DurafixConfig, receiver: WebhookReceiver
) -> None:
    payload = json.loads((EXAMPLES / "issues" / "labeled.payload.json").read_text())
    payload["issue"]["title"] = marker = f"title-{uuid.uuid4().hex}"
    body = json.dumps(payload).encode()
    delivery = str(uuid.uuid4())
    logger = logging.getLogger(LOGGER_NAME)
    [handler] = [h for h in logger.handlers if getattr(h, "_durafix_stderr", False)]
    records: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(handler.format(record))

    capture = Capture()
    logger.addHandler(capture)
    try:
        parts = urlsplit(receiver.url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
        conn.request(
            "POST",
            "/webhook",
            body,
            {
                "X-GitHub-Event": "issues",
                "X-GitHub-Delivery": delivery,
                "X-Hub-Signature-256": sign(config.webhook_secret, body),
            },
        )
        assert conn.getresponse().status == 202
        conn.close()
    finally:
        logger.removeHandler(capture)
    [line] = [json.loads(r) for r in records if delivery in r]
    assert {k: line[k] for k in ("delivery", "event", "action", "status")} == {
        "delivery": delivery,
        "event": "issues",
        "action": "labeled",
        "status": 202,
    }
    assert line["message"].startswith("issues.labeled without")
    assert isinstance(line["duration_ms"], float)
    text = "\n".join(records)
    assert marker not in text and config.webhook_secret not in text


# ---- /healthz and /readyz ------------------------------------------------------------------------------


def test_alive_and_ready_with_temporal_and_the_forge_up(receiver: WebhookReceiver) -> None:
    assert get(receiver.url, "/healthz")[:2] == (200, b'{"status":"alive"}')
    status, body, _ = get(receiver.url, "/readyz")
    assert (status, json.loads(body)) == (200, {"ready": True, "checks": {"temporal": "ok", "forge": "ok"}})


def test_not_ready_naming_the_forge_once_it_is_gone(config: DurafixConfig, tmp_path: Path) -> None:
    forge_running = running_forge(tmp_path / "forge")
    gone = forge_running.__enter__()
    stopped = False
    try:
        token = gone.create_user(BOT)
        own = config.model_copy(
            update={"forge_api_url": gone.api_url, "forge_git_base": gone.base_url, "forge_token": token}
        )
        with serving(own) as rec:
            assert get(rec.url, "/readyz")[0] == 200
            forge_running.__exit__(None, None, None)
            stopped = True
            status, body, _ = get(rec.url, "/readyz")
            assert get(rec.url, "/healthz")[0] == 200
    finally:
        if not stopped:
            forge_running.__exit__(None, None, None)
    answer = json.loads(body)
    assert status == 503, answer
    assert answer["checks"]["temporal"] == "ok"
    assert answer["checks"]["forge"] != "ok"
    assert answer["message"].startswith("not ready: forge: ")


def test_not_ready_naming_temporal_when_it_is_unreachable_and_deliveries_needing_it_are_503(
    config: DurafixConfig, hook: Hook
) -> None:
    unreachable = config.model_copy(update={"temporal_address": f"127.0.0.1:{free_port()}"})
    with serving(unreachable) as rec:
        assert get(rec.url, "/healthz")[0] == 200
        status, body, _ = get(rec.url, "/readyz")
        # A ping needs neither; a trigger needs the forge (up) and then Temporal (not there).
        ping = json.loads((EXAMPLES / "ping" / "payload.json").read_text())
        assert deliver(rec.url, config.webhook_secret, "ping", ping)[0] == 200
        trigger = hook.issue_event("labeled", 1, [TRIGGER], TRIGGER)
        started = deliver(rec.url, config.webhook_secret, "issues", trigger)
    answer = json.loads(body)
    assert status == 503, answer
    assert answer["checks"]["forge"] == "ok"
    assert answer["checks"]["temporal"] != "ok"
    assert answer["message"].startswith("not ready: temporal: ")
    assert started[0] == 503, started
    assert started[1]["message"].startswith("could not reach the workflow engine")


# ---- GitHub's payload corpus ---------------------------------------------------------------------------


def _allowed(event: str) -> set[int]:
    return ALLOWED.get(event, OTHER_EVENTS)


def _assert_answered_as_its_event_demands(event: str, status: int, answer: dict[str, Any], what: str) -> None:
    assert status in _allowed(event), (what, status, answer)
    assert not str(answer.get("message", "")).startswith("payload lacks"), (what, answer)


def _with_unknown_fields(value: Any) -> Any:
    """``value`` with a field GitHub might add tomorrow in every object."""
    if isinstance(value, dict):
        return {**{k: _with_unknown_fields(v) for k, v in value.items()}, "durafix_unknown_field": {"x": [1, None]}}
    if isinstance(value, list):
        return [_with_unknown_fields(v) for v in value]
    return value


def _variants(event: str, payload: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    yield "as is", payload
    yield "unknown fields", _with_unknown_fields(payload)
    for path in OPTIONAL.get(event, []):
        parent: Any = payload
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or path[-1] not in parent:
            continue
        for mode in ("null", "removed"):
            variant = copy.deepcopy(payload)
            target = variant
            for key in path[:-1]:
                target = target[key]
            if mode == "null":
                target[path[-1]] = None
            else:
                del target[path[-1]]
            yield f"{'.'.join(path)} {mode}", variant


@pytest.mark.parametrize("path", corpus(), ids=corpus_id)
async def test_every_corpus_payload_is_accepted_or_ignored_as_its_event_demands(
    receiver: WebhookReceiver, path: Path
) -> None:
    event = path.parent.name
    payload = json.loads(path.read_text())
    for what, variant in _variants(event, payload):
        status, answer = await asyncio.to_thread(deliver, receiver.url, receiver.config.webhook_secret, event, variant)
        _assert_answered_as_its_event_demands(event, status, answer, f"{corpus_id(path)} {what}")


@pytest.mark.parametrize(
    ("event", "name"),
    [("pull_request_review", "submitted"), ("pull_request_review", "dismissed"), ("pull_request", "closed")],
)
async def test_corpus_pr_events_carrying_a_marker_on_someone_elses_pr_are_refused_403(
    hook: Hook, event: str, name: str
) -> None:
    """The documented refusal: a marker pasted into a PR the bot did not open decides nothing."""
    payload = hook.with_repository(json.loads((EXAMPLES / event / f"{name}.payload.json").read_text()))
    if "review" in payload:
        payload["review"]["state"] = "approved"
    payload["pull_request"]["merged"] = False
    payload["pull_request"]["body"] = f"Fixes it.\n\n{pull_marker(hook.run_id(3)).render()}"
    assert payload["pull_request"]["user"]["login"] != BOT
    answer = await hook.deliver(event, payload)
    assert answer.status == 403, answer
    assert "not by durafix" in answer.body["message"]
