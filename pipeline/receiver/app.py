"""The receiver's ASGI app (Starlette): ``POST /webhook``, ``GET /healthz``, ``GET /readyz``, ``GET /metrics``, and
the pages the process serves besides (``pages``: ``durafix serve``'s runs page, :mod:`pipeline.cli.runs_page`).

Contract of ``POST /webhook``, in this order, each step before the next is tried:
1. ``Content-Length`` judged (``body_length``): missing ``411``, malformed ``400``, over ``max_body`` ``413``;
   nothing of the body has been read yet (the connection guard judged it once already, see
   :mod:`pipeline.receiver.protocol`; this holds for any server the app runs under).
2. Room for the declared body in the budget of unverified bytes (``BodyBudget``, ``buffer_budget`` across
   all connections): ``503`` with ``Retry-After`` when there is none, before a byte of the body is read. The
   room is held until the signature was checked.
3. The body read in full within ``read_timeout_s`` (``408`` otherwise; a client that went away gets nothing).
4. ``X-Hub-Signature-256`` checked over the raw body (``401``): nothing of a delivery without the secret is
   parsed, dispatched or trusted, not even its event name as a metrics label.
5. The body parsed: not JSON (or nested beyond the parser) ``400``; not an object ``400``.
6. The dispatcher (``Delivery.answer``) run on a worker thread, since it blocks on the forge and on Temporal;
   at most ``max_connections`` at once. It answers ``(status, body)``; an exception it lets out is a bug and
   is answered ``500`` with a generic message (logged with its type, never the payload).
Every answer (Starlette's 404 and 405 too) is JSON, carries ``Connection: close`` (one delivery per connection,
as GitHub sends them), is counted in :class:`~pipeline.receiver.metrics.ReceiverMetrics` and logged as one JSON
line.

``GET /healthz`` is ``200`` while the process serves. ``GET /readyz`` runs every readiness probe at once, each
bounded by ``ready_timeout_s``: ``200`` when all pass, else ``503`` naming each that did not and why.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from pipeline.receiver.limits import BodyBudget, BodyRefused, ReceiverLimits, body_length
from pipeline.receiver.logs import log_delivery
from pipeline.receiver.metrics import ReceiverMetrics, label

Probe = Callable[[], Awaitable[None]]
CLOSE = {"Connection": "close"}


class Delivery(Protocol):
    """What the app hands a verified, parsed delivery to (``pipeline.receiver.webhooks.WebhookReceiver``)."""

    def verified(self, body: bytes | bytearray, signature: str | None) -> bool: ...

    def answer(self, event: str, delivery: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]: ...


@dataclass
class _Outcome:
    status: int
    body: dict[str, Any]
    verified: bool = False
    action: object = None
    headers: dict[str, str] | None = None


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (404 unknown path, 405 wrong method) in the receiver's terms: JSON, closing."""
    assert isinstance(exc, HTTPException)
    return JSONResponse({"message": exc.detail}, exc.status_code, headers={**(exc.headers or {}), **CLOSE})


