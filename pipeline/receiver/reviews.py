"""``pull_request_review`` and ``pull_request`` deliveries on durafix's own PR: approvals, requests for changes,
withdrawals, a PR closed unmerged, and heads pushed by others; the reviewer's permission is read from the forge
first."""

from __future__ import annotations

import uuid
from typing import Any

from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError

from pipeline import client as runs
from pipeline.ids import is_run_of
from pipeline.receiver.handling import Handling, Refused, no_live_run
from pipeline.state import (
    Approval,
    Delivered,
    DeliveryKind,
    HeadPush,
    Rejection,
    Withdrawal,
)
from reviews.adapter import GitHubForge
from reviews.markers import PULL, find_marker
from reviews.permissions import permission_at_least, role_at_least


class ReviewEvents(Handling):
    """The part of :class:`pipeline.receiver.webhooks.WebhookReceiver` handling the deliveries this module names."""

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
            return no_live_run(
                err, {"workflow_id": workflow_id, "message": "no live run for this PR: nothing to reject"}
            )
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
            return no_live_run(err, {"workflow_id": workflow_id, "message": "no live run for this PR: nothing to tell"})
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
