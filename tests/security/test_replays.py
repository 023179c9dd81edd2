"""Replayed deliveries on the real emulator and the real Temporal dev server: a signed delivery posted again, by
whoever kept it, starts and cancels nothing; a legitimate redelivery of a recent one still works.

A replay is the recorded request posted again: the same body and signature, with its GUID or (the GUID is a
header outside the signature) any other. The emulator stamps its payloads in whole seconds, like GitHub, so
the tests wait a little over a second where a later run must start in a later second than an earlier event.
"""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus

from pipeline import client as runs
from pipeline.ops import forge_setup
from tests.support.forge_logins import MAINTAINER, OUTSIDER, OWNER, TRIAGER, TRIGGER
from tests.support.security_harness import Site, eventually, example, post_raw, serving, workers
from tests.support.stamps import forge_now

# The forge's timestamps are whole seconds: an event and a run it must precede are this far apart.
NEXT_SECOND_S = 1.2
CANCEL_REQUESTED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED


def replay(url: str, recorded: dict[str, Any], guid: str | None = None) -> tuple[int, dict[str, Any]]:
    """The recorded delivery's request posted again to ``url``: its body and signature, its GUID or ``guid``."""
    headers = dict(recorded["request"]["headers"])
    if guid is not None:
        headers["X-GitHub-Delivery"] = guid
    return post_raw(url, recorded["request"]["body"].encode(), headers)


async def replayed(url: str, recorded: dict[str, Any], guid: str | None = None) -> tuple[int, dict[str, Any]]:
    return await asyncio.to_thread(replay, url, recorded, guid)


async def test_a_replayed_old_labeled_delivery_starts_nothing_even_after_a_receiver_restart(site: Site) -> None:
    triager, workflow_id, first = await site.ended_labelled_run()
    # Run 2, on a later label: run 1's trigger is no longer the newest run's.
    triager.remove_from_labels(TRIGGER)
    await asyncio.sleep(NEXT_SECOND_S)
    triager.add_to_labels(TRIGGER)
    second_id = f"{workflow_id}~2"
    site.touched.update({second_id, f"{workflow_id}~3"})
    assert site.deliveries("issues", "labeled")[1]["status_code"] == 202
    await site.client.get_workflow_handle(second_id).terminate("ended for the test")

    # Before, run 1's trigger replayed after run 2 ended started run 3. Its GUID is in run 1's memo.
    status, answer = await replayed(site.receiver_url, first)
    assert status == 200 and answer["duplicate"] is True, answer
    assert answer["workflow_id"] == workflow_id
    # With another GUID, the signed payload's own time gives it away: it predates run 2.
    status, answer = await replayed(site.receiver_url, first, str(uuid.uuid4()))
    assert status == 409 and answer["stale"] is True, answer
    assert answer["workflow_id"] == second_id and "nothing was started" in answer["message"]

    # A receiver started afresh knows as much: what it knows is kept in Temporal, with the runs.
    with serving(site.config) as restarted:
        for guid in (None, str(uuid.uuid4())):
            status, answer = await replayed(restarted.url, first, guid)
            assert status in (200, 409), answer
            assert answer.get("duplicate") is True or answer.get("stale") is True, answer
    assert await site.status(f"{workflow_id}~3") is None
    assert await site.status(workflow_id) == WorkflowExecutionStatus.TERMINATED
    assert await site.status(second_id) == WorkflowExecutionStatus.TERMINATED


async def test_a_replayed_old_closed_delivery_cancels_nothing(site: Site) -> None:
    issue = site.repo(OUTSIDER).create_issue(title="Total is wrong", body="see title")
    triager = site.repo(TRIAGER).get_issue(issue.number)
    workflow_id = site.run_id(issue.number)
    second_id = f"{workflow_id}~2"
    site.touched.add(second_id)
    # A cancel is the run's ``deliver`` Update: it needs a workflow worker to be answered.
    async with workers(site.client, site.config):
        # Forge calls off the loop: the worker shares it.
        await asyncio.to_thread(triager.add_to_labels, TRIGGER)
        [labelled] = await asyncio.to_thread(site.deliveries, "issues", "labeled")
        assert labelled["status_code"] == 202, labelled
        # The worker answers for the run (its first task done) before the issue is closed.
        await eventually(lambda: _answers(site, workflow_id), 60, "a worker to answer for run 1")
        await asyncio.to_thread(triager.edit, state="closed")
        [closed] = await asyncio.to_thread(site.deliveries, "issues", "closed")
        assert closed["status_code"] == 200, closed
        assert len(await site.events(workflow_id, CANCEL_REQUESTED)) == 1
        # Its cleanup would need the environment workers this test has not: ended here instead.
        await site.client.get_workflow_handle(workflow_id).terminate("cancelled; ended for the test")
        # Reopened in a later second, still labelled: the reopening is the trigger of run 2.
        await asyncio.sleep(NEXT_SECOND_S)
        await asyncio.to_thread(triager.edit, state="open")
        [reopened] = await asyncio.to_thread(site.deliveries, "issues", "reopened")
        assert reopened["status_code"] == 202, reopened
        assert await site.status(second_id) == WorkflowExecutionStatus.RUNNING

        # Before, the closing replayed was a new delivery to run 2 and cancelled it.
        for guid in (None, str(uuid.uuid4())):
            status, answer = await replayed(site.receiver_url, closed, guid)
            assert status == 409 and answer["stale"] is True, answer
            assert answer["workflow_id"] == second_id and "nothing was started or cancelled" in answer["message"]
        # The trigger of run 2 redelivered (the forge's hook-delivery API) is the duplicate it is.
        redelivered = await asyncio.to_thread(_redeliver, site, reopened)
        assert redelivered["status_code"] == 200, redelivered
        assert await site.status(second_id) == WorkflowExecutionStatus.RUNNING
        assert await site.events(second_id, CANCEL_REQUESTED) == []
        assert await site.status(f"{workflow_id}~3") is None