class ReceiverApp:
    """The routes above, over one dispatcher, its readiness probes, metrics and logger."""

    def __init__(
        self,
        delivery: Delivery,
        probes: Mapping[str, Probe],
        limits: ReceiverLimits,
        metrics: ReceiverMetrics,
        logger: logging.Logger,
        pages: Sequence[BaseRoute] = (),
    ) -> None:
        self.delivery = delivery
        self.probes = dict(probes)
        self.limits = limits
        self.metrics = metrics
        self.logger = logger
        self._workers = anyio.CapacityLimiter(limits.max_connections)
        self.budget = BodyBudget(limits)
        self.asgi = Starlette(
            routes=[
                Route("/webhook", self.webhook, methods=["POST"]),
                Route("/healthz", self.healthz, methods=["GET"]),
                Route("/readyz", self.readyz, methods=["GET"]),
                Route("/metrics", self.metrics_page, methods=["GET"]),
                *pages,
            ],
            exception_handlers={HTTPException: _http_error},
        )

    # ---- POST /webhook --------------------------------------------------------------------------------

    async def webhook(self, request: Request) -> Response:
        started = time.monotonic()
        event = request.headers.get("x-github-event", "")
        delivery = request.headers.get("x-github-delivery", "")
        outcome = await self._judge(request, event, delivery)
        seconds = time.monotonic() - started
        event_label = label(event, outcome.verified)
        action_label = label(outcome.action, outcome.verified) if outcome.verified else ""
        self.metrics.delivered(event_label, action_label, outcome.status, seconds)
        log_delivery(
            self.logger,
            delivery=delivery,
            event=event,
            action=action_label,
            status=outcome.status,
            duration_ms=seconds * 1000,
            message=outcome.body.get("message", ""),
        )
        return JSONResponse(outcome.body, outcome.status, headers={**(outcome.headers or {}), **CLOSE})

    async def _judge(self, request: Request, event: str, delivery: str) -> _Outcome:
        try:
            length = body_length(request.headers.get("content-length"), self.limits.max_body)
        except BodyRefused as refused:
            return _Outcome(refused.status, {"message": refused.message})
        if not self.budget.reserve(length):
            # Nothing of the body is read: the bytes other unverified bodies hold are all the receiver takes.
            return _Outcome(
                503,
                {"message": f"the receiver holds as many unverified bytes as it takes ({length} more refused); retry"},
                headers={"Retry-After": "1"},
            )
        try:
            body = await self._read_body(request, length)
            if isinstance(body, _Outcome):
                return body
            verified = self.delivery.verified(body, request.headers.get("x-hub-signature-256"))
        finally:
            self.budget.release(length)
        if not verified:
            return _Outcome(401, {"message": "bad signature"})
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):
            # ValueError covers bad JSON and bytes that are not UTF-8/16/32; RecursionError a signed body
            # nested deeper than the parser goes.
            return _Outcome(400, {"message": "malformed JSON"}, verified=True)
        if not isinstance(payload, dict):
            return _Outcome(400, {"message": "payload is not a JSON object"}, verified=True)
        action = payload.get("action")
        try:
            status, answer = await anyio.to_thread.run_sync(
                self.delivery.answer, event, delivery, payload, limiter=self._workers
            )
        except Exception:
            self.logger.exception("webhook dispatcher failed on a %s delivery", label(event, True))
            return _Outcome(500, {"message": "internal error handling the delivery"}, True, action)
        return _Outcome(status, answer, True, action)

    async def _read_body(self, request: Request, length: int) -> bytearray | _Outcome:
        """The body, read in full within ``read_timeout_s``, or the refusal. One buffer, never copied: the
        budget counts ``length`` once."""
        body = bytearray()
        try:
            with anyio.fail_after(self.limits.read_timeout_s):
                async for chunk in request.stream():
                    body += chunk
                    if len(body) > length:
                        break
        except TimeoutError:
            return _Outcome(408, {"message": f"body not received within {self.limits.read_timeout_s} s"})
        except ClientDisconnect:
            return _Outcome(400, {"message": f"body ended after {len(body)} of {length} bytes"})
        if len(body) != length:
            return _Outcome(400, {"message": f"body ended after {len(body)} of {length} bytes"})
        return body

    # ---- GET /healthz, /readyz, /metrics ----------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "alive"}, headers=CLOSE)

    async def readyz(self, request: Request) -> Response:
        names = list(self.probes)
        results = await asyncio.gather(*(self._probe(name) for name in names))
        checks = dict(zip(names, results, strict=True))
        failing = {name: result for name, result in checks.items() if result != "ok"}
        if not failing:
            return JSONResponse({"ready": True, "checks": checks}, headers=CLOSE)
        message = "not ready: " + "; ".join(f"{name}: {why}" for name, why in failing.items())
        return JSONResponse({"ready": False, "checks": checks, "message": message}, 503, headers=CLOSE)

    async def _probe(self, name: str) -> str:
        """``"ok"``, or why the probe did not pass within ``ready_timeout_s``."""
        try:
            await asyncio.wait_for(self.probes[name](), self.limits.ready_timeout_s)
        except TimeoutError:
            return f"no answer within {self.limits.ready_timeout_s} s"
        except Exception as err:
            # A probe's failure is the answer, whatever it is: readiness never fails itself.
            return f"{type(err).__name__}: {err}"[:300]
        return "ok"

    async def metrics_page(self, request: Request) -> Response:
        return Response(self.metrics.render(), headers={"Content-Type": self.metrics.content_type, **CLOSE})

    def refused(self, event: str, status: int, message: str) -> None:
        """A refusal of the connection guard (``on_refusal``), counted and logged like an app answer; no
        header of such a request is trusted, so its event label is ``unverified`` (or empty without a head)."""
        event_label = label(event, False) if event else ""
        self.metrics.delivered(event_label, "", status, 0.0)
        log_delivery(self.logger, delivery="", event=event, action="", status=status, duration_ms=0.0, message=message)
