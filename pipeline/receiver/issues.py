"""``issues`` deliveries: a labelled issue starts (or retries) its run, a closed or unlabelled one cancels it, an
edit becomes the ``report_edited`` signal (the contract is :mod:`pipeline.receiver.webhooks`')."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from temporalio.service import RPCError

from pipeline import client as runs
from pipeline.ids import workflow_id_for
from pipeline.inputs import PinnedReport
from pipeline.receiver.handling import Handling, Refused, no_live_run, pinned_from
from pipeline.replays import before_run, event_time, stale_answer
from pipeline.state import (
    Delivered,
    DeliveryKind,
    ReportEdit,
)


class IssueEvents(Handling):
    """The part of :class:`pipeline.receiver.webhooks.WebhookReceiver` handling the deliveries this module names."""

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
            return no_live_run(err, {"message": f"no live run for #{number}: nothing to cancel"})
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
            return no_live_run(
                err, {"workflow_id": live.workflow_id, "message": "no live run for this issue: nothing to note"}
            )
        return 200, {"workflow_id": live.workflow_id, "message": f"edit of {' and '.join(fields)} noted on the run"}
