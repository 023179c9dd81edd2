"""The approval policy where it is enforced, on the real emulator and the real Temporal dev server.

- The receiver (``_refuse_reviewer``): a delivery the emulator really made (a maintainer's review of the bot's
  PR, to the module's receiver) is delivered again, signed with the same secret, to a receiver configured with
  a policy: one outside its allow-list is refused with 403 naming the policy and nothing reaches the run; a
  team allow-list admits an active member of the team, read from the forge, and not an invited one.
- The merge activity (run as an activity on the real adapter): the forge check applies the stricter of the
  run's policy (``MergeInput.approval_policy``) and the merging worker's configured one, so an approval older
  than the run's expiry does not merge, and the same approval under a policy that lets it stand does; and a run
  whose input asks for one approval (as anyone who can start a run on Temporal may write it) does not merge on
  one when the worker is configured to need two.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from pipeline.config import DurafixConfig
from pipeline.services import Services
from pipeline.steps import MergeStatus, TaskQueue
from pipeline.workflow import WORKFLOWS
from reviews.approval_policy import ApprovalPolicy
from tests.security.test_reviews import approve, bot_pr, decisions, merge_input, started_run
from tests.support.forge_logins import BOT, MAINTAINER, OWNER, READER
from tests.support.security_harness import Site, post, serving, sign


def real_review_delivery(site: Site, number: int, head: str, reviewer: str = MAINTAINER) -> dict[str, Any]:
    """``reviewer`` requests changes on the PR; the emulator's delivery of that review (to the module's receiver)."""
    approve(site.repo(reviewer), number, head, "REQUEST_CHANGES")
    delivery = site.deliveries("pull_request_review")[-1]
    payload: dict[str, Any] = json.loads(delivery["request"]["body"])
    assert payload["review"]["user"]["login"] == reviewer
    return payload


async def deliver_to(config: DurafixConfig, url: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    body = json.dumps(payload).encode()
    return await asyncio.to_thread(post, url, "pull_request_review", body, sign(config.webhook_secret, body))


def as_reviewer(payload: dict[str, Any], login: str) -> dict[str, Any]:
    """The same delivery, of a review by ``login`` (a fresh review ID)."""
    changed: dict[str, Any] = json.loads(json.dumps(payload))
    changed["review"]["id"] += 1000
    changed["review"]["user"]["login"] = changed["sender"]["login"] = login
    return changed


@asynccontextmanager
async def under_policy(
    site: Site, workflow_id: str, policy: ApprovalPolicy
) -> AsyncIterator[tuple[str, dict[str, Any], list[str]]]:
    """A receiver configured with ``policy`` and a workflow worker (it answers the deliveries' Updates), for the
    maintainer's real review of the run's PR: the receiver's URL, the review's delivery, and the decisions the
    run was sent before it. The forge calls run off the event loop."""
    number, head = bot_pr(site, workflow_id)
    async with Worker(site.client, task_queue=TaskQueue.ORCHESTRATION.value, workflows=list(WORKFLOWS)):
        payload = await asyncio.to_thread(real_review_delivery, site, number, head)
        sent_before = await decisions(site, workflow_id)
        with serving(site.config.model_copy(update={"approval_policy": policy})) as receiver:
            yield receiver.url, payload, sent_before


async def test_a_reviewer_outside_the_allow_list_is_refused_naming_the_policy(site: Site) -> None:
    _, workflow_id = started_run(site)
    policy = ApprovalPolicy(version=3, allowed_users=(OWNER,))
    async with under_policy(site, workflow_id, policy) as (strict, payload, sent_before):
        status, answer = await deliver_to(site.config, strict, payload)
        assert status == 403, answer
        assert (answer["policy"], answer["policy_version"], answer["reviewer"]) == (
            "approval policy v3",
            3,
            MAINTAINER,
        )
        assert answer["message"].startswith(
            f"{MAINTAINER} is not among the approvers approval policy v3 allows (users {OWNER})"
        )
        assert await decisions(site, workflow_id) == sent_before

        # The allowed user's decision is sent.
        status, answer = await deliver_to(site.config, strict, as_reviewer(payload, OWNER))
    assert status == 200, answer
    assert await decisions(site, workflow_id) == [*sent_before, "rejection"]


async def test_a_team_allow_list_admits_active_members_read_from_the_forge(site: Site) -> None:
    handle, tokens = site.forge.handle, site.forge.tokens
    org = f"release-{uuid.uuid4().hex[:8]}"
    handle.create_org(org, OWNER)
    handle.add_org_member(org, BOT)  # the receiver's token reads the organisation's teams
    handle.create_team(tokens[OWNER], org, "Approvers")
    invited = handle.add_team_member(tokens[OWNER], org, "approvers", MAINTAINER)
    assert invited["state"] == "pending"

    _, workflow_id = started_run(site)
    policy = ApprovalPolicy(version=7, allowed_teams=(f"{org}/approvers",))
    async with under_policy(site, workflow_id, policy) as (by_team, payload, sent_before):
        # Invited, not yet a member: not admitted.
        status, answer = await deliver_to(site.config, by_team, payload)
        assert status == 403, answer
        assert answer["policy"] == "approval policy v7" and f"members of {org}/approvers" in answer["message"]

        handle.add_org_member(org, MAINTAINER)
        status, answer = await deliver_to(site.config, by_team, as_reviewer(payload, MAINTAINER))
        assert status == 200, answer
        assert await decisions(site, workflow_id) == [*sent_before, "rejection"]

        # A member of the team without the permission is still refused, for the permission.
        handle.add_org_member(org, READER)
        handle.add_team_member(tokens[OWNER], org, "approvers", READER)
        status, answer = await deliver_to(site.config, by_team, as_reviewer(payload, READER))
    assert status == 403, answer
    assert (answer["permission"], answer["required"], answer["policy"]) == ("read", "write", "approval policy v7")
    assert await decisions(site, workflow_id) == [*sent_before, "rejection"]


def merge_under(
    site: Site, number: int, head: str, policy: ApprovalPolicy | None, worker_policy: ApprovalPolicy | None = None
) -> Any:
    """The merge activity of a worker configured with ``worker_policy`` (None: the default), for a run whose
    input carries ``policy``."""
    config = site.config.model_copy(update={"approval_policy": worker_policy})
    acts = Services(config).forge_activities()
    return ActivityEnvironment().run(acts.merge, merge_input(site, number, head, approval_policy=policy))


def test_an_approval_older_than_the_runs_expiry_does_not_merge(site: Site) -> None:
    number, head = bot_pr(site, f"repair:{site.repository}#1")
    approve(site.repo(MAINTAINER), number, head)
    # The forge stamps reviews to the second, so a millisecond's expiry has passed by the time the merge reads it.
    refused = merge_under(site, number, head, ApprovalPolicy(version=2, expiry_s=0.001))
    assert refused.status == MergeStatus.NOT_APPROVED, refused
    assert f"{MAINTAINER}'s approval expired (approval policy v2" in refused.detail
    assert "0 of 1 approvals" in refused.detail
    assert not site.repo().get_pull(number).merged

    merged = merge_under(site, number, head, ApprovalPolicy(version=2, expiry_s=7 * 24 * 3600))
    assert merged.status == MergeStatus.MERGED, merged
    assert site.repo().get_pull(number).merged


def test_the_runs_policy_is_applied_over_the_workers(site: Site) -> None:
    number, head = bot_pr(site, f"repair:{site.repository}#1")
    approve(site.repo(MAINTAINER), number, head)
    refused = merge_under(site, number, head, ApprovalPolicy(version=4, required_approvals=2))
    assert refused.status == MergeStatus.NOT_APPROVED, refused
    assert refused.detail == f"1 of 2 approvals of {head[:12]} on the forge (approved by {MAINTAINER})"
    refused = merge_under(site, number, head, ApprovalPolicy(version=4, min_permission="admin"))
    assert refused.status == MergeStatus.NOT_APPROVED, refused
    assert f"{MAINTAINER} lacks the permission to approve" in refused.detail
    # A run without a policy of its own (recorded before policies were carried): the worker's, by default one
    # writer's approval.
    merged = merge_under(site, number, head, None)
    assert merged.status == MergeStatus.MERGED, merged


def test_a_run_started_with_a_weaker_policy_merges_only_what_the_workers_policy_admits(site: Site) -> None:
    number, head = bot_pr(site, f"repair:{site.repository}#1")
    weak = ApprovalPolicy(version=1, required_approvals=1)
    configured = ApprovalPolicy(version=3, required_approvals=2)
    approve(site.repo(MAINTAINER), number, head)

    refused = merge_under(site, number, head, weak, worker_policy=configured)
    assert refused.status == MergeStatus.NOT_APPROVED, refused
    assert refused.detail == f"1 of 2 approvals of {head[:12]} on the forge (approved by {MAINTAINER})"
    assert not site.repo().get_pull(number).merged
    # The worker's stricter permission applies to the weak run too: the maintainer (write) is not admitted.
    refused = merge_under(site, number, head, weak, worker_policy=ApprovalPolicy(version=3, min_permission="admin"))
    assert refused.status == MergeStatus.NOT_APPROVED, refused
    assert f"{MAINTAINER} lacks the permission to approve" in refused.detail
    assert not site.repo().get_pull(number).merged

    # A second admitted reviewer (the repository's owner, an admin) approves: two of two, and it merges.
    approve(site.repo(OWNER), number, head)
    merged = merge_under(site, number, head, weak, worker_policy=configured)
    assert merged.status == MergeStatus.MERGED, merged
    assert site.repo().get_pull(number).merged
