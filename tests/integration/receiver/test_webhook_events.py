"""Webhook events beyond triggers and reviews, with the emulator's own deliveries to the real receiver, on the
real Temporal dev server: issue commands (``/durafix status|cancel|retry``), a closed issue cancelling its run,
pushes to durafix's PR told to the run as ``head_moved``, and deliveries recorded once by their GUID (a
redelivery through the hook-delivery API is answered as the duplicate it is: read back from the emulator's
record of each delivery attempt).

The fast tests run the workflow (and, where said, the forge activities) only, so a run stays in intake or
waits at provisioning; the slow one runs the whole pipeline on the embedded stack: a review delivered while
the run still publishes is held and merges once, its duplicate and redelivery change nothing, and a retried
run of the same issue is cancelled by closing the issue, its cleanup removing what it owned.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from github.Repository import Repository
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

from pipeline import client as runs
from pipeline.ids import branch_for, is_run_of, parse_run_id, parse_workflow_id, workflow_id_for
from pipeline.receiver.commands import CommandName, parse_command
from pipeline.services import Services
from pipeline.state import CancelStep, DeliveryKind, HeadPush, Outcome, Phase, RunState
from pipeline.steps import TaskQueue
from pipeline.workflow import WORKFLOWS
from reviews.markers import COMMENT, PULL, find_marker, pull_marker
from tests.e2e.test_pipeline import finished, state_when
from tests.replay.record import record_history
from tests.support.e2e_stack import E2EStack, owned_processes, wait_for
from tests.support.forge import branch_with, commit_files
from tests.support.forge_logins import BOT, MAINTAINER, OUTSIDER, OWNER, READER, TRIAGER, TRIGGER
from tests.support.security_harness import Site, eventually, example, workers

# ---- the emulator's record of deliveries, through GitHub's hook-delivery API ------------------------------


def hook_api(api_url: str, token: str, repository: str, method: str, path: str) -> Any:
    """One call of the repository's hooks API (``path`` below ``/repos/{repository}/hooks``) as its owner."""
    req = urllib.request.Request(
        f"{api_url}/repos/{repository}/hooks{path}", method=method, headers={"Authorization": f"token {token}"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read()
        return json.loads(raw) if raw else None


class Deliveries:
    """A repository's webhook deliveries as its owner reads them: each attempt with its answer."""

    def __init__(self, api_url: str, token: str, repository: str) -> None:
        self.api_url, self.token, self.repository = api_url, token, repository
        [hook] = hook_api(api_url, token, repository, "GET", "")
        self.hook_id = hook["id"]

    def _call(self, method: str, path: str) -> Any:
        return hook_api(self.api_url, self.token, self.repository, method, f"/{self.hook_id}{path}")

    def attempts(self, event: str, action: str | None = None, guid: str | None = None) -> list[dict[str, Any]]:
        """Every finished attempt of ``event`` (and ``action``, and ``guid``), oldest first, with the
        receiver's answer parsed (``answer``)."""

        def done() -> list[dict[str, Any]] | None:
            listed = self._call("GET", "/deliveries")
            if any(d["status"] == "pending" for d in listed):
                return None
            return [
                d
                for d in reversed(listed)
                if d["event"] == event
                and (action is None or d["action"] == action)
                and (guid is None or d["guid"] == guid)
            ]

        found = wait_for(done, 60, "the deliveries to be attempted", interval_s=0.2)
        full = [self._call("GET", f"/deliveries/{d['id']}") for d in found]
        for d in full:
            payload = d["response"]["payload"]
            d["answer"] = json.loads(payload) if payload else {}
        return full

    def redeliver(self, delivery: dict[str, Any]) -> dict[str, Any]:
        """Ask for ``delivery`` again (same GUID); the answer of that new attempt."""
        before = len(self.attempts(delivery["event"], guid=delivery["guid"]))
        self._call("POST", f"/deliveries/{delivery['id']}/attempts")
        again = wait_for(lambda: self.attempts(delivery["event"], guid=delivery["guid"])[before:], 60, "the redelivery")
        assert again[0]["redelivery"] is True
        return dict(again[0])


def command_attempts(deliveries: Deliveries, *comment_ids: int) -> list[dict[str, Any]]:
    """The attempts of the ``issue_comment`` deliveries of the comments ``comment_ids``, in that order (the
    bot's own comments, such as the run's ticket, are delivered too)."""
    attempts = deliveries.attempts("issue_comment", "created")
    return [d for cid in comment_ids for d in attempts if d["request"]["payload"]["comment"]["id"] == cid]


def deliveries_of(site: Site) -> Deliveries:
    return Deliveries(site.forge.handle.api_url, site.forge.tokens[OWNER], site.repository)


# ---- runs and what reached them ---------------------------------------------------------------------------


@asynccontextmanager
async def workflows(client: Client) -> AsyncIterator[None]:
    """The workflow worker alone: runs stay in intake and answer Updates and queries."""
    async with Worker(client, task_queue=TaskQueue.ORCHESTRATION.value, workflows=list(WORKFLOWS)):
        yield


async def started_run(site: Site, title: str = "Total is wrong") -> tuple[int, str]:
    """An issue labelled by the triager (a real delivery) and the run it started."""
    issue = await asyncio.to_thread(site.repo(OUTSIDER).create_issue, title=title, body="see title")
    await asyncio.to_thread(site.repo(TRIAGER).get_issue(issue.number).add_to_labels, TRIGGER)
    workflow_id = site.run_id(issue.number)
    await eventually(lambda: site.status(workflow_id), 30, "the run to start")
    return issue.number, workflow_id


async def first_task_done(site: Site, workflow_id: str) -> RunState:
    async def answered() -> RunState | None:
        try:
            return await runs.get_state(site.client, workflow_id)
        except Exception:
            return None

    state: RunState = await eventually(answered, 60, "the workflow's first task")
    return state


async def head_pushes(site: Site, workflow_id: str) -> list[HeadPush]:
    found: list[HeadPush] = []
    for event in await site.events(workflow_id, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED):
        attrs = event.workflow_execution_signaled_event_attributes
        if attrs.signal_name == "head_moved":
            found += await site.client.data_converter.decode(attrs.input.payloads, [HeadPush])
    return found


def keyed_comments(repo: Repository, number: int, key: str) -> list[str]:
    """The bot's comments on issue ``number`` carrying ``key``."""
    found = []
    for comment in repo.get_issue(number).get_comments():
        marker = find_marker(comment.body, COMMENT)
        if comment.user.login == BOT and marker and marker.attrs.get("key") == key:
            found.append(comment.body)
    return found


def command(site: Site, login: str, number: int, text: str) -> int:
    """``login`` comments ``text`` on issue (or PR) ``number``; the comment's ID."""
    return int(site.repo(login).get_issue(number).create_comment(text).id)


def bot_pr(site: Site, workflow_id: str, branch: str) -> tuple[int, str]:
    """The run's PR as the run makes it: a branch pushed and a draft PR opened by the bot's adapter."""
    head = branch_with(site.repo(BOT), branch, {"cart.py": "fixed = True\n"})
    with Services(site.config).forge(site.repository) as adapter:
        pr = adapter.ensure_draft_pr(workflow_id, branch, "main", "Fix the total", "The fix.")
    return pr.number, head


def push(repo: Repository, branch: str, files: dict[str, str]) -> str:
    """A commit on top of ``branch`` moved onto it through the git data API (the forge sends ``synchronize``)."""
    ref = repo.get_git_ref(f"heads/{branch}")
    sha = commit_files(repo, ref.object.sha, files, "push to the PR")
    ref.edit(sha)
    return sha


# ---- pushes to durafix's PR ------------------------------------------------------------------------------


async def test_a_maintainers_push_to_the_pr_is_sent_as_head_moved_once_and_the_bots_own_is_ignored(
    site: Site,
) -> None:
    _, workflow_id = await started_run(site)
    branch = "durafix/fix-sync"
    async with workflows(site.client):
        await first_task_done(site, workflow_id)
        number, head = await asyncio.to_thread(bot_pr, site, workflow_id, branch)
        pushed = await asyncio.to_thread(push, site.repo(MAINTAINER), branch, {"cart.py": "fixed = 'mine'\n"})
        deliveries = deliveries_of(site)
        [sync] = await asyncio.to_thread(deliveries.attempts, "pull_request", "synchronize")
        assert sync["status_code"] == 200, sync["answer"]
        assert await head_pushes(site, workflow_id) == [
            HeadPush(
                pr_number=number,
                head_sha=pushed,
                before=head,
                pusher=MAINTAINER,
                source=f"webhook:{sync['guid']}",
            )
        ]
        # The same delivery again (GitHub's redelivery) is answered as a duplicate naming the first handling.
        again = await asyncio.to_thread(deliveries.redeliver, sync)
        assert again["status_code"] == 200 and again["answer"]["duplicate"] is True, again["answer"]
        first = again["answer"]["first_handled"]
        assert (first["delivery"], first["kind"]) == (sync["guid"], DeliveryKind.HEAD_PUSH.value)
        # The bot's push is the run's own: nothing is sent.
        await asyncio.to_thread(push, site.repo(BOT), branch, {"cart.py": "fixed = 'bot'\n"})
        syncs = await asyncio.to_thread(deliveries.attempts, "pull_request", "synchronize")
        assert [d["status_code"] for d in syncs] == [200, 200, 202], [d["answer"] for d in syncs]
        assert "own login" in syncs[-1]["answer"]["message"]
        assert len(await head_pushes(site, workflow_id)) == 1
        state = await runs.get_state(site.client, workflow_id)
    assert [(r.delivery, r.kind) for r in state.deliveries] == [(sync["guid"], DeliveryKind.HEAD_PUSH)]


# ---- comment commands ------------------------------------------------------------------------------------


async def test_status_and_unknown_commands_are_answered_once_each_and_only_for_triagers(site: Site) -> None:
    number, workflow_id = await started_run(site)
    repo = site.repo(MAINTAINER)
    async with workers(site.client, site.config):
        await eventually(lambda: _with_ticket(site, workflow_id), 60, "the run's ticket")
        refused = await asyncio.to_thread(command, site, READER, number, "/durafix status")
        asked = await asyncio.to_thread(command, site, TRIAGER, number, "/durafix status please")
        unknown = await asyncio.to_thread(command, site, MAINTAINER, number, "/durafix frobnicate")
        by_bot = await asyncio.to_thread(command, site, BOT, number, "/durafix cancel")
        prose = await asyncio.to_thread(command, site, MAINTAINER, number, "durafix status (not a command)")
        deliveries = deliveries_of(site)
        answers = await asyncio.to_thread(command_attempts, deliveries, refused, asked, unknown, by_bot, prose)
        assert [d["status_code"] for d in answers] == [403, 200, 200, 202, 202], [d["answer"] for d in answers]
        assert answers[0]["answer"]["required"] == "triage"
        assert await site.status(workflow_id) == WorkflowExecutionStatus.RUNNING

        assert await asyncio.to_thread(keyed_comments, repo, number, f"command:{refused}") == []
        [status] = await asyncio.to_thread(keyed_comments, repo, number, f"command:{asked}")
        assert f"`{workflow_id}`" in status and "- phase: `" in status
        assert "repair attempts: 0/" in status and "model tokens:" in status
        [help_] = await asyncio.to_thread(keyed_comments, repo, number, f"command:{unknown}")
        assert "`/durafix frobnicate` is not a durafix command" in help_
        assert all(f"`/durafix {name}`" in help_ for name in ("status", "cancel", "retry"))

        # A redelivered command comments nothing twice.
        again = await asyncio.to_thread(deliveries.redeliver, answers[1])
        assert again["status_code"] == 200, again["answer"]
        assert len(await asyncio.to_thread(keyed_comments, repo, number, f"command:{asked}")) == 1


async def _with_ticket(site: Site, workflow_id: str) -> RunState | None:
    try:
        state = await runs.get_state(site.client, workflow_id)
    except Exception:
        return None
    return state if state.ticket is not None else None


async def test_cancel_command_cancels_the_live_run_once_and_then_there_is_none(site: Site) -> None:
    number, workflow_id = await started_run(site)
    async with workflows(site.client):
        await first_task_done(site, workflow_id)
        asked = await asyncio.to_thread(command, site, MAINTAINER, number, "/durafix cancel")
        deliveries = deliveries_of(site)
        [cancel] = await asyncio.to_thread(command_attempts, deliveries, asked)
        assert cancel["status_code"] == 200, cancel["answer"]
        assert cancel["answer"]["workflow_id"] == workflow_id
        requested = await site.events(workflow_id, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED)
        assert len(requested) == 1
        state = await eventually(
            lambda: _cancellation_started(site, workflow_id), 30, "the run to start its cancellation"
        )
        assert [(r.delivery, r.kind) for r in state.deliveries] == [(cancel["guid"], DeliveryKind.COMMAND)]
        # The same command redelivered is the duplicate it is: no second cancellation request.
        again = await asyncio.to_thread(deliveries.redeliver, cancel)
        assert again["answer"]["duplicate"] is True, again["answer"]
        assert again["answer"]["first_handled"]["delivery"] == cancel["guid"]
        assert len(await site.events(workflow_id, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED)) == 1

    # The run ended: closing the issue finds no live run.
    await site.client.get_workflow_handle(workflow_id).terminate("ended for the test")
    await asyncio.to_thread(lambda: site.repo(TRIAGER).get_issue(number).edit(state="closed"))
    [closed] = await asyncio.to_thread(deliveries.attempts, "issues", "closed")
    assert closed["status_code"] == 202 and "no live run" in closed["answer"]["message"], closed["answer"]


async def _cancellation_started(site: Site, workflow_id: str) -> RunState | None:
    state = await runs.get_state(site.client, workflow_id)
    return state if any(m.step == CancelStep.REQUESTED for m in state.cancellation) else None


async def test_an_outsiders_close_or_unlabel_cancels_nothing(site: Site) -> None:
    number, workflow_id = await started_run(site)
    for action in ("closed", "unlabeled"):
        payload = example("issues", "unlabeled" if action == "unlabeled" else "labeled")
        payload.update(action=action, repository=site.repository_payload())
        payload["issue"]["number"] = number
        payload["label"] = {**payload.get("label", {}), "name": TRIGGER}
        payload["sender"]["login"] = OUTSIDER
        status, answer = await site.deliver("issues", payload)
        assert status == 403, answer
        assert answer["required"] == "triage"
    assert await site.events(workflow_id, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED) == []


async def test_retry_after_the_run_ended_starts_the_next_run_once_with_its_own_id_and_branch(site: Site) -> None:
    number, workflow_id = await started_run(site)
    deliveries = deliveries_of(site)
    # While the first run is live, a retry starts nothing.
    first = await asyncio.to_thread(command, site, MAINTAINER, number, "/durafix retry")
    [early] = await asyncio.to_thread(command_attempts, deliveries, first)
    assert early["status_code"] == 200 and early["answer"]["message"] == f"already running: {workflow_id}"

    await site.client.get_workflow_handle(workflow_id).terminate("ended for the test")
    retried = f"{workflow_id}~2"
    site.touched.add(retried)
    asked = await asyncio.to_thread(command, site, TRIAGER, number, "/durafix retry")
    asked_again = await asyncio.to_thread(command, site, MAINTAINER, number, "/durafix retry")
    retry, second = await asyncio.to_thread(command_attempts, deliveries, asked, asked_again)
    assert retry["status_code"] == 202, retry["answer"]
    assert (retry["answer"]["workflow_id"], retry["answer"]["retry_of"]) == (retried, workflow_id)
    assert second["status_code"] == 200 and second["answer"]["message"] == f"already running: {retried}"

    assert await site.status(retried) == WorkflowExecutionStatus.RUNNING
    assert await site.status(f"{workflow_id}~3") is None
    inp = await site.started_input(retried)
    assert (inp.repository, inp.issue_number, inp.trigger) == (site.repository, number, f"webhook:{retry['guid']}")
    assert parse_workflow_id(retried) == (site.repository, number) and parse_run_id(retried)[2] == 2
    assert branch_for(retried) != branch_for(workflow_id)
    # The redelivered retry is the one that started run 2: nothing more starts.
    again = await asyncio.to_thread(deliveries.redeliver, retry)
    assert again["answer"]["duplicate"] is True and again["answer"]["workflow_id"] == retried, again["answer"]
    assert await site.status(f"{workflow_id}~3") is None


# ---- the whole pipeline ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.browser
async def test_a_review_before_the_wait_is_held_merges_once_and_a_retried_run_is_cancelled_by_closing_the_issue(
    stack_with_worker: E2EStack,
) -> None:
    stack = stack_with_worker
    client, repository, issue, wf = await stack.open_run()
    owner = stack.owner_token()
    deliveries = Deliveries(stack.config.forge_api_url, owner, repository)
    admin = stack.github(owner).get_repo(repository)
    # The evidence comment on the PR (the run's first PR is #2, after the report) is held up at the forge:
    # the run has opened its PR and is still publishing when the review comes.
    stack_faults(stack, repository, pr_number=issue + 1)

    def publishing_with_pr(state: RunState, status: WorkflowExecutionStatus | None) -> bool:
        return state.phase == Phase.PUBLISH and state.publish is not None and state.publish.pr_number is not None

    state = await state_when(client, wf, publishing_with_pr)
    assert state.publish is not None and state.publish.pr_number == issue + 1
    head = state.publish.commit
    await asyncio.to_thread(stack.approve_on_forge, repository, issue + 1, head)
    [review] = await asyncio.to_thread(deliveries.attempts, "pull_request_review", "submitted")
    assert review["status_code"] == 200, review["answer"]
    assert "held until the review wait begins" in review["answer"]["detail"], review["answer"]

    final = await state_when(client, wf, finished)
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    assert final.approval is not None and final.approval.head_sha == head
    # The same delivery posted again as the forge sent it (as to a second receiver), and redelivered through
    # the hook-delivery API: each answered as a duplicate naming the first handling; nothing more happens.
    status, answer = await asyncio.to_thread(post_again, stack, review["guid"])
    assert status == 200 and answer["duplicate"] is True, answer
    assert answer["first_handled"]["delivery"] == review["guid"]
    again = await asyncio.to_thread(deliveries.redeliver, review)
    assert again["status_code"] == 200, again["answer"]
    assert again["answer"]["duplicate"] is True
    assert again["answer"]["first_handled"]["delivery"] == review["guid"]
    assert again["answer"]["first_handled"]["phase"] == Phase.PUBLISH.value
    state = await runs.get_state(client, wf)
    assert [(r.delivery, r.kind) for r in state.deliveries] == [(review["guid"], DeliveryKind.APPROVAL)]
    main = admin.get_branch("main").commit
    assert main.sha == final.merged_sha and len(main.parents) == 2
    merges = [c for c in admin.get_commits(sha="main") if len(c.parents) > 1]
    assert [c.sha for c in merges] == [final.merged_sha]
    record_history(await client.get_workflow_handle(wf).fetch_history(), "decision-held-until-review-wait")

    # /durafix retry on the issue whose run ended: run 2, then closing the issue cancels it mid-run.
    retried = f"{wf}~2"
    await asyncio.to_thread(lambda: admin.get_issue(issue).create_comment("/durafix retry"))

    def env_live(state: RunState, status: WorkflowExecutionStatus | None) -> bool:
        return (state.environment is not None and state.environment.last_status == "ready") or finished(state, status)

    await state_when(client, retried, env_live)
    wait_for(lambda: owned_processes(retried), 60, "the app process of run 2")
    await asyncio.to_thread(lambda: admin.get_issue(issue).edit(state="closed"))
    [closed] = await asyncio.to_thread(deliveries.attempts, "issues", "closed")
    assert closed["status_code"] == 200 and closed["answer"]["workflow_id"] == retried, closed["answer"]
    ended = await state_when(client, retried, finished)
    assert await runs.status_of(client, retried) == WorkflowExecutionStatus.CANCELED
    assert ended.outcome == Outcome.CANCELLED, ended.outcome_detail
    assert ended.cleanup is not None and ended.cleanup.complete and ended.cleanup.removed >= 1
    assert owned_processes(retried) == []
    branches = {b.name for b in admin.get_branches()}
    assert branch_for(retried) not in branches
    assert await runs.status_of(client, wf) == WorkflowExecutionStatus.COMPLETED


def post_again(stack: E2EStack, guid: str) -> tuple[int, dict[str, Any]]:
    """The first attempt of delivery ``guid`` posted to the receiver again, byte for byte (signature and
    GUID included), as the emulator recorded it; the receiver's status and answer."""
    req = urllib.request.Request(
        f"{stack.config.forge_api_url}/admin/deliveries", headers={"Authorization": f"token {stack.admin_token}"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        recorded = [d for d in json.loads(resp.read()) if d["guid"] == guid]
    request = recorded[0]["request"]
    post = urllib.request.Request(
        stack.receiver.url, data=request["body"].encode(), method="POST", headers=request["headers"]
    )
    try:
        with urllib.request.urlopen(post, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def stack_faults(stack: E2EStack, repository: str, pr_number: int) -> None:
    """Delay the first comment the bot posts on PR ``pr_number`` (the run's evidence comment) by 7 s (less than
    the step's timeout, so it is posted once)."""
    body = json.dumps(
        {
            "method": "POST",
            "path_regex": rf"/repos/{repository}/issues/{pr_number}/comments$",
            "action": "delay",
            "seconds": 7,
            "count": 1,
        }
    ).encode()
    req = urllib.request.Request(
        f"{stack.config.forge_api_url}/admin/faults",
        data=body,
        method="POST",
        headers={"Authorization": f"token {stack.admin_token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 201, resp.status  # the fault is in place before the run reaches it


# ---- what the receiver parses ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("/durafix status", ("status", CommandName.STATUS)),
        ("  /DURAFIX Retry now\nplease", ("retry", CommandName.RETRY)),
        ("/durafix cancel", ("cancel", CommandName.CANCEL)),
        ("/durafix frobnicate", ("frobnicate", None)),
        ("/durafix", ("", None)),
        ("/durafixes status", None),
        ("please /durafix status", None),
        ("", None),
        (None, None),
    ],
)
def test_a_command_is_a_comment_starting_with_durafix_and_its_name(
    body: str | None, expected: tuple[str, CommandName | None] | None
) -> None:
    parsed = parse_command(body)
    assert (None if parsed is None else (parsed.name, parsed.known)) == expected


def test_retried_run_ids_round_trip_and_keep_naming_their_issue() -> None:
    first, second = workflow_id_for("acme/shop", 7), workflow_id_for("acme/shop", 7, 2)
    assert (first, second) == ("repair:acme/shop#7", "repair:acme/shop#7~2")
    assert parse_run_id(first) == ("acme/shop", 7, 1) and parse_run_id(second) == ("acme/shop", 7, 2)
    assert parse_workflow_id(second) == ("acme/shop", 7)
    assert is_run_of(second, "acme/shop") and not is_run_of(second, "acme/other")
    for bad in ("repair:acme/shop#7~1", "repair:acme/shop#7~", "repair:acme/shop#7~02", "repair:acme/shop#7~x"):
        with pytest.raises(ValueError):
            parse_run_id(bad)
    assert len({branch_for(workflow_id_for("acme/shop", 7, k)) for k in (1, 2, 3)}) == 3
    assert find_marker(pull_marker(second).render(), PULL) == pull_marker(second)
