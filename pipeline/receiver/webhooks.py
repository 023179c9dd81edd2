"""``durafix serve``: the GitHub webhook receiver.

Contract:
- Every delivery's ``X-Hub-Signature-256`` is checked (HMAC-SHA256 of the raw body with the shared secret,
  constant-time compare) before the body is parsed; a bad or missing signature gets 401 and does nothing.
- ``issues`` labelled with the trigger label (``labeled``, or ``opened``/``reopened`` already carrying it)
  start the run for that issue or attach to the one already running (the workflow ID is the issue's
  identity), but only when the delivery's sender holds at least ``trigger_permission`` (``triage``), read
  from the forge (``GitHubForge.get_role``); otherwise 403 and no run. The run gets the issue's title and
  body from the payload, pinned (``RepairInput.report``). A trigger for an issue whose runs all ended is a
  retry: it starts the issue's next run (``repair:o/r#N~k``, :func:`pipeline.client.retry_run`), said once on
  the issue (a comment keyed by the new run).
- ``issues`` ``closed``, or ``unlabeled`` removing the trigger label, cancel the issue's live run (its cleanup
  runs as on every ending), with the same permission as a trigger; 202 "no live run" when there is none.
- ``issues`` ``edited`` (title or body) for an issue with a live run becomes the ``report_edited`` signal:
  the ticket says so, and the run keeps the pinned text. (A signal: an edit is a note, the run keeps one per
  delivery, ``source`` ``webhook:<delivery>``, and it needs no worker to be heard.)
- ``issue_comment`` ``created`` whose body starts with ``/durafix <command>`` (:mod:`pipeline.receiver.commands`), on
  the issue or on durafix's own PR (marker and bot author, as below), by a sender with ``trigger_permission``
  (403 otherwise, nothing done; the bot's own comments are ignored): ``status`` answers in a comment with the
  run's phase, outcome, PR, pending head and budgets; ``cancel`` cancels the live run; ``retry`` starts the
  next run once the last one ended (200 "already running" otherwise; two racing retries start one run); an
  unknown command gets a comment listing the commands. Each answer comment is keyed by the command comment's
  ID, so a redelivery does not comment twice.
- ``pull_request_review`` counts only on durafix's own PR (its marker names a run of this repository and
  its author is the bot's login) and never from the bot itself (403 otherwise, nothing sent). ``submitted``
  ``approved`` becomes an approval naming the review's ``commit_id`` and the PR's number (the run refuses
  another PR's: 409 with its reason); ``changes_requested`` a rejection marked as a request for changes (the
  review's ID and ``commit_id``): the run revises while its revision budget lasts; ``dismissed`` a
  withdrawal. A decision that arrives while the run is still publishing (its PR exists, the evidence comment
  is not posted yet), naming its PR and the head it pushed, is held and acted on when the review wait
  begins. The merge re-reads the reviews on the forge anyway (``forge.merge``): what this sends is never the
  authority.
- ``pull_request`` ``closed`` without merging, on durafix's own PR (as above), rejects, naming whoever closed
  it (the forge let them: closing takes triage permission or authorship). ``synchronize`` on it by anyone but
  the bot tells the run its head moved (``head_moved`` with a :class:`~pipeline.state.HeadPush`); the bot's
  own push is the run's and is ignored.
- Every delivery is handled once, by whichever receiver and however often it arrives: each decision for a run
  (approval, rejection, withdrawal, head push, cancel command) is the run's ``deliver`` Update with the
  delivery's GUID (``X-GitHub-Delivery``) as its ID, so Temporal, which all receivers share, keeps its first
  outcome and answers a repeat with it, even after the run ended; the run records ``delivery -> first
  handling`` in ``RunState.deliveries``. A duplicate is answered ``{"duplicate": true, "first_handled":
  {...}}`` and nothing is done again (no second ``head_moved``, no second cancellation). A start is deduped by
  the workflow ID, and a redelivered trigger by the trigger recorded in the memo of each of the issue's runs.
- A replay starts and cancels nothing (:mod:`pipeline.replays`; the GUID is a header outside the signature, so
  the signed payload's own time is judged too): a trigger, ``closed``/``unlabeled`` or command whose event is
  older than ``delivery_max_age_s`` (3 days), a cancel older than the live run's start, and a trigger older
  than the start of the issue's newest, ended run are answered 409 ``{"stale": true, ...}``. The GUID records
  live in Temporal, with the runs, shared by every receiver and kept across their restarts.
- Anyone who can see a repository may submit a review, so before a decision reaches the run the reviewer's
  permission on the delivery's repository is read from the forge (``GitHubForge.get_permission``, one
  adapter per request). Below ``approver_permission`` (``write`` by default, or ``admin``) the answer is
  403 naming reviewer, permission and what is required. For every forge read (role, permission, bot login):
  a forge that cannot answer now gives 503, a repository or user the forge does not know (named by the
  payload) 422, a forge that refuses the read otherwise (a bad token) 502, a receiver without a forge token
  500. In every one of these cases nothing is sent.
- The HTTP side is bounded (``pipeline.receiver.server``, ``pipeline.receiver.protocol``,
  ``pipeline.receiver.app``): ``Content-Length`` missing (411), malformed or negative (400) or over
  ``MAX_BODY`` (413) is refused before the body is read; the request head and then the body must arrive
  within ``ReceiverLimits.read_timeout_s`` (closed, resp. 408); at most ``ReceiverLimits.max_connections``
  connections are served at once, one more gets 503 with ``Retry-After``. So connections that send headers and
  no body are closed after the read timeout and never starve a delivery.
- Answers within GitHub's 10 s: the receiver makes a few forge reads (and at most one keyed comment) and
  talks to Temporal, never waits for the run beyond an Update's handling (which needs a workflow worker: with
  none, the answer is 503 and the delivery can be redelivered).
- GitHub does not retry failed deliveries: a receiver that was down misses events until they are
  redelivered (the hook-delivery API) or the issue is re-labelled.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import threading
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import anyio.to_thread
from starlette.routing import BaseRoute
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from pipeline import client as runs
from pipeline import tracing
from pipeline.config import DurafixConfig
from pipeline.ops.reconciler import Reconciler
from pipeline.receiver.app import ReceiverApp
from pipeline.receiver.comments import CommentEvents
from pipeline.receiver.handling import EngineUnreachable, Refused
from pipeline.receiver.logs import delivery_logger
from pipeline.receiver.metrics import ReceiverMetrics
from pipeline.receiver.reviews import ReviewEvents
from pipeline.receiver.server import ReceiverLimits, ReceiverServer
from pipeline.services import Services
from pipeline.temporal_connection import connect_options
from reviews.errors import ForgeError

MAX_BODY = ReceiverLimits().max_body
T = TypeVar("T")
READINESS_REPOSITORY = "durafix/readiness"


def signature_ok(secret: str, body: bytes | bytearray, header: str | None) -> bool:
    if not secret or not header or not header.startswith("sha256="):
        return False
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    # Compare bytes: a header with non-ASCII characters is a bad signature, not a crash.
    return hmac.compare_digest(expected.encode(), header.removeprefix("sha256=").encode("utf-8", "replace"))


class WebhookReceiver(CommentEvents, ReviewEvents):
    """The dispatcher behind ``POST /webhook``, and the receiver process around it.

    The transport is :mod:`pipeline.receiver.server` (uvicorn, guarded) and :mod:`pipeline.receiver.app`
    (Starlette routes: ``/webhook``, ``/healthz``, ``/readyz``, ``/metrics``). This class owns an asyncio loop
    on a thread for the Temporal client: the dispatcher runs on the app's worker threads and talks to Temporal
    only through :meth:`_run`, which submits to that loop. The client is connected in the background at start
    and again on the next need after a failure, so a receiver started while Temporal is down serves
    ``/healthz``, answers ``/readyz`` ``503`` and deliveries that need Temporal ``503`` until it is back.
    ``metrics`` is the receiver's registry; the reconciler reports through ``metrics.reconciled(at)``.
    """

    def __init__(
        self,
        config: DurafixConfig,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: ReceiverLimits | None = None,
        pages: Callable[[WebhookReceiver], Sequence[BaseRoute]] | None = None,
    ) -> None:
        """``pages``: routes served besides the receiver's own, made with this receiver (whose
        :meth:`with_client` reaches Temporal)."""
        self.config = config
        self.limits = limits or ReceiverLimits(buffer_budget=config.receiver_buffer_bytes)
        # Settings that cannot work (e.g. an API key without TLS, a GitHub App key that cannot be read) fail
        # here, not on the first delivery.
        connect_options(config)
        # One GitHub App token source for every request: each gets a fresh adapter but shares the tokens.
        self._github_app = Services(config).github_app
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="webhook-loop", daemon=True)
        self._loop_thread.start()
        self._client_lock = threading.Lock()
        self._connecting: Future[Client] = asyncio.run_coroutine_threadsafe(runs.connect(config), self._loop)
        self.metrics = ReceiverMetrics()
        self._app = ReceiverApp(
            self,
            {"temporal": self._temporal_ready, "forge": self._forge_ready},
            self.limits,
            self.metrics,
            delivery_logger(),
            pages(self) if pages is not None else (),
        )
        self._server = ReceiverServer(self._app.asgi, host, port, self.limits, self._app.refused)
        self._reconciler: Reconciler | None = None
        self._reconciling: Future[None] | None = None

    @property
    def url(self) -> str:
        host, port = self._server.address
        return f"http://{_url_host(host)}:{port}/webhook"

    async def with_client(self, fn: Callable[[Client], Awaitable[T]]) -> T:
        """``fn`` run with the receiver's Temporal client on the receiver's loop, awaited from any loop (a
        page's handler runs on the server's)."""

        async def on_loop() -> T:
            return await fn(await asyncio.wrap_future(self._connection()))

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(on_loop(), self._loop))

    def start(self) -> None:
        """Serve on a thread; returns once listening."""
        self._server.start()

    def serve_forever(self) -> None:
        """Serve on the calling thread until :meth:`stop` or SIGINT/SIGTERM."""
        self._server.serve_forever()

    def start_reconciler(self, interval_s: float | None = None) -> None:
        """Run the reconciler (:mod:`pipeline.ops.reconciler`) on the receiver's loop: a pass as soon as Temporal is
        connected, then every ``interval_s`` (default ``config.reconcile_interval_s``). Each finished pass is
        reported to ``metrics`` (``durafix_reconciler_lag_seconds``), so a stuck reconciler shows as a growing
        lag. While Temporal cannot be reached the connection is tried again every few seconds."""
        interval = interval_s or self.config.reconcile_interval_s

        async def when_connected() -> None:
            while True:
                try:
                    client = await asyncio.wrap_future(self._connection())
                    break
                except Exception:
                    # The connection is retried below; /readyz says meanwhile that Temporal is not reachable.
                    await asyncio.sleep(min(5.0, interval))
            self._reconciler = Reconciler(
                client,
                self.config,
                interval,
                on_pass=lambda report: self.metrics.reconciled(report.finished_at or datetime.now(UTC)),
            )
            await self._reconciler.run()

        self._reconciling = asyncio.run_coroutine_threadsafe(when_connected(), self._loop)

    def stop(self) -> None:
        """Stop serving, the reconciler and the Temporal loop; idempotent."""
        if self._reconciler is not None:
            self._reconciler.stop()
        if self._reconciling is not None:
            self._reconciling.cancel()
        self._server.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)

    # ---- readiness (run on the server's loop, bounded by ``ReceiverLimits.ready_timeout_s``) ------------

    async def _temporal_ready(self) -> None:
        """Temporal answers a health check on the receiver's own connection."""
        # Shielded: a readiness check that times out must not cancel the connection attempt under way.
        client = await asyncio.shield(asyncio.wrap_future(self._connection()))
        check = client.service_client.check_health(timeout=timedelta(seconds=self.limits.ready_timeout_s))
        if not await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(check, self._loop)):
            raise EngineUnreachable("Temporal answers but its workflow service is not serving")

    async def _forge_ready(self) -> None:
        """The forge answers with the receiver's credentials: who the token is (``GitHubForge.login``, a real
        read on a fresh adapter, so not a cached answer), or for a GitHub App, the App itself (``GET /app``)."""
        if not self.config.forge_credentials_configured():
            raise ForgeError("no forge token or GitHub App configured")
        await anyio.to_thread.run_sync(self._forge_login)

    def _forge_login(self) -> None:
        fresh = Services(self.config).github_app
        if fresh is not None:
            # An App has no repository-free identity read but its own: the installation differs per repository.
            fresh.bot_login()
            return
        # login() reads the token's user and never the repository: any name does for the adapter.
        with Services(self.config).forge(READINESS_REPOSITORY) as forge:
            forge.login()

    # ---- request handling (``pipeline.receiver.app.Delivery``) -----------------------------------------

    def verified(self, body: bytes | bytearray, signature: str | None) -> bool:
        return signature_ok(self.config.webhook_secret, body, signature)

    def answer(self, event: str, delivery: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The answer to a verified delivery's ``payload``: the dispatcher's, or the status an exception it
        raised maps to (404 a run Temporal does not know, 503 Temporal not reachable, 400 a payload lacking
        or mistyping what its event carries). Handled inside the delivery's span (:mod:`pipeline.tracing`), which
        a run the delivery starts or commands continues."""
        with tracing.delivery_span(event, delivery, payload.get("action")):
            return self._handle(event, delivery, payload)

    def _handle(self, event: str, delivery: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            return self._dispatch(event, delivery, payload)
        except Refused as refused:
            return refused.status, refused.body
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
            # AttributeError: a field of the wrong JSON type (a string where an object belongs) met ``.get``.
            return 400, {"message": f"payload lacks what a {event} event carries: {err!r}"}
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return 404, {"message": f"no such run: {err.message}"}
            return 503, {"message": f"could not reach the workflow engine: {err}"}
        except (WorkflowUpdateFailedError, TimeoutError, EngineUnreachable) as err:
            return 503, {"message": f"could not reach the workflow engine: {err}"}

    def _dispatch(self, event: str, delivery: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        # Without a GUID (not GitHub's) a delivery cannot be recognised again: it is its own delivery.
        delivery = delivery or f"local-{uuid.uuid4()}"
        if event == "ping":
            return 200, {"message": "pong"}
        if event == "issues":
            return self._on_issue(delivery, payload)
        if event == "issue_comment":
            return self._on_comment(delivery, payload)
        if event == "pull_request_review":
            return self._on_review(delivery, payload)
        if event == "pull_request":
            return self._on_pull(delivery, payload)
        return 202, {"message": f"ignored event {event}"}


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
