"""``issue_comment`` deliveries: ``/durafix <command>`` comments answered in a keyed comment, or acted on (cancel,
retry) as the issue's events are."""

from __future__ import annotations

from typing import Any

from pipeline import client as runs
from pipeline.ids import is_run_of, parse_run_id
from pipeline.inputs import PinnedReport
from pipeline.receiver.commands import CommandName, help_text, no_run_text, parse_command, status_text
from pipeline.receiver.handling import pinned_from
from pipeline.receiver.issues import IssueEvents
from pipeline.replays import event_time
from reviews.markers import PULL, find_marker


class CommentEvents(IssueEvents):
    """The part of :class:`pipeline.receiver.webhooks.WebhookReceiver` handling the deliveries this module names."""

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
            return self._retried(repository, number, key, self._start(delivery, repository, number, author, pinned, at))
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

    def _retried(
        self, repository: str, number: int, key: str, started: tuple[int, dict[str, Any]]
    ) -> tuple[int, dict[str, Any]]:
        """``/durafix retry`` answered as its trigger was (``started``); a live run is also said on the report."""
        status, answer = started
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
