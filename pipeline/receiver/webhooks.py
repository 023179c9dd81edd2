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
- A replay starts and cancels nothing (:mod:`pipeline.receiver.replays`; the GUID is a header outside the signature, so
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
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import anyio.to_thread
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from pipeline import client as runs
from pipeline.config import DurafixConfig
from pipeline.ids import is_run_of, parse_run_id, workflow_id_for
from pipeline.inputs import PinnedReport
from pipeline.ops.reconciler import Reconciler
from pipeline.receiver.app import ReceiverApp
from pipeline.receiver.commands import CommandName, help_text, no_run_text, parse_command, status_text
from pipeline.receiver.logs import delivery_logger
from pipeline.receiver.metrics import ReceiverMetrics
from pipeline.receiver.replays import before_run, event_time, stale_answer, too_old
from pipeline.receiver.server import ReceiverLimits, ReceiverServer
from pipeline.services import Services
from pipeline.state import (
    Approval,
    Delivered,
    DeliveryAck,
    DeliveryKind,
    HeadPush,
    Rejection,
    ReportEdit,
    Withdrawal,
)
from pipeline.temporal_connection import connect_options
from reviews.adapter import GitHubForge
from reviews.errors import ForgeError, ForgeNotFoundError, ForgeTransientError
from reviews.markers import PULL, find_marker
from reviews.permissions import permission_at_least, role_at_least

T = TypeVar("T")
MAX_BODY = ReceiverLimits().max_body
READINESS_REPOSITORY = "durafix/readiness"


def signature_ok(secret: str, body: bytes | bytearray, header: str | None) -> bool:
    if not secret or not header or not header.startswith("sha256="):
        return False
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    # Compare bytes: a header with non-ASCII characters is a bad signature, not a crash.
    return hmac.compare_digest(expected.encode(), header.removeprefix("sha256=").encode("utf-8", "replace"))


class EngineUnreachable(Exception):
    """The receiver has no connection to Temporal now (it was down at start, or its address is wrong)."""


class WebhookReceiver:
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
    ) -> None:
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
        )
        self._server = ReceiverServer(self._app.asgi, host, port, self.limits, self._app.refused)
        self._reconciler: Reconciler | None = None
        self._reconciling: Future[None] | None = None

    @property
    def url(self) -> str:
        host, port = self._server.address
        return f"http://{_url_host(host)}:{port}/webhook"

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

    @property
    def _client(self) -> Client:
        """The Temporal client, waiting up to 8 s for the connection under way; after a failed connection the
        next caller starts another (``EngineUnreachable`` meanwhile, answered 503)."""
        return self._run_future(self._connection(), 8)

    def _connection(self) -> Future[Client]:
        with self._client_lock:
            failed = self._connecting.done() and (
                self._connecting.cancelled() or self._connecting.exception() is not None
            )
            if failed:
                self._connecting = asyncio.run_coroutine_threadsafe(runs.connect(self.config), self._loop)
            return self._connecting

    @staticmethod
    def _run_future(future: Future[Client], timeout: float) -> Client:
        try:
            return future.result(timeout=timeout)
        except TimeoutError as err:
            raise EngineUnreachable(f"no connection to Temporal within {timeout} s") from err
        except Exception as err:
            # temporalio reports a failed connect as RuntimeError; whatever it is, there is no client now.
            raise EngineUnreachable(f"cannot connect to Temporal: {err}") from err

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout=8)
        except TimeoutError:
            # An Update no worker answers would otherwise stay pending on the loop after the answer is given.
            future.cancel()
            raise

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
        or mistyping what its event carries)."""
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

    # ---- what reaches a run -------------------------------------------------------------------------

    def _send(self, workflow_id: str, delivered: Delivered) -> tuple[DeliveryAck, dict[str, Any] | None]:
        """``delivered`` to the run as the ``deliver`` Update (ID: the delivery's GUID), and the answer to
        give instead of acting further when it was a duplicate (``duplicate``, ``first_handled``)."""
        ack = self._run(runs.deliver(self._client, workflow_id, delivered))
        if not ack.duplicate_of(delivered):
            return ack, None
        return ack, {
            "workflow_id": workflow_id,
            "duplicate": True,
            "first_handled": ack.first.model_dump(mode="json"),
            "message": f"delivery {delivered.delivery} was handled already: {ack.first.what}",
        }

    def _sent(self, workflow_id: str, delivered: Delivered) -> tuple[int, dict[str, Any]]:
        """:meth:`_send` answered: 200 naming what the run did (the first handling, for a duplicate)."""
        ack, duplicate = self._send(workflow_id, delivered)
        if duplicate is not None:
            return 200, duplicate
        return 200, {"workflow_id": workflow_id, "duplicate": False, "handled": ack.first.model_dump(mode="json")}

    def _live_run(self, repository: str, number: int) -> runs.RunOfIssue | None:
        newest = self._run(runs.newest_run(self._client, repository, number))
        if newest is None or newest.status != WorkflowExecutionStatus.RUNNING:
            return None
        return newest

    def _sender_refusal(
        self, repository: str, sender: str, doing: str, undone: str = "nothing was done"
    ) -> tuple[int, dict[str, Any]] | None:
        """None when ``sender`` holds at least ``trigger_permission``; else the 403 saying so (or the forge
        read's :class:`Refused`)."""
        required = self.config.trigger_permission
        role = self._with_forge(
            repository,
            f"{sender}'s role on {repository} could not be checked, {undone}",
            lambda forge: forge.get_role(sender),
        )
        if role_at_least(role, required):
            return None
        return 403, {
            "sender": sender,
            "role": role,
            "required": required,
            "message": f"{sender} has the {role} role on {repository}; {doing} requires {required} or more: {undone}",
        }

    # ---- issues -------------------------------------------------------------------------------------

    def _on_issue(self, delivery: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        action = payload.get("action")
        if action == "edited":
            return self._on_edit(delivery, payload)
        label = self.config.trigger_label
        issue = payload.get("issue") or {}
        labels = {lbl.get("name") for lbl in issue.get("labels") or []}
        withdrawn = action == "closed" or (action == "unlabeled" and (payload.get("label") or {}).get("name") == label)
        triggered = (action == "labeled" and (payload.get("label") or {}).get("name") == label) or (
            action in ("opened", "reopened") and label in labels
        )
        if not (withdrawn or triggered):
            return 202, {"message": f"issues.{action} without the {label!r} label: ignored"}
        at = event_time("issues", payload)
        old = self._too_old(f"issues.{action}", at)
        if old is not None:
            return old
        if withdrawn:
            return self._on_withdrawn_trigger(delivery, payload, f"issues.{action}", at)
        repository = payload["repository"]["full_name"]
        number = int(issue["number"])
        # Who triggered: the account that added the label or opened the issue (issue forms put labels on for
        # anyone who opens one), never the issue's author as such.
        sender = str(payload["sender"]["login"])
        refusal = self._sender_refusal(repository, sender, "starting a durafix run", "no run was started")
        if refusal is not None:
            return refusal
        return self._start(delivery, repository, number, sender, pinned_from(issue, sender), at)

    def _too_old(self, what: str, at: datetime | None) -> tuple[int, dict[str, Any]] | None:
        """The 409 for a delivery whose event is older than ``delivery_max_age_s``
        (:mod:`pipeline.receiver.replays`)."""
        max_age = self.config.delivery_max_age_s
        if at is None or not too_old(at, datetime.now(UTC), max_age):
            return None
        return stale_answer(what, at, f"more than {max_age:g} s old (DURAFIX_DELIVERY_MAX_AGE_S)")

    def _start(
        self,
        delivery: str,
        repository: str,
        number: int,
        sender: str,
        pinned: PinnedReport | None,
        at: datetime | None,
    ) -> tuple[int, dict[str, Any]]:
        """Start the issue's first run, attach to its live run, or (its runs all ended) start the next one:
        a trigger on an ended report is a retry. A delivery that already started one of the issue's runs
        (redelivered or replayed) is answered as the duplicate it is, and one whose event ``at`` happened before
        the newest, ended run started as the replay it is (409): neither starts anything."""
        trigger = f"webhook:{delivery}"
        retry = self._run(
            runs.retry_run(self._client, self.config, repository, number, trigger=trigger, report=pinned, event_at=at)
        )
        if retry.stale and at is not None:
            return stale_answer(
                "the trigger",
                at,
                f"older than {retry.workflow_id}, which started at {retry.started_at} and ended",
                workflow_id=retry.workflow_id,
            )
        if retry.duplicate:
            return 200, {
                "workflow_id": retry.workflow_id,
                "duplicate": True,
                "first_handled": {"delivery": delivery, "what": f"started {retry.workflow_id}"},
                "message": f"delivery {delivery} already started {retry.workflow_id}",
            }
        if retry.started is None:
            return 202, {
                "workflow_id": retry.workflow_id,
                "run_id": retry.run_id,
                "attached": True,
                "message": f"{retry.workflow_id} is already running",
            }
        started = retry.started
        answer: dict[str, Any] = {
            "workflow_id": started.workflow_id,
            "run_id": started.run_id,
            "attached": started.attached,
        }
        if retry.retry_of is not None:
            answer["retry_of"] = retry.retry_of
            answer["comment"] = self._say_retry(repository, number, sender, retry.retry_of, started.workflow_id)
        return 202, answer

    def _say_retry(self, repository: str, number: int, sender: str, earlier: str, workflow_id: str) -> str:
        """Say on the issue, once per new run (a keyed comment), that a new run started after the earlier one
        ended; what the comment write did, or why it failed (the run started either way)."""
        body = (
            f"durafix starts a new run on this report (`{workflow_id}`), asked by @{sender}: the earlier run "
            f"`{earlier}` ended (its outcome is in its status comment above). The new run works on its own "
            "branch and PR."
        )
        try:
            ref = self._with_forge(
                repository,
                f"the issue could not be told that {workflow_id} started",
                lambda forge: forge.ensure_comment(number, f"{workflow_id}:retry", body),
            )
        except Refused as refused:
            return str(refused.body["message"])
        return ref.action

    def _on_withdrawn_trigger(
        self, delivery: str, payload: dict[str, Any], what: str, at: datetime | None
    ) -> tuple[int, dict[str, Any]]:
        """The issue closed, or the trigger label removed: the live run is cancelled (its cleanup runs as on
        every ending). Takes ``trigger_permission``, like a trigger."""
        repository = payload["repository"]["full_name"]
        number = int(payload["issue"]["number"])
        sender = str(payload["sender"]["login"])
        refusal = self._sender_refusal(repository, sender, "cancelling a durafix run")
        if refusal is not None:
            return refusal
        return self._cancel(delivery, repository, number, sender, what, at)

    def _cancel(
        self, delivery: str, repository: str, number: int, sender: str, what: str, at: datetime | None
    ) -> tuple[int, dict[str, Any]]:
        """Cancel the issue's live run, once per delivery (its GUID is the ``deliver`` Update's ID). An event
        ``at`` from before the live run started is about an earlier run: refused as a replay (409)."""
        live = self._live_run(repository, number)
        if live is None:
            return 202, {"message": f"no live run for #{number}: nothing to cancel"}
        if at is not None and before_run(at, live.started_at):
            return stale_answer(
                what,
                at,
                f"older than {live.workflow_id}, which started at {live.started_at}",
                workflow_id=live.workflow_id,
            )
        delivered = Delivered(
            delivery=delivery, attempt=uuid.uuid4().hex, kind=DeliveryKind.COMMAND, sender=sender, command="cancel"
        )
        try:
            _, duplicate = self._send(live.workflow_id, delivered)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            return 202, {"message": f"no live run for #{number}: nothing to cancel"}
        if duplicate is not None:
            return 200, duplicate
        self._run(runs.cancel(self._client, live.workflow_id))
        return 200, {"workflow_id": live.workflow_id, "message": f"{what} by {sender}: the run is cancelled"}

    def _on_edit(self, delivery: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """An edit of the report's title or body after its trigger: the live run (if any) is told, so its
        ticket says so; the run keeps the text pinned at its trigger. Anyone who may edit the issue may cause
        this note, which is all it causes."""
        fields = sorted(name for name in ("title", "body") if name in (payload.get("changes") or {}))
        if not fields:
            return 202, {"message": "issues.edited without a title or body change: ignored"}
        repository = payload["repository"]["full_name"]
        number = int(payload["issue"]["number"])
        live = self._live_run(repository, number)
        if live is None:
            return 202, {
                "workflow_id": workflow_id_for(repository, number),
                "message": "no live run for this issue: nothing to note",
            }
        # A signal, not a ``deliver`` Update: an edit is a note, not a decision, and the run's handler keeps
        # one note per source (``webhook:<delivery>``), so a redelivery notes nothing twice; and a signal
        # needs no worker to answer, so an edit made before any worker picked the run up is not lost.
        edit = ReportEdit(
            editor=str(payload["sender"]["login"]), fields=fields, at=datetime.now(UTC), source=f"webhook:{delivery}"
        )
        try:
            self._run(runs.report_edited(self._client, live.workflow_id, edit))
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            return 202, {"workflow_id": live.workflow_id, "message": "no live run for this issue: nothing to note"}
        return 200, {"workflow_id": live.workflow_id, "message": f"edit of {' and '.join(fields)} noted on the run"}

    # ---- comment commands ---------------------------------------------------------------------------

    def _on_comment(self, delivery: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """``/durafix <command>`` in a new comment on an issue, or on a durafix PR (its run's issue is meant).
        The bot's own comments are never commands; a commander needs ``trigger_permission``. Every answer on
        the forge is a comment keyed by the command comment's ID, so a redelivery does not comment twice."""
        comment = payload.get("comment") or {}
        command = parse_command(comment.get("body"))
        if payload.get("action") != "created" or command is None:
            return 202, {"message": "not a new /durafix command: ignored"}
        at = event_time("issue_comment", payload)
        old = self._too_old(f"/durafix {command.name}", at)
        if old is not None:
            return old
        repository = payload["repository"]["full_name"]
        issue = payload["issue"]
        author = str((comment.get("user") or {}).get("login") or "")
        bot = self._with_forge(
            repository, "durafix's bot login could not be read, the command was not run", lambda forge: forge.login()
        )
        if author == bot:
            return 202, {"message": f"a comment by durafix's own login {bot}: ignored"}
        number = int(issue["number"])
        pinned: PinnedReport | None = pinned_from(issue, author)
        if issue.get("pull_request") is not None:
            # On a PR: only durafix's own PR names a run (its marker, and the bot as its author).
            marker = find_marker(issue.get("body"), PULL)
            workflow_id = marker.attrs.get("run", "") if marker is not None else ""
            if not is_run_of(workflow_id, repository) or str((issue.get("user") or {}).get("login") or "") != bot:
                return 202, {"message": f"a command on PR #{number}, which is not a durafix PR: ignored"}
            number, pinned = parse_run_id(workflow_id)[1], None
        refusal = self._sender_refusal(repository, author, f"the /durafix {command.name} command")
        if refusal is not None:
            return refusal
        key = f"command:{comment['id']}"
        if command.known == CommandName.CANCEL:
            return self._cancel(delivery, repository, number, author, "/durafix cancel", at)
        if command.known == CommandName.RETRY:
            return self._retry_command(delivery, repository, number, author, pinned, key, at)
        if command.known == CommandName.STATUS:
            newest = self._run(runs.newest_run(self._client, repository, number))
            if newest is None:
                body, answer = no_run_text(number), {"message": f"no run for #{number}"}
            else:
                state = self._run(runs.get_state(self._client, newest.workflow_id))
                body, answer = status_text(state), {"workflow_id": newest.workflow_id, "phase": state.phase.value}
        else:
            body, answer = help_text(command), {"message": f"unknown command {command.name!r}"}
        answer["comment"] = self._comment(repository, number, key, body)
        return 200, answer

    def _retry_command(
        self,
        delivery: str,
        repository: str,
        number: int,
        sender: str,
        pinned: PinnedReport | None,
        key: str,
        at: datetime | None,
    ) -> tuple[int, dict[str, Any]]:
        status, answer = self._start(delivery, repository, number, sender, pinned, at)
        if answer.get("attached"):
            answer["message"] = f"already running: {answer['workflow_id']}"
            status = 200
            answer["comment"] = self._comment(
                repository,
                number,
                key,
                f"`{answer['workflow_id']}` is already running on this report: `/durafix retry` starts a new run "
                "only once it ended (`/durafix cancel` ends it).",
            )
        return status, answer

    def _comment(self, repository: str, number: int, key: str, body: str) -> str:
        """A keyed comment on issue ``number`` (written once per key); what the write did."""
        ref = self._with_forge(
            repository,
            f"the answer could not be written on #{number}",
            lambda forge: forge.ensure_comment(number, key, body),
        )
        return ref.action

    def _with_forge(self, repository: str, unchecked: str, read: Callable[[GitHubForge], T]) -> T:
        """``read`` (or an idempotent write) on a fresh adapter for ``repository``, or :class:`Refused` saying
        why ``unchecked``: 500 without a forge token, 503 when the forge does not answer now (redeliver later),
        422 when the repository or user the payload names is not found (a payload naming what the forge does not
        show durafix: the sender's, not the receiver's failure), 502 when it refuses otherwise (a bad token)."""
        if not self.config.forge_credentials_configured():
            raise Refused(500, {"message": f"no forge token or GitHub App configured: {unchecked}"})
        # A fresh adapter per request: requests run on their own threads and a PyGithub client is not
        # thread-safe; closing it releases its connections.
        try:
            with Services(self.config, github_app=self._github_app).forge(repository) as forge:
                return read(forge)
        except ForgeTransientError as err:
            raise Refused(503, {"message": f"forge unavailable: {unchecked}: {err}"}) from err
        except ForgeNotFoundError as err:
            raise Refused(
                422, {"message": f"the forge does not know what the payload names: {unchecked}: {err}"}
            ) from err
        except ForgeError as err:
            raise Refused(502, {"message": f"forge refused the read: {unchecked}: {err}"}) from err

    def _on_review(self, delivery: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        action = payload.get("action")
        review = payload.get("review") or {}
        pr = payload.get("pull_request") or {}
        marker = find_marker(pr.get("body"), PULL)
        if action not in ("submitted", "dismissed") or marker is None or "run" not in marker.attrs:
            return 202, {"message": "not a submitted or dismissed review of a durafix PR: ignored"}
        repository = payload["repository"]["full_name"]
        workflow_id = marker.attrs["run"]
        if not is_run_of(workflow_id, repository):
            return 403, {"message": f"PR marker names {workflow_id}, which is not a run of this repository"}
        state = str(review.get("state", "")).lower()
        if action == "submitted" and state not in ("approved", "changes_requested"):
            return 202, {"message": f"review state {state}: ignored"}
        # No fallback name: a decision must be attributable to the account whose permission was read.
        reviewer = str(review["user"]["login"])
        number = int(pr["number"])
        bot, refused = self._bot_authored(repository, pr, workflow_id)
        if refused is not None:
            return refused
        if reviewer == bot:
            return 403, {"workflow_id": workflow_id, "message": f"a review by durafix's own login {bot} never counts"}
        attempt = uuid.uuid4().hex
        if action == "dismissed":
            # Withdrawing takes no permission to be heard: it only ever takes an approval away.
            withdrawal = Withdrawal(
                review_id=str(review.get("id")),
                reviewer=reviewer,
                dismissed_by=str((payload.get("sender") or {}).get("login") or ""),
                pr_number=number,
            )
            return self._sent(
                workflow_id,
                Delivered(
                    delivery=delivery,
                    attempt=attempt,
                    kind=DeliveryKind.WITHDRAWAL,
                    sender=withdrawal.dismissed_by,
                    withdrawal=withdrawal,
                ),
            )
        refusal = self._refuse_reviewer(repository, reviewer, workflow_id)
        if refusal is not None:
            return refusal
        if state == "approved":
            approval = Approval(
                reviewer=reviewer,
                head_sha=review["commit_id"],
                source="webhook",
                review_id=str(review.get("id")),
                pr_number=number,
                **self.config.approval_policy_in_force().stamp(review.get("submitted_at")),
            )
            delivered = Delivered(
                delivery=delivery, attempt=attempt, kind=DeliveryKind.APPROVAL, sender=reviewer, approval=approval
            )
            try:
                ack, duplicate = self._send(workflow_id, delivered)
            except WorkflowUpdateFailedError as err:
                return 409, {"workflow_id": workflow_id, "message": f"approval refused: {err.cause or err}"}
            if duplicate is not None:
                return 200, duplicate
            return 200, {"workflow_id": workflow_id, "accepted": True, "duplicate": False, "detail": ack.first.what}
        rejection = Rejection(
            reviewer=reviewer,
            reason=str(review.get("body") or "changes requested"),
            source="webhook",
            pr_number=number,
            changes_requested=True,
            review_id=str(review.get("id")),
            head_sha=str(review.get("commit_id") or "") or None,
        )
        return self._sent(
            workflow_id,
            Delivered(
                delivery=delivery, attempt=attempt, kind=DeliveryKind.REJECTION, sender=reviewer, rejection=rejection
            ),
        )

    def _on_pull(self, delivery: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """A durafix PR closed without merging rejects its run; a push to it by anyone but the bot is told to the
        run as ``head_moved``."""
        pr = payload.get("pull_request") or {}
        marker = find_marker(pr.get("body"), PULL)
        action = payload.get("action")
        closed = action == "closed" and not pr.get("merged")
        if not (closed or action == "synchronize") or marker is None or "run" not in marker.attrs:
            return 202, {"message": "not a durafix PR closed without merging or pushed to: ignored"}
        repository = payload["repository"]["full_name"]
        workflow_id = marker.attrs["run"]
        if not is_run_of(workflow_id, repository):
            return 403, {"message": f"PR marker names {workflow_id}, which is not a run of this repository"}
        bot, refused = self._bot_authored(repository, pr, workflow_id)
        if refused is not None:
            return refused
        sender = str(payload["sender"]["login"])
        if action == "synchronize":
            return self._on_push(delivery, payload, workflow_id, bot, sender)
        rejection = Rejection(
            reviewer=sender, reason="the PR was closed without merging", source="webhook", pr_number=int(pr["number"])
        )
        delivered = Delivered(
            delivery=delivery, attempt=uuid.uuid4().hex, kind=DeliveryKind.REJECTION, sender=sender, rejection=rejection
        )
        try:
            status, answer = self._sent(workflow_id, delivered)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            return 202, {"workflow_id": workflow_id, "message": "no live run for this PR: nothing to reject"}
        answer.setdefault("message", f"closing by {sender} sent to the run as a rejection")
        return status, answer

    def _on_push(
        self, delivery: str, payload: dict[str, Any], workflow_id: str, bot: str, sender: str
    ) -> tuple[int, dict[str, Any]]:
        """``synchronize`` on durafix's PR: recorded as this delivery, then sent as ``head_moved`` (once: a
        duplicate is answered with the first handling). The bot's own push is the run's and is ignored."""
        if sender == bot:
            return 202, {"workflow_id": workflow_id, "message": f"a push by durafix's own login {bot}: ignored"}
        pr = payload["pull_request"]
        push = HeadPush(
            pr_number=int(pr["number"]),
            head_sha=str(pr["head"]["sha"]),
            before=str(payload.get("before") or "") or None,
            pusher=sender,
            source=f"webhook:{delivery}",
        )
        delivered = Delivered(
            delivery=delivery, attempt=uuid.uuid4().hex, kind=DeliveryKind.HEAD_PUSH, sender=sender, push=push
        )
        try:
            _, duplicate = self._send(workflow_id, delivered)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            return 202, {"workflow_id": workflow_id, "message": "no live run for this PR: nothing to tell"}
        if duplicate is not None:
            return 200, duplicate
        self._run(runs.head_moved(self._client, workflow_id, push))
        return 200, {"workflow_id": workflow_id, "message": f"push of {push.head_sha} by {sender} sent to the run"}

    def _bot_authored(
        self, repository: str, pr: dict[str, Any], workflow_id: str
    ) -> tuple[str, tuple[int, dict[str, Any]] | None]:
        """The bot's login, and the refusal when ``pr`` is not authored by it. A marker is text anyone can paste
        into a PR body: only the bot's own PRs are durafix's (the run also checks the PR is the one it
        recorded), so what happens on another PR is never a decision about ``workflow_id``."""
        bot = self._with_forge(
            repository,
            f"durafix's bot login could not be read, nothing was sent to {workflow_id}",
            lambda forge: forge.login(),
        )
        author = str((pr.get("user") or {}).get("login") or "")
        if author == bot:
            return bot, None
        return bot, (
            403,
            {
                "workflow_id": workflow_id,
                "message": (
                    f"PR #{pr['number']} is authored by {author or 'nobody'}, not by durafix ({bot}): what happens "
                    f"on it is not a decision about {workflow_id}, whatever its body says"
                ),
            },
        )

    def _refuse_reviewer(self, repository: str, reviewer: str, workflow_id: str) -> tuple[int, dict[str, Any]] | None:
        """None when the approval policy in force (``DurafixConfig.approval_policy_in_force``) admits
        ``reviewer`` on ``repository``: at least its ``min_permission`` (``approver_permission`` by default), and,
        when it has allow-lists, one of its ``allowed_users`` or an active member of one of its
        ``allowed_teams``. Otherwise the answer to give instead of sending their decision: 403 naming the
        policy (too little permission, or not on its allow-lists), or the forge read's :class:`Refused` (503
        the forge did not answer: redeliver later; 422 it does not know the reviewer; 502 it refused the read;
        500 no token)."""
        policy = self.config.approval_policy_in_force()
        required = policy.min_permission
        unchecked = f"{reviewer}'s permission on {repository} could not be checked, nothing was sent to the run"

        def check(forge: GitHubForge) -> tuple[str, str | None]:
            """What the reviewer holds, and "" (too little), None (admitted) or the allow-lists' refusal."""

            def member_of(team: str) -> bool:
                return forge.is_team_member(team, reviewer)

            # maintain is reported as write by the permission read: only the role tells the two apart.
            if required == "maintain":
                role = forge.get_role(reviewer)
                if not role_at_least(role, required):
                    return role, ""
                return role, policy.refusal(reviewer, role, member_of)
            permission = forge.get_permission(reviewer)
            if not permission_at_least(permission, "admin" if required == "admin" else "write"):
                return permission, ""
            return permission, policy.refusal(reviewer, permission, member_of)

        try:
            permission, refusal = self._with_forge(repository, unchecked, check)
        except Refused as refused:
            return refused.status, {"workflow_id": workflow_id, **refused.body}
        if refusal is None:
            return None
        answer = {"workflow_id": workflow_id, "reviewer": reviewer, "policy_version": policy.version}
        if refusal:
            return 403, {
                **answer,
                "policy": policy.label,
                "message": f"{refusal}: approving or requesting changes on a durafix PR is limited to those",
            }
        return 403, {
            **answer,
            "policy": policy.label,
            "permission": permission,
            "required": required,
            "message": (
                f"{reviewer} has {permission} permission on {repository}; approving or requesting changes "
                f"on a durafix PR requires {required} or more"
            ),
        }


def pinned_from(issue: dict[str, Any], sender: str) -> PinnedReport:
    """The report text a trigger's payload carries, pinned for the run it starts."""
    return PinnedReport(
        title=str(issue["title"]),
        body=str(issue.get("body") or ""),
        author=str((issue.get("user") or {}).get("login") or ""),
        triggered_by=sender,
    )


class Refused(Exception):
    """A delivery answered ``status`` with ``body`` before anything was sent to a run."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("message", ""))
        self.status = status
        self.body = body


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
