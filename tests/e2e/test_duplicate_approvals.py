"""The same approval delivered more than once: at once (two concurrent HTTP deliveries of one signed
``pull_request_review`` payload, one ``X-GitHub-Delivery``) while the run waits at review, and again later by
the forge's redelivery (same GUID). The receiver sends each as the run's ``deliver`` Update whose ID is the
GUID, so Temporal keeps the first and answers the others with it: one decision, one merge, every other copy
answered as a duplicate naming the first handling.

The payload is the forge's own: while the reviewer approves, the repository's hook points at a recording
endpoint, so the emulator signs and sends the real delivery there; the test then posts those exact bytes and
headers to the real receiver twice at once. Asserted: the receiver's answers, the run's history (one accepted
Update for the GUID) and state (one delivery record), and the forge (the PR merged once, one merge commit on
``main``, one ticket, one evidence comment).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from pipeline.config import DurafixConfig
from pipeline.state import Outcome
from tests.e2e.review_runs import OpenedRun
from tests.e2e.test_pipeline import awaiting_review, finished, state_when
from tests.support.e2e_stack import E2EStack, footprint, scripted_stack, wait_for
from tests.support.forge import Received, running_receiver

pytestmark = [pytest.mark.slow, pytest.mark.browser]

FORWARDED = (
    "Content-Type",
    "User-Agent",
    "X-GitHub-Event",
    "X-GitHub-Delivery",
    "X-Hub-Signature",
    "X-Hub-Signature-256",
)


def _no_reconciler_pass_meanwhile(config: DurafixConfig) -> None:
    # The approval stays on the forge while its captured delivery waits to be posted: a reconciler pass in
    # between would deliver it first (as it should for a lost webhook), and the copies would then race an
    # ended run instead of each other. Passes here are an hour apart: only the receiver's first, at start.
    config.reconcile_interval_s = 3600.0


@pytest.fixture(scope="module")
def stack_with_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EStack]:
    with scripted_stack(
        tmp_path_factory, "durafix-duplicates", configure=_no_reconciler_pass_meanwhile, worker=True
    ) as stack:
        yield stack


def header(received: Received, name: str) -> str:
    return next(v for k, v in received.headers.items() if k.lower() == name.lower())


@contextmanager
def hook_pointed_at(stack: E2EStack, repository: str, url: str) -> Iterator[None]:
    """The repository's hook sends to ``url`` meanwhile (its secret kept), then to the receiver again."""
    gh = stack.github(stack.owner_token())
    [hook] = [h for h in gh.get_repo(repository).get_hooks() if h.config.get("url") == stack.receiver.url]
    gh.requester.requestJsonAndCheck("PATCH", hook.url, input={"config": {"url": url}})
    try:
        yield
    finally:
        gh.requester.requestJsonAndCheck("PATCH", hook.url, input={"config": {"url": stack.receiver.url}})


def captured_approval(stack: E2EStack, repository: str, number: int, head: str) -> Received:
    """The reviewer's approval of ``head``, as the forge signed and sent it, delivered to nobody yet."""
    with running_receiver("/captured") as capture, hook_pointed_at(stack, repository, capture.url):
        stack.approve_on_forge(repository, number, head)
        found: Received = wait_for(
            lambda: next((r for r in capture.events() if header(r, "X-GitHub-Event") == "pull_request_review"), None),
            30,
            "the forge's pull_request_review delivery",
        )
    return found


