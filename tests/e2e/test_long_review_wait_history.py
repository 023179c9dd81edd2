"""A review wait that lasts: 300 webhook deliveries and 30 moved heads reach one run while it waits for its
review, and the run still merges, with every execution's history inside Temporal's limits because the wait
continues as new.

Everything is real: each moved head is a maintainer's git push over the forge's smart HTTP to the run's
branch, told to the run by the forge's own ``synchronize`` delivery, and verified by the run before it asks
for a review again; the other deliveries are the forge's own (signed, sent by its webhook thread to the
receiver, which sends each to the run as a ``deliver`` Update): a reviewer's request for changes of a head
long replaced (recorded, not acted on) and the owner's dismissal of it (a withdrawal of nothing held), plus a
``/durafix status`` command per head, which the receiver answers from the run's state. The forge then
redelivers the first push and the first remark (answered in an earlier run once the wait continued as new):
each is answered as a duplicate. Then the reviewer approves the last head and the run merges it.

What is asserted is the server's view: every run of the workflow ID listed through visibility, each one's
event count (``describe()``) and history bytes (the server's count and the fetched history serialised), more
than one run with every earlier one closed ``CONTINUED_AS_NEW``; the forge's delivery log for the counts.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from pipeline.ids import branch_for
from tests.e2e.history_size import executions, report
from tests.e2e.review_runs import opened_for_review
from tests.e2e.test_pipeline import file_on_main, finished, state_when
from tests.e2e.test_review_gate import review_of
from tests.support.e2e_stack import E2EStack, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.browser]

MOVED_HEADS = 30
# Deliveries that reach the run as ``deliver`` Updates: the 30 pushes' ``synchronize`` and 135 pairs of a
# stale request for changes and its dismissal, spread over the 30 heads.
DELIVERIES = 300
STALE_PAIRS = (DELIVERIES - MOVED_HEADS) // 2
MAX_EVENTS = 10_000
MAX_BYTES = 5_000_000
# Events the run answers through the receiver, and the actions of those that reach it as Updates.
ANSWERED = {("pull_request", "synchronize"), ("pull_request_review", "submitted"), ("pull_request_review", "dismissed")}


def pairs_after(k: int) -> int:
    """The stale pairs sent after head ``k`` (1-based): 5 after each of the first 15 heads, 4 after the rest."""
    return STALE_PAIRS // MOVED_HEADS + int(k <= STALE_PAIRS % MOVED_HEADS)


def notes(k: int) -> str:
    """The maintainer's ``k``-th change: a file the app's tests never read, so every pushed head passes."""
    return f"Cart totals are the sum of each line's unit price times its quantity (note {k}).\n"


class HookLog:
    """The forge's record of what it delivered to the receiver's hook of one repository."""

    def __init__(self, stack: E2EStack, repository: str) -> None:
        self._gh = stack.github(stack.owner_token())
        [hook] = [h for h in self._gh.get_repo(repository).get_hooks() if h.config.get("url") == stack.receiver.url]
        self._base = f"/repos/{repository}/hooks/{hook.id}/deliveries"

    def _page(self, page: int) -> list[dict[str, Any]]:
        _, listed = self._gh.requester.requestJsonAndCheck(
            "GET", self._base, parameters={"per_page": 100, "page": page}
        )
        assert isinstance(listed, list)
        return listed

    def all(self) -> list[dict[str, Any]]:
        """Every delivery of the hook, oldest first."""
        found: list[dict[str, Any]] = []
        page = 1
        while batch := self._page(page):
            found.extend(batch)
            page += 1
        return found[::-1]

    def drained(self) -> bool:
        """Whether the newest delivery was answered: the forge sends one hook's deliveries in order, so every
        delivery queued before it was answered too."""
        newest = self._page(1)
        return not newest or bool(newest[0]["status_code"])

    def redelivered(self, guid: str) -> tuple[int, dict[str, Any]]:
        """Redeliver ``guid`` through the hook-delivery API, as a maintainer does; the receiver's answer to the
        copy (status and body)."""
        [original] = [d for d in self.all() if d["guid"] == guid and not d["redelivery"]]
        self._gh.requester.requestJsonAndCheck("POST", f"{self._base}/{original['id']}/attempts")
        copy = wait_for(
            lambda: next((d for d in self.all() if d["guid"] == guid and d["redelivery"] and d["status_code"]), None),
            60,
            f"the answer to the redelivered {guid}",
        )
        _, full = self._gh.requester.requestJsonAndCheck("GET", f"{self._base}/{copy['id']}")
        answer: dict[str, Any] = json.loads(full["response"]["payload"])
        return int(copy["status_code"]), answer


class Remarks:
    """The deliveries made between moved heads: the reviewer requests changes of a head long replaced (the run
    records it and does not act on it), the owner dismisses that review (a withdrawal of nothing the run
    holds), and the owner asks ``/durafix status`` on the PR (the receiver answers from the run's state)."""

    def __init__(self, stack: E2EStack, repository: str, number: int, stale: str) -> None:
        reviewer = stack.github(stack.reviewer_token).get_repo(repository)
        self._pull = reviewer.get_pull(number)
        self._stale = reviewer.get_commit(stale)
        self._owner = stack.github(stack.owner_token())
        self._issue = self._owner.get_repo(repository).get_issue(number)
        self._reviews = f"/repos/{repository}/pulls/{number}/reviews"

    def send(self, pairs: int, k: int) -> None:
        for j in range(pairs):
            review = self._pull.create_review(commit=self._stale, event="REQUEST_CHANGES", body=f"Old remark {k}.{j}.")
            self._owner.requester.requestJsonAndCheck(
                "PUT", f"{self._reviews}/{review.id}/dismissals", input={"message": f"Stale remark {k}.{j}."}
            )
        self._issue.create_comment("/durafix status")


@pytest.mark.timeout(1800)
async def test_300_deliveries_and_30_moved_heads_in_one_review_wait_merge_with_bounded_histories(
    stack_with_worker: E2EStack,
) -> None:
    stack = stack_with_worker
    started = time.monotonic()
    _, client, repository, _, wf, number, first, state = await opened_for_review(stack)
    opened_s = time.monotonic() - started
    branch = branch_for(wf)
    owner = stack.github(stack.owner_token()).get_repo(repository)
    hook = HookLog(stack, repository)
    before = {d["guid"] for d in hook.all()}
    # ``first`` is no head the run holds once the first moved head is under review, so the remarks made after
    # head k are sent while head k + 1 is verified: deliveries arrive in every part of the wait.
    remarks = Remarks(stack, repository, number, first)

    head = first
    for k in range(1, MOVED_HEADS + 1):
        pushed = stack.push_files(repository, {"NOTES.md": notes(k)}, f"Note how totals are made ({k})", branch=branch)
        if k > 1:
            remarks.send(pairs_after(k - 1), k - 1)
        state = await review_of(client, wf, pushed)
        assert state.pending_approval is not None and state.pending_approval.head_sha == pushed, (
            f"head {k} ({pushed}) was not offered for review: {state.outcome_detail}"
        )
        head = pushed
    remarks.send(pairs_after(MOVED_HEADS), MOVED_HEADS)
    # Every delivery answered before the approval: none may reach a run that has ended.
    wait_for(hook.drained, 300, "the forge's deliveries to the receiver")
    loaded_s = time.monotonic() - started - opened_s
    # The first push and the first stale remark, answered long ago (in an earlier run once the wait continued
    # as new), redelivered by the forge: each is answered as the duplicate it is, nothing done again.
    ours = [d for d in hook.all() if d["guid"] not in before and (d["event"], d["action"]) in ANSWERED]
    early = [next(d["guid"] for d in ours if d["event"] == event) for event in ("pull_request", "pull_request_review")]
    again = [hook.redelivered(guid) for guid in early]

    stack.approve_on_forge(repository, number, head)
    final = await state_when(client, wf, finished)
    runs = await executions(client, wf)
    measured = report(
        f"{wf}: opened in {opened_s:.0f}s, {MOVED_HEADS} heads and the deliveries in {loaded_s:.0f}s, "
        f"whole test {time.monotonic() - started:.0f}s",
        runs,
    )
    print(measured)

    # The premise, from the forge: the deliveries about the run were made and the receiver answered each 200.
    assert len(ours) >= DELIVERIES, f"{len(ours)} deliveries\n{measured}"
    assert all(d["status_code"] == 200 for d in ours), [d for d in ours if d["status_code"] != 200]
    # ... and from the server: each reached a run of the workflow ID as an accepted Update.
    accepted = {u for r in runs for u in r.accepted_updates}
    assert all(f"delivery:{d['guid']}" in accepted for d in ours), measured
    assert all(status == 200 and answer.get("duplicate") is True for status, answer in again), again

    assert final.outcome == "merged", f"{final.outcome_detail}\n{measured}"
    assert final.merged_sha is not None and owner.get_branch("main").commit.sha == final.merged_sha
    assert file_on_main(stack, repository, "NOTES.md") == notes(MOVED_HEADS)
    for run in runs:
        assert run.events < MAX_EVENTS and run.bytes < MAX_BYTES, measured
    assert len(runs) > 1, f"the run never continued as new\n{measured}"
    assert all(r.status == WorkflowExecutionStatus.CONTINUED_AS_NEW for r in runs[:-1]), measured
    assert runs[-1].status == WorkflowExecutionStatus.COMPLETED, measured
