"""``durafix serve``: the GitHub webhook receiver.

Contract:
- Every delivery's ``X-Hub-Signature-256`` is checked (HMAC-SHA256 of the raw body with the shared secret,
  constant-time compare) before the body is parsed; a bad or missing signature gets 401 and does nothing.
- ``issues`` labelled with the trigger label (``labeled``, or ``opened``/``reopened`` already carrying it)
  start the run for that issue or attach to the one already running (the workflow ID is the issue's
  identity), but only when the delivery's sender holds at least ``trigger_permission`` (``triage``), read
  from the forge (``GitHubForge.get_role``); otherwise 403 and no run. The run gets the issue's title and
  body from the payload, pinned (``RepairInput.report``). A trigger for an issue whose run ended is
  answered once on the issue (a keyed comment) as well as in the response.
- ``issues`` ``edited`` (title or body) for an issue with a live run becomes the ``report_edited`` signal:
  the ticket says so, and the run keeps the pinned text.
- ``pull_request_review`` counts only on durafix's own PR (its marker names a run of this repository and
  its author is the bot's login) and never from the bot itself (403 otherwise, nothing sent). ``submitted``
  ``approved`` becomes an ``approve`` Update naming the review's ``commit_id`` and the PR's number (the run
  refuses another PR's); ``changes_requested`` the ``reject`` signal marked as a request for changes (the
  review's ID and ``commit_id``): the run revises while its revision budget lasts; ``dismissed`` the
  ``withdraw`` signal. The Update ID is the review's ID, so a redelivered review is recorded once. The merge
  re-reads the reviews on the forge anyway (``forge.merge``): what this sends is never the authority.
- ``pull_request`` ``closed`` without merging, on durafix's own PR (as above), rejects: the ``reject`` signal
  naming whoever closed it (the forge let them: closing takes triage permission or authorship).
- Anyone who can see a repository may submit a review, so before a decision reaches the run the reviewer's
  permission on the delivery's repository is read from the forge (``GitHubForge.get_permission``, one
  adapter per request). Below ``approver_permission`` (``write`` by default, or ``admin``) the answer is
  403 naming reviewer, permission and what is required. For every forge read (role, permission, bot login):
  a forge that cannot answer now gives 503, one that refuses the read (bad token, repository or user not
  visible) 502, a receiver without a forge token 500. In every one of these cases nothing is sent.
- The HTTP side is bounded (``pipeline.webhook_server``): ``Content-Length`` missing (411), malformed or
  negative (400) or over ``MAX_BODY`` (413) is refused before the body is read; every socket read times
  out; at most ``ReceiverLimits.max_connections`` connections are served at once, one more gets 503. So
  connections that send headers and no body are closed after the read timeout and never starve a delivery.
- Answers within GitHub's 10 s: the receiver makes a few forge reads (and at most one keyed comment) and
  talks to Temporal, never waits for the run.
- GitHub does not retry failed deliveries: a receiver that was down misses events until they are
  redelivered (the hook-delivery API) or the issue is re-labelled.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import threading
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any, TypeVar

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from pipeline import client as runs
from pipeline.config import DurafixConfig
from pipeline.ids import workflow_id_for
from pipeline.inputs import PinnedReport
from pipeline.services import Services
from pipeline.state import Approval, Rejection, ReportEdit, Withdrawal
from pipeline.webhook_server import BodyRefused, BoundedHTTPServer, ReceiverLimits, body_length, handler_class
from reviews.adapter import GitHubForge
from reviews.errors import ForgeError, ForgeTransientError
from reviews.markers import PULL, find_marker
from reviews.permissions import permission_at_least, role_at_least

T = TypeVar("T")
MAX_BODY = ReceiverLimits().max_body


def signature_ok(secret: str, body: bytes, header: str | None) -> bool:
    if not secret or not header or not header.startswith("sha256="):
        return False
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    # Compare bytes: a header with non-ASCII characters is a bad signature, not a crash.
    return hmac.compare_digest(expected.encode(), header.removeprefix("sha256=").encode("utf-8", "replace"))


class WebhookReceiver:
    """Owns an asyncio loop on a thread (for the Temporal client) and an HTTP server feeding it."""

    def __init__(
        self,
        config: DurafixConfig,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: ReceiverLimits | None = None,
    ) -> None:
        self.config = config
        self.limits = limits or ReceiverLimits()
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="webhook-loop", daemon=True)
        self._loop_thread.start()
        self._client: Client = self._run(runs.connect(config))
        self._server = BoundedHTTPServer((host, port), handler_class(self._handle, self.limits), self.limits)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/webhook"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-http", daemon=True)
        self._thread.start()

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=8)

    # ---- request handling ---------------------------------------------------------------------------

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        try:
            length = body_length(req.headers.get("Content-Length"), self.limits.max_body)
        except BodyRefused as refused:
            return _reply(req, refused.status, {"message": refused.message})
        try:
            body = req.rfile.read(length)
        except TimeoutError:
            return _reply(req, 408, {"message": f"body not received within {self.limits.read_timeout_s} s"})
        if len(body) != length:
            return _reply(req, 400, {"message": f"body ended after {len(body)} of {length} bytes"})
        if not signature_ok(self.config.webhook_secret, body, req.headers.get("X-Hub-Signature-256")):
            return _reply(req, 401, {"message": "bad signature"})
        try:
            payload = json.loads(body)
        except json.JSONDecodeError:
            return _reply(req, 400, {"message": "malformed JSON"})
        if not isinstance(payload, dict):
            return _reply(req, 400, {"message": "payload is not a JSON object"})
        event = req.headers.get("X-GitHub-Event", "")
        delivery = req.headers.get("X-GitHub-Delivery", "")
        try:
            status, answer = self._dispatch(event, delivery, payload)
        except Refused as refused:
            status, answer = refused.status, refused.body
        except (KeyError, TypeError, ValueError) as err:
            status, answer = 400, {"message": f"payload lacks what a {event} event carries: {err!r}"}
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                status, answer = 404, {"message": f"no such run: {err.message}"}
            else:
                status, answer = 503, {"message": f"could not reach the workflow engine: {err}"}
        except (WorkflowUpdateFailedError, TimeoutError) as err:
            status, answer = 503, {"message": f"could not reach the workflow engine: {err}"}
        _reply(req, status, answer)

    def _dispatch(self, event: str, delivery: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if event == "ping":
            return 200, {"message": "pong"}
        if event == "issues":
            return self._on_issue(delivery, payload)
        if event == "pull_request_review":
            return self._on_review(payload)
        if event == "pull_request":
            return self._on_pull(payload)
        return 202, {"message": f"ignored event {event}"}

    def _on_issue(self, delivery: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        action = payload.get("action")
        if action == "edited":
            return self._on_edit(delivery, payload)
        label = self.config.trigger_label
        issue = payload.get("issue") or {}
        labels = {lbl.get("name") for lbl in issue.get("labels") or []}
        triggered = (action == "labeled" and (payload.get("label") or {}).get("name") == label) or (
            action in ("opened", "reopened") and label in labels
        )
        if not triggered:
            return 202, {"message": f"issues.{action} without the {label!r} label: ignored"}
        repository = payload["repository"]["full_name"]
        number = int(issue["number"])
        # Who triggered: the account that added the label or opened the issue (issue forms put labels on for
        # anyone who opens one), never the issue's author as such.
        sender = str(payload["sender"]["login"])
        required = self.config.trigger_permission
        role = self._with_forge(
            repository,
            f"{sender}'s role on {repository} could not be checked, no run was started",
            lambda forge: forge.get_role(sender),
        )
        if not role_at_least(role, required):
            return 403, {
                "sender": sender,
                "role": role,
                "required": required,
                "message": (
                    f"{sender} has the {role} role on {repository}; starting a durafix run requires {required} "
                    "or more: no run was started"
                ),
            }
        pinned = PinnedReport(
            title=str(issue["title"]),
            body=str(issue.get("body") or ""),
            author=str((issue.get("user") or {}).get("login") or ""),
            triggered_by=sender,
        )
        try:
            started = self._run(
                runs.start_run(
                    self._client, self.config, repository, number, trigger=f"webhook:{delivery}", report=pinned
                )
            )
        except runs.RunAlreadyEnded as ended:
            return 200, self._answer_ended(repository, number, ended)
        return 202, {"workflow_id": started.workflow_id, "run_id": started.run_id, "attached": started.attached}

    def _answer_ended(self, repository: str, number: int, ended: runs.RunAlreadyEnded) -> dict[str, Any]:
        """A trigger for a report whose run ended is answered on the issue, once: one keyed comment per run
        (``reviews.comments``: a second trigger finds it unchanged), saying what to do instead."""
        state = ended.status.name.lower() if ended.status else "closed"
        body = (
            f"durafix already ran on this report (`{ended.workflow_id}`, now {state}); a report gets one run, "
            "so adding the label again starts nothing. To try again, open a new issue with the report and add "
            f"the `{self.config.trigger_label}` label to it; the outcome of the earlier run is in its status "
            "comment above."
        )
        answer: dict[str, Any] = {"workflow_id": ended.workflow_id, "message": str(ended)}
        try:
            ref = self._with_forge(
                repository,
                f"the issue could not be told that {ended.workflow_id} already ran",
                lambda forge: forge.ensure_comment(number, f"{ended.workflow_id}:already-ran", body),
            )
        except Refused as refused:
            answer["comment"] = refused.body["message"]
        else:
            answer["comment"] = ref.action
        return answer

    def _on_edit(self, delivery: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """An edit of the report's title or body after its trigger: the live run (if any) is told, so its
        ticket says so; the run keeps the text pinned at its trigger. Anyone who may edit the issue may cause
        this note, which is all it causes."""
        fields = sorted(name for name in ("title", "body") if name in (payload.get("changes") or {}))
        if not fields:
            return 202, {"message": "issues.edited without a title or body change: ignored"}
        workflow_id = workflow_id_for(payload["repository"]["full_name"], int(payload["issue"]["number"]))
        edit = ReportEdit(
            editor=str(payload["sender"]["login"]), fields=fields, at=datetime.now(UTC), source=f"webhook:{delivery}"
        )
        try:
            self._run(runs.report_edited(self._client, workflow_id, edit))
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            return 202, {"workflow_id": workflow_id, "message": "no live run for this issue: nothing to note"}
        return 200, {"workflow_id": workflow_id, "message": f"edit of {' and '.join(fields)} noted on the run"}

    def _with_forge(self, repository: str, unchecked: str, read: Callable[[GitHubForge], T]) -> T:
        """``read`` (or an idempotent write) on a fresh adapter for ``repository``, or :class:`Refused` saying
        why ``unchecked``: 500 without a forge token, 503 when the forge does not answer now (redeliver later),
        502 when it refuses (bad token, repository or user not visible)."""
        if not self.config.forge_token:
            raise Refused(500, {"message": f"no forge token configured: {unchecked}"})
        # A fresh adapter per request: requests run on their own threads and a PyGithub client is not
        # thread-safe; closing it releases its connections.
        try:
            with Services(self.config).forge(repository) as forge:
                return read(forge)
        except ForgeTransientError as err:
            raise Refused(503, {"message": f"forge unavailable: {unchecked}: {err}"}) from err
        except ForgeError as err:
            raise Refused(502, {"message": f"forge refused the read: {unchecked}: {err}"}) from err

    def _on_review(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        action = payload.get("action")
        review = payload.get("review") or {}
        pr = payload.get("pull_request") or {}
        marker = find_marker(pr.get("body"), PULL)
        if action not in ("submitted", "dismissed") or marker is None or "run" not in marker.attrs:
            return 202, {"message": "not a submitted or dismissed review of a durafix PR: ignored"}
        repository = payload["repository"]["full_name"]
        workflow_id = marker.attrs["run"]
        if not workflow_id.startswith(f"repair:{repository}#"):
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
        if action == "dismissed":
            # Withdrawing takes no permission to be heard: it only ever takes an approval away.
            withdrawal = Withdrawal(
                review_id=str(review.get("id")),
                reviewer=reviewer,
                dismissed_by=str((payload.get("sender") or {}).get("login") or ""),
                pr_number=number,
            )
            self._run(runs.withdraw(self._client, workflow_id, withdrawal))
            return 200, {"workflow_id": workflow_id, "message": f"dismissal of {reviewer}'s review sent to the run"}
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
            try:
                ack = self._run(runs.approve(self._client, workflow_id, approval))
            except WorkflowUpdateFailedError as err:
                return 409, {"workflow_id": workflow_id, "message": f"approval refused: {err.cause or err}"}
            return 200, {"workflow_id": workflow_id, "accepted": ack.accepted, "detail": ack.detail}
        reason = str(review.get("body") or "changes requested")
        rejection = Rejection(
            reviewer=reviewer,
            reason=reason,
            source="webhook",
            pr_number=number,
            changes_requested=True,
            review_id=str(review.get("id")),
            head_sha=str(review.get("commit_id") or "") or None,
        )
        self._run(runs.reject(self._client, workflow_id, rejection))
        return 200, {"workflow_id": workflow_id, "message": "request for changes sent to the run"}

    def _on_pull(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """A durafix PR closed without merging rejects its run."""
        pr = payload.get("pull_request") or {}
        marker = find_marker(pr.get("body"), PULL)
        if payload.get("action") != "closed" or pr.get("merged") or marker is None or "run" not in marker.attrs:
            return 202, {"message": "not a durafix PR closed without merging: ignored"}
        repository = payload["repository"]["full_name"]
        workflow_id = marker.attrs["run"]
        if not workflow_id.startswith(f"repair:{repository}#"):
            return 403, {"message": f"PR marker names {workflow_id}, which is not a run of this repository"}
        _, refused = self._bot_authored(repository, pr, workflow_id)
        if refused is not None:
            return refused
        closer = str(payload["sender"]["login"])
        rejection = Rejection(
            reviewer=closer, reason="the PR was closed without merging", source="webhook", pr_number=int(pr["number"])
        )
        try:
            self._run(runs.reject(self._client, workflow_id, rejection))
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            return 202, {"workflow_id": workflow_id, "message": "no live run for this PR: nothing to reject"}
        return 200, {"workflow_id": workflow_id, "message": f"closing by {closer} sent to the run as a rejection"}

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
        the forge did not answer: redeliver later; 502 it refused the read; 500 no token)."""
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


class Refused(Exception):
    """A delivery answered ``status`` with ``body`` before anything was sent to a run."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("message", ""))
        self.status = status
        self.body = body


def _reply(req: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    try:
        req.send_response(status)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)
    except (TimeoutError, ConnectionError):
        # The client stopped reading or went away: nothing left to tell it.
        req.close_connection = True