def post_at_once(url: str, delivery: Received, copies: int) -> list[tuple[int, dict[str, Any]]]:
    """``copies`` POSTs of the same bytes and headers, released together from their own threads."""
    headers = {name: header(delivery, name) for name in FORWARDED}
    gate = threading.Barrier(copies)
    answers: list[tuple[int, dict[str, Any]] | None] = [None] * copies

    def send(i: int) -> None:
        with httpx.Client(timeout=60) as http:
            gate.wait()
            resp = http.post(url, content=delivery.body, headers=headers)
            answers[i] = (resp.status_code, resp.json())

    threads = [threading.Thread(target=send, args=(i,)) for i in range(copies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert all(a is not None for a in answers), answers
    return [a for a in answers if a is not None]


async def accepted_update_ids(client: Client, workflow_id: str) -> list[str]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [
        e.workflow_execution_update_accepted_event_attributes.accepted_request.meta.update_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    ]


def redelivered_answer(stack: E2EStack, repository: str, guid: str) -> dict[str, Any]:
    """Redeliver the delivery ``guid`` through the hook-delivery API (to the hook's URL now: the receiver);
    the receiver's answer to the copy."""
    gh = stack.github(stack.owner_token())
    [hook] = [h for h in gh.get_repo(repository).get_hooks() if h.config.get("url") == stack.receiver.url]
    base = f"/repos/{repository}/hooks/{hook.id}/deliveries"

    def deliveries() -> list[dict[str, Any]]:
        _, listed = gh.requester.requestJsonAndCheck("GET", base)
        return [d for d in listed if d["guid"] == guid]

    [original] = deliveries()
    gh.requester.requestJsonAndCheck("POST", f"{base}/{original['id']}/attempts")
    copy = wait_for(
        lambda: next((d for d in deliveries() if d["redelivery"] and d["status_code"]), None),
        30,
        "the redelivered copy's answer",
    )
    _, full = gh.requester.requestJsonAndCheck("GET", f"{base}/{copy['id']}")
    assert full["request"]["headers"]["X-GitHub-Delivery"] == guid
    answer: dict[str, Any] = json.loads(full["response"]["payload"])
    assert copy["status_code"] == 200, answer
    return answer


@pytest.mark.timeout(600)
async def test_one_approval_delivered_twice_at_once_and_redelivered_later_merges_once(
    opened: OpenedRun,
) -> None:
    stack, client, repository, issue, wf, number, head, _ = opened
    owner = stack.github().get_repo(repository)
    main_before = owner.get_branch("main").commit.sha

    delivery = captured_approval(stack, repository, number, head)
    guid = header(delivery, "X-GitHub-Delivery")
    # Nothing reached the run yet: it still waits at review for this head.
    assert (await state_when(client, wf, awaiting_review)).pending_approval is not None

    answers = post_at_once(stack.receiver.url, delivery, 2)
    assert [status for status, _ in answers] == [200, 200], answers
    [first] = [body for _, body in answers if body["duplicate"] is False]
    [repeat] = [body for _, body in answers if body["duplicate"] is True]
    assert first["workflow_id"] == repeat["workflow_id"] == wf
    assert repeat["first_handled"]["delivery"] == guid

    final = await state_when(client, wf, finished)
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    assert final.approval is not None and final.approval.head_sha == head and final.approval.source == "webhook"

    # Later, the forge's redelivery of the same GUID: the receiver answers it as the duplicate it is.
    again = redelivered_answer(stack, repository, guid)
    assert again["duplicate"] is True and again["first_handled"] == repeat["first_handled"], again

    # The receiver's Update ID is the delivery's GUID (``pipeline.client``): accepted once.
    assert (await accepted_update_ids(client, wf)).count(f"delivery:{guid}") == 1
    after = await state_when(client, wf, finished)
    assert [d.delivery for d in after.deliveries].count(guid) == 1
    pr = owner.get_pull(number)
    assert pr.merged and pr.merge_commit_sha == final.merged_sha
    assert owner.get_branch("main").commit.sha == final.merged_sha
    # One merge landed: main moved from its old head by exactly the PR's merge commit.
    assert owner.get_commit(final.merged_sha).parents[0].sha == main_before
    fp = footprint(stack, repository, wf, issue)
    assert len(fp.tickets) == 1 and fp.pull_requests == [number] and len(fp.evidence_comments) == 1, fp
