"""What every event's handling shares: the bridge to the receiver's Temporal loop, sending a decision to a run as
its ``deliver`` Update, the sender's and the delivery's checks, and forge reads on a fresh adapter whose failures
are answers (:class:`Refused`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any, TypeVar

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from pipeline import client as runs
from pipeline.config import DurafixConfig
from pipeline.inputs import PinnedReport
from pipeline.replays import stale_answer, too_old
from pipeline.services import Services
from pipeline.state import (
    Delivered,
    DeliveryAck,
)
from reviews.adapter import GitHubForge
from reviews.app_tokens import InstallationTokens
from reviews.errors import ForgeError, ForgeNotFoundError, ForgeTransientError
from reviews.permissions import role_at_least

T = TypeVar("T")


class EngineUnreachable(Exception):
    """The receiver has no connection to Temporal now (it was down at start, or its address is wrong)."""


def pinned_from(issue: dict[str, Any], sender: str) -> PinnedReport:
    """The report text a trigger's payload carries, pinned for the run it starts."""
    return PinnedReport(
        title=str(issue["title"]),
        body=str(issue.get("body") or ""),
        author=str((issue.get("user") or {}).get("login") or ""),
        triggered_by=sender,
    )


def no_live_run(err: RPCError, answer: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """``answer`` (202: nothing to do) when ``err`` says the run is not there (it ended); ``err`` otherwise."""
    if err.status != RPCStatusCode.NOT_FOUND:
        raise err
    return 202, answer


class Refused(Exception):
    """A delivery answered ``status`` with ``body`` before anything was sent to a run."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("message", ""))
        self.status = status
        self.body = body


class Handling:
    """The part of :class:`pipeline.receiver.webhooks.WebhookReceiver` every event's handling uses; the receiver
    sets the attributes below."""

    config: DurafixConfig
    _github_app: InstallationTokens | None
    _loop: asyncio.AbstractEventLoop
    _client_lock: threading.Lock
    _connecting: Future[Client]

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

    def _too_old(self, what: str, at: datetime | None) -> tuple[int, dict[str, Any]] | None:
        """The 409 for a delivery whose event is older than ``delivery_max_age_s``
        (:mod:`pipeline.replays`)."""
        max_age = self.config.delivery_max_age_s
        if at is None or not too_old(at, datetime.now(UTC), max_age):
            return None
        return stale_answer(what, at, f"more than {max_age:g} s old (DURAFIX_DELIVERY_MAX_AGE_S)")

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

    def _comment(self, repository: str, number: int, key: str, body: str) -> str:
        """A keyed comment on issue ``number`` (written once per key); what the write did."""
        ref = self._with_forge(
            repository,
            f"the answer could not be written on #{number}",
            lambda forge: forge.ensure_comment(number, key, body),
        )
        return ref.action
