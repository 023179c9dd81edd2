"""Evidence on real S3 through a worker crash, read back the way a reviewer reads it.

One run on the embedded stack with the evidence store on SeaweedFS (SigV4 checked). Its only worker is
SIGKILLed while ``browser.reproduce`` is running (Chromium mid-procedure); a replacement worker finishes the
run up to awaiting-review. Then:

- every ``ArtifactRef`` anywhere in the run's state is read back from the S3 store, hash-verified, and its
  object's size equals the ref's size (the killed attempt left no reference to a partial upload);
- the evidence comment on the draft PR links the reviewer's report (a presigned S3 URL), which real Chromium
  renders with its screenshots, both revisions and the same bundle digest the comment and the state name;
- an approval naming another evidence digest is refused before it enters history; the right one merges.

The tests share the run (module-scoped), so they run in file order; the last one ends the run.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit, urlunsplit

import httpx
import pytest
from playwright.async_api import async_playwright
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.client import Client, WorkflowQueryFailedError, WorkflowUpdateFailedError
from temporalio.service import RPCError

from browser.runner import CHROMIUM_ARGS
from evidence.interface import ArtifactRef
from evidence.s3 import S3ArtifactStore
from infra import processes, stack
from infra.processes import ServiceError
from infra.s3 import weed_binary
from pipeline import client as runs
from pipeline import steps
from pipeline.services import Services
from pipeline.state import Approval, Outcome, RunState
from tests.conftest import require
from tests.e2e.test_pipeline import RUN_TIMEOUT_S, awaiting_review, finished, state_when
from tests.support.chromium import chromium_path
from tests.support.e2e_stack import E2EStack, kill, owned_processes, running_e2e_stack, wait_for
from tests.support.proctree import Proc, descendants, is_chromium_browser

pytestmark = [
    pytest.mark.slow,
    pytest.mark.s3,
    pytest.mark.browser,
    # The first test also pays for the stack and the run up to awaiting-review (its module fixtures).
    pytest.mark.timeout(600),
]

REPRODUCE = steps.REPRODUCE.name
# Runs opened at most to see the worker killed while its reproduction is running (one nearly always does).
KILL_TRIES = 3


@pytest.fixture(scope="module")
def s3_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EStack]:
    """The embedded stack with its evidence store on SeaweedFS, plus the webhook receiver."""
    require(shutil.which("git") is not None, "git is not installed")
    chromium_path()
    try:
        weed_binary()
    except ServiceError as err:
        require(False, str(err))
    state = tmp_path_factory.mktemp("durafix-e2e-s3")
    require(shutil.which("ffmpeg") is not None, "ffmpeg is not installed (apt-get install ffmpeg)")
    with running_e2e_stack(state, evidence="s3") as e2e:
        # Workers started from here on record a video of every reproduction run.
        e2e.config.browser_video = True
        e2e.config.save()
        yield e2e


@dataclass
class CrashedRun:
    stack: E2EStack
    client: Client
    repository: str
    issue: int
    workflow_id: str
    killed_attempt: PendingActivityInfo
    killed_worker_pid: int
    killed_descendants: list[Proc]
    state: RunState


@pytest.fixture(scope="module")
async def crashed_run(s3_stack: E2EStack) -> AsyncIterator[CrashedRun]:
    """A run whose only worker was SIGKILLed during ``browser.reproduce``, finished by a replacement worker
    up to awaiting-review. Workers stay up until the module ends (the last test merges)."""
    stack_ = s3_stack
    try:
        for _ in range(KILL_TRIES):
            worker = stack_.spawn_worker()
            client, repository, issue, wf = await stack_.open_run()
            running = await reproduction_running(client, wf, worker)
            assert running.last_worker_identity.startswith(f"{worker.pid}@"), running.last_worker_identity
            below = descendants(worker.pid)
            kill(worker)
            wait_for(lambda dead=worker: not processes.is_alive(dead), 10, "the killed worker to be gone")
            if await still_pending(client, wf, running):
                break
            # The attempt completed between being seen and the SIGKILL landing (a short procedure on a loaded
            # host): this run saw no crash mid-reproduction. It is cancelled (a later worker cleans it up) and a
            # new one is opened.
            await client.get_workflow_handle(wf).cancel()
        else:
            raise AssertionError(f"{REPRODUCE} completed before the SIGKILL landed in each of {KILL_TRIES} runs")
        stack_.spawn_worker()
        state = await state_when(client, wf, awaiting_review)
        yield CrashedRun(
            stack=stack_,
            client=client,
            repository=repository,
            issue=issue,
            workflow_id=wf,
            killed_attempt=running,
            killed_worker_pid=worker.pid,
            killed_descendants=below,
            state=state,
        )
    finally:
        stack_.stop_workers()


async def reproduction_running(
    client: Client, workflow_id: str, worker: processes.ServiceRecord
) -> PendingActivityInfo:
    """Poll the workflow's pending activities until an attempt of ``browser.reproduce`` has started and
    heartbeated, and Chromium runs below ``worker`` (the attempt heartbeats before it launches the browser, while
    it probes ffmpeg's encoders: a kill then would find no browser to leave behind)."""
    handle = client.get_workflow_handle(workflow_id)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        assert processes.is_alive(worker), processes.log_tail(Path(worker.log))
        try:
            desc = await handle.describe()
            state = await runs.get_state(client, workflow_id)
        except (RPCError, WorkflowQueryFailedError) as err:
            # The webhook has not started the run yet, or its first workflow task has not run.
            last_error = err
            await asyncio.sleep(0.2)
            continue
        assert state.reproduction is None and state.outcome is None, f"the reproduction was missed: {state!r}"
        for act in desc.raw_description.pending_activities:
            started = act.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
            beat = act.activity_type.name == REPRODUCE and started and act.heartbeat_details.payloads
            if beat and descendants(worker.pid, is_chromium_browser):
                return act
        await asyncio.sleep(0.1)
    raise AssertionError(f"{workflow_id}: {REPRODUCE} never ran in {RUN_TIMEOUT_S}s (last error: {last_error})")


async def still_pending(client: Client, workflow_id: str, seen: PendingActivityInfo) -> bool:
    """Whether the activity ``seen`` running is still pending after its worker was killed: the kill landed mid
    attempt, not after the attempt's completion reached the server. Asked after a pause, so that a completion
    already on its way when the process died has arrived."""
    await asyncio.sleep(1.0)
    desc = await client.get_workflow_handle(workflow_id).describe()
    return any(act.activity_id == seen.activity_id for act in desc.raw_description.pending_activities)


def refs_in(value: object) -> list[ArtifactRef]:
    """Every ``ArtifactRef`` reachable from ``value`` (models, lists, dicts)."""
    if isinstance(value, ArtifactRef):
        return [value]
    if isinstance(value, BaseModel):
        return [ref for name in type(value).model_fields for ref in refs_in(getattr(value, name))]
    if isinstance(value, list | tuple):
        return [ref for item in value for ref in refs_in(item)]
    if isinstance(value, dict):
        return [ref for item in value.values() for ref in refs_in(item)]
    return []


def s3_store(stack_: E2EStack) -> S3ArtifactStore:
    store = Services(stack_.config).store
    assert isinstance(store, S3ArtifactStore), f"the evidence store is not on S3: {stack_.config.evidence_url}"
    return store


async def test_worker_killed_mid_reproduction_leaves_only_complete_verified_artifacts_on_s3(
    crashed_run: CrashedRun, tmp_path: Path
) -> None:
    run = crashed_run
    state = run.state
    assert state.pending_approval is not None, state.outcome_detail
    assert state.reproduction is not None and state.reproduction.status == "reproduced"
    candidate = state.candidate
    assert candidate is not None and candidate.replay is not None and state.publish is not None

    # The killed attempt really was running and never completed: the reproduction that counted is another
    # attempt (a retry of the same activity, or the step sent again or provisioned anew: each is a new
    # activity) on another worker.
    history = await run.client.get_workflow_handle(run.workflow_id).fetch_history()
    scheduled = {
        e.event_id: e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    reproduce_starts = [
        e.activity_task_started_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and scheduled[e.activity_task_started_event_attributes.scheduled_event_id].activity_type.name == REPRODUCE
    ]
    base_start = reproduce_starts[0]
    counted = (scheduled[base_start.scheduled_event_id].activity_id, base_start.attempt)
    assert counted != (run.killed_attempt.activity_id, run.killed_attempt.attempt), counted
    assert base_start.identity != run.killed_attempt.last_worker_identity
    assert not base_start.identity.startswith(f"{run.killed_worker_pid}@")

    refs = [
        *refs_in(state.evidence),
        *refs_in(state.environment),
        *refs_in(state.reproduction),
        *refs_in(state.candidates),
        *refs_in(state.publish),
    ]
    kinds = {ref.kind.value for ref in refs}
    expected = {
        "procedure",
        "spec",
        "trace",
        "screenshot",
        "video",
        "log",
        "patch",
        "test-output",
        "bundle",
        "manifest",
        "report",
    }
    assert expected <= kinds, kinds
    store = s3_store(run.stack)
    for i, ref in enumerate({ref.key: ref for ref in refs}.values()):
        head = store.client.head_object(Bucket=store.bucket, Key=store.prefix + ref.key)
        assert head["ContentLength"] == ref.size, f"{ref.name}: object has {head['ContentLength']} bytes"
        assert head["Metadata"].get("sha256") == ref.sha256, ref.name
        copy = store.get_to_file(ref, tmp_path / f"{i}-{ref.name}")
        data = copy.read_bytes()
        assert len(data) == ref.size and hashlib.sha256(data).hexdigest() == ref.sha256, ref.name
        assert store.read_bytes(ref) == data
    # The same artifact bytes under another name are one object: state refs never disagree on a key.
    by_key: dict[str, set[tuple[str, int]]] = {}
    for ref in refs:
        by_key.setdefault(ref.key, set()).add((ref.sha256, ref.size))
    assert all(len(v) == 1 for v in by_key.values()), by_key

    # The killed worker's Chromium and driver did not outlive it. What it started for the run's environment (the
    # app behind its forwarder, carrying the run's ownership marker) is the run's until the run ends: either the
    # step sent again to the same host adopts it, or the host was taken for gone and the environment provisioned
    # anew, and what the old host holds is the run's cleanup's at the end (the last test: nothing left).
    assert any(is_chromium_browser(list(p.argv)) for p in run.killed_descendants), [
        " ".join(p.argv)[:150] for p in run.killed_descendants
    ]
    owned = set(owned_processes(run.workflow_id))

    def strays() -> list[Proc]:
        return [p for p in run.killed_descendants if p.alive() and p.pid not in owned]

    try:
        wait_for(lambda: not strays(), 60, "the killed worker's browser to exit")
    except AssertionError as err:
        raise AssertionError(f"{err}; still alive: {[' '.join(p.argv)[:200] for p in strays()]}") from None
    kept = [p for p in run.killed_descendants if p.alive() and p.pid in owned]
    forwarders = [p for p in kept if "app_forwarder.py" in " ".join(p.argv)]
    below = {d.pid for f in forwarders for d in descendants(f.pid)}
    assert all(p in forwarders or p.pid in below for p in kept), [" ".join(p.argv)[:150] for p in kept]


def report_link_and_digest(body: str) -> tuple[str, str]:
    link = re.search(r"^- report: (\S+)$", body, re.MULTILINE)
    digest = re.search(r"evidence bundle digest: `([0-9a-f]{64})`", body)
    assert link is not None and digest is not None, body
    return link.group(1), digest.group(1)


async def test_evidence_comment_links_a_presigned_report_that_chromium_renders_with_the_same_digest(
    crashed_run: CrashedRun,
) -> None:
    run = crashed_run
    state = run.state
    publish = state.publish
    assert publish is not None and publish.pr_number is not None and state.pending_approval is not None
    repo = run.stack.github().get_repo(run.repository)
    comments = [c for c in repo.get_issue(publish.pr_number).get_comments() if "durafix evidence for" in c.body]
    assert [c.id for c in comments] == [publish.evidence_comment_id]
    assert f"durafix evidence for `{publish.commit}`" in comments[0].body
    report_url, comment_digest = report_link_and_digest(comments[0].body)
    assert report_url == publish.report_url
    assert comment_digest == publish.evidence_digest == state.pending_approval.evidence_digest
    assert publish.manifest_ref is not None and publish.manifest_ref.sha256 == comment_digest

    # A presigned URL on the stack's S3 server, which refuses the same object unsigned.
    s3_url = stack.read_stack(run.stack.state_dir).services["s3"].url
    parts = urlsplit(report_url)
    assert f"{parts.scheme}://{parts.netloc}" == s3_url
    assert "X-Amz-Signature" in parse_qs(parts.query)
    unsigned = httpx.get(urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")), timeout=10)
    assert unsigned.status_code == 403, unsigned.text[:300]

    executable = chromium_path()
    problems: list[str] = []
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=executable, args=list(CHROMIUM_ARGS))
        try:
            page = await browser.new_page()
            page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda err: problems.append(str(err)))
            page.on("requestfailed", lambda req: problems.append(f"request failed: {req.url}"))
            response = await page.goto(report_url, wait_until="load")
            assert response is not None and response.status == 200
            assert response.headers.get("content-type", "").startswith("text/html")
            widths: dict[str, list[int]] = {}
            for side in ("base", "candidate"):
                widths[side] = await page.eval_on_selector_all(
                    f"#side-{side} img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)"
                )
            base_revision = await page.get_attribute("#side-base", "data-revision")
            candidate_revision = await page.get_attribute("#side-candidate", "data-revision")
            videos = await page.eval_on_selector_all(
                "#traces li",
                "items => items.flatMap(li => [...li.querySelectorAll('a')].map(a => [li.textContent, a.href]))",
            )
            summary = await page.inner_text("#summary")
            shown_digest = await page.inner_text("#bundle-digest")
            regression = await page.inner_text("#regression")
            regression_rows = {
                side: await page.inner_text(f"#regression tr.regression-{side}") for side in ("base", "candidate")
            }
            regression_base_log = await page.get_attribute("#regression tr.regression-base a", "href")
            checks = await page.inner_text("#checks")
        finally:
            await browser.close()

    assert widths["base"] and widths["candidate"], widths
    assert all(w > 0 for side in widths.values() for w in side), widths
    assert base_revision == state.target_revision
    assert candidate_revision == publish.commit
    assert state.target_revision is not None and state.target_revision in summary and publish.commit in summary
    assert shown_digest == comment_digest
    assert problems == []

    # The regression proof: the demo's added test fails on the base's code and passes with the fix, and the
    # base run's log (linked) shows that test failing. The baseline run is listed with the checks.
    assert "proven" in regression and "tests/test_cart.py" in regression, regression
    assert "without the fix" in regression_rows["base"] and "failed" in regression_rows["base"]
    assert "with the fix" in regression_rows["candidate"] and "passed" in regression_rows["candidate"]
    assert regression_base_log is not None
    base_log = httpx.get(regression_base_log, timeout=30)
    assert base_log.status_code == 200 and "test_total_counts_quantities" in base_log.text
    assert "FAILED" in base_log.text
    assert "baseline (base revision, before any change)" in checks

    # Each revision's videos are linked (presigned) and are WebM files as stored.
    video_links = [(text, href) for text, href in videos if "-video.webm" in text]
    for side in ("base", "candidate"):
        assert any(text.startswith(side) for text, _ in video_links), videos
    for _, href in video_links:
        fetched = httpx.get(href, timeout=30)
        assert fetched.status_code == 200, fetched.text[:300]
        assert fetched.headers["content-type"] == "video/webm"
        assert fetched.content[:4] == b"\x1a\x45\xdf\xa3"  # the EBML header every WebM starts with


async def test_approval_naming_other_evidence_is_refused_and_the_right_digest_merges(
    crashed_run: CrashedRun,
) -> None:
    run = crashed_run
    client, wf = run.client, run.workflow_id
    pending = run.state.pending_approval
    assert pending is not None
    other = hashlib.sha256(pending.evidence_digest.encode()).hexdigest()

    wrong = Approval(reviewer="reviewer", head_sha=pending.head_sha, evidence_digest=other, review_id="other-evidence")
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await runs.approve(client, wf, wrong)
    assert pending.evidence_digest in str(refused.value.cause)
    still = await runs.get_state(client, wf)
    assert still.pending_approval == pending and still.approval is None

    right = Approval(
        reviewer="reviewer", head_sha=pending.head_sha, evidence_digest=pending.evidence_digest, review_id="evidence-ok"
    )
    ack = await runs.approve(client, wf, right)
    assert ack.accepted, ack.detail
    final = await state_when(client, wf, finished)
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    assert final.approval is not None and final.approval.evidence_digest == pending.evidence_digest

    # Only the right approval entered history.
    history = await client.get_workflow_handle(wf).fetch_history()
    accepted = [
        e.workflow_execution_update_accepted_event_attributes.accepted_request.meta.update_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    ]
    assert accepted == ["approve:evidence-ok"]

    pr = run.stack.github().get_repo(run.repository).get_pull(pending.pr_number)
    assert pr.merged and pr.head.sha == pending.head_sha and pr.merge_commit_sha == final.merged_sha
    assert owned_processes(wf) == []
    # Nothing the killed worker started is alive once the run has ended (its environment went with the run).
    assert [" ".join(p.argv)[:150] for p in run.killed_descendants if p.alive()] == []