async def test_a_trigger_older_than_the_window_starts_nothing(site: Site) -> None:
    number = site.repo(OUTSIDER).create_issue(title="Total is wrong", body="see title").number
    payload = _labeled(site, number, TRIAGER)
    four_days_ago = datetime.now(UTC) - timedelta(days=4)
    payload["issue"]["updated_at"] = four_days_ago.strftime("%Y-%m-%dT%H:%M:%SZ")
    status, answer = await site.deliver("issues", payload)
    assert status == 409 and answer["stale"] is True, answer
    assert "DURAFIX_DELIVERY_MAX_AGE_S" in answer["message"]
    assert await site.status(site.run_id(number)) is None
    # The same trigger stamped now starts the run: the window, not the payload, refused it.
    payload["issue"]["updated_at"] = forge_now()
    status, answer = await site.deliver("issues", payload)
    assert status == 202 and answer["workflow_id"] == site.run_id(number), answer


async def test_a_recent_failed_trigger_redelivered_starts_its_run(site: Site) -> None:
    # The receiver cannot read the labeller's role once (the forge answers 503): it answers 503, starts nothing.
    site.fail_role_reads(TRIAGER, 1)
    issue = site.repo(OUTSIDER).create_issue(title="Total is wrong", body="see title")
    site.repo(TRIAGER).get_issue(issue.number).add_to_labels(TRIGGER)
    [failed] = site.deliveries("issues", "labeled")
    assert failed["status_code"] == 503, failed
    workflow_id = site.run_id(issue.number)
    assert await site.status(workflow_id) is None
    # Redelivered as an operator does after an outage: same GUID, same signed payload, and it starts the run.
    redelivered = await asyncio.to_thread(_redeliver, site, failed)
    assert redelivered["status_code"] == 202, redelivered
    assert await site.status(workflow_id) == WorkflowExecutionStatus.RUNNING
    assert (await site.started_input(workflow_id)).trigger == f"webhook:{failed['guid']}"


def _labeled(site: Site, number: int, sender: str) -> dict[str, Any]:
    payload = copy.deepcopy(example("issues", "labeled"))
    payload["repository"] = site.repository_payload()
    issue = site.repo(MAINTAINER).get_issue(number)
    payload["issue"].update(number=number, title=issue.title, body=issue.body, updated_at=forge_now())
    payload["issue"]["labels"] = [{**payload["issue"]["labels"][0], "name": TRIGGER}]
    payload["label"] = {**payload["label"], "name": TRIGGER}
    payload["sender"]["login"] = sender
    return payload


def _redeliver(site: Site, recorded: dict[str, Any]) -> dict[str, Any]:
    """``recorded`` redelivered through the forge's hook-delivery API (same GUID); the redelivery's record."""
    api = forge_setup.ForgeApi(site.forge.handle.api_url, site.forge.tokens[OWNER])
    before = {d["id"] for d in site.forge.handle.deliveries()}
    api.call("POST", f"/repos/{site.repository}/hooks/{recorded['hook_id']}/deliveries/{recorded['id']}/attempts")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        for d in site.forge.handle.wait_for_deliveries():
            if d["id"] not in before and d["guid"] == recorded["guid"] and d["state"] == "done":
                return d
        time.sleep(0.1)
    raise AssertionError(f"the redelivery of {recorded['guid']} was not sent")


async def _answers(site: Site, workflow_id: str) -> bool:
    try:
        await runs.get_state(site.client, workflow_id)
    except Exception:
        return False
    return True
