"""The reconciler: what a lost webhook delivery would have told a run, recovered from the forge's truth.

GitHub does not retry a failed delivery, so a receiver that was down (or answered 503) misses an approval, a
request for changes, a closed PR or issue, or a trigger until someone redelivers it. A pass
(:func:`reconcile_once`) lists the open ``repair_bug`` runs (Temporal visibility), queries each one's
``RunState``, reads its issue and (awaiting review) its PR, the bot's login and the permissions of the
reviewers who could decide, and delivers what the run has not seen, by the rules of
:mod:`pipeline.ops.reconcile_decisions` (the receiver's own). Then it looks for lost triggers: open issues
carrying the trigger label, in the repositories of open runs and ``config.reconcile_repositories``, that have
no run at all, started when the label's adder (or, on a forge keeping no issue events, the issue's author)
holds ``trigger_permission``. Such a run pins the issue's text as it is now, not as the lost delivery carried
it, so it is started only when that text could not have been edited after the label by someone below
``trigger_permission`` (:func:`pipeline.ops.reconcile_decisions.unpinnable`); otherwise the issue is told why no
run started and how to start one (a comment keyed by the label's event, written once).

Contract:
- Idempotent and safe to run at any time, from any number of processes: an approval is the ``approve`` Update
  with the review's ID (``pipeline.client.approve``), recorded once however often it is delivered, by a webhook
  or by a pass; a run that took it leaves ``AWAITING_REVIEW``, so the next pass sends nothing. A request for
  changes is not sent again once the run revised on it (its candidate names the review ID); the run ignores a
  repeated or stale one anyway. A start attaches to the run that exists (``pipeline.client.start_run``).
  Within a :class:`Reconciler`'s lifetime a signal (reject, head moved, cancel) already delivered to a run is
  not sent to it again; across processes the run's handlers ignore the repeat.
- A forge read that fails is counted and reported for its run (or repository) and is never a decision: that
  run gets nothing this pass. One run's failure (forge or Temporal) does not stop the pass.
- What it sends is never the authority: the merge re-reads the reviews on the forge anyway.
- Visibility lags a start by up to a second on the dev server: a run started just before a pass may be missing
  from its listing; the trigger check describes the workflow ID itself, so it is never started twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, Field, computed_field
from temporalio.client import (
    Client,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
)
from temporalio.service import RPCError, RPCStatusCode

from pipeline import client as runs
from pipeline.config import DurafixConfig
from pipeline.ids import parse_workflow_id, workflow_id_for
from pipeline.inputs import PinnedReport
from pipeline.ops.reconcile_decisions import (
    SOURCE,
    Decision,
    RunTruth,
    Skip,
    decide_run,
    deciding_reviewers,
    may_trigger,
    unpinnable,
)
from pipeline.services import Services
from pipeline.state import RunState
from reviews.approvals import reviewer_refusal
from reviews.errors import ForgeError
from reviews.issues import IssueInfo, LabelAdded
from reviews.permissions import RepoRole

log = logging.getLogger(__name__)

OPEN_RUNS = 'WorkflowType="repair_bug" AND ExecutionStatus="Running"'
QUERY_TIMEOUT_S = 10.0


class Delivered(BaseModel):
    """A decision delivered to a run (or a run started); ``detail`` is what the run answered, if anything."""

    workflow_id: str
    kind: str
    reason: str
    review_id: str | None = None
    head_sha: str | None = None
    detail: str = ""


class Failure(BaseModel):
    """A read or a delivery that failed; ``where`` is ``forge``, ``temporal``, or ``reconciler`` (an unexpected
    error reconciling one run, reported so the pass goes on)."""

    workflow_id: str | None = None
    repository: str | None = None
    where: Literal["forge", "temporal", "reconciler"]
    what: str
    error: str


class ReconcileReport(BaseModel):
    """One pass: what was delivered to which run, what was left alone and why, and what failed."""

    started_at: datetime
    finished_at: datetime | None = None
    runs_seen: list[str] = Field(default_factory=list)
    repositories: list[str] = Field(default_factory=list)
    delivered: list[Delivered] = Field(default_factory=list)
    skipped: list[Skip] = Field(default_factory=list)
    errors: list[Failure] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def forge_read_failures(self) -> int:
        """How many forge reads failed this pass (each is in ``errors``, naming its run or repository)."""
        return sum(1 for e in self.errors if e.where == "forge")


@dataclass
class _Context:
    client: Client
    config: DurafixConfig
    report: ReconcileReport
    sent: set[str]


async def reconcile_once(client: Client, config: DurafixConfig, *, sent: set[str] | None = None) -> ReconcileReport:
    """One pass over the open runs and the watched repositories (see the module's contract). ``sent`` holds the
    keys of signals already delivered (a :class:`Reconciler` keeps it across passes); it is updated in place."""
    ctx = _Context(client, config, ReconcileReport(started_at=datetime.now(UTC)), sent if sent is not None else set())
    open_runs: list[str] = []
    try:
        async for wf in client.list_workflows(OPEN_RUNS):
            open_runs.append(wf.id)
    except RPCError as err:
        ctx.report.errors.append(Failure(where="temporal", what="list the open runs", error=str(err)))
    ctx.report.runs_seen = sorted(open_runs)
    repositories = set(config.reconcile_repositories)
    for workflow_id in ctx.report.runs_seen:
        with contextlib.suppress(ValueError):
            repositories.add(parse_workflow_id(workflow_id)[0])
        try:
            await _reconcile_run(ctx, workflow_id)
        except Exception as err:  # one run's unexpected failure must not stop the pass for the others
            log.exception("reconciling %s failed", workflow_id)
            ctx.report.errors.append(
                Failure(workflow_id=workflow_id, where="reconciler", what="reconcile the run", error=repr(err))
            )
    ctx.report.repositories = sorted(repositories)
    for repository in ctx.report.repositories:
        try:
            await _find_lost_triggers(ctx, repository, set(open_runs))
        except Exception as err:  # as above, per repository
            log.exception("looking for lost triggers in %s failed", repository)
            ctx.report.errors.append(
                Failure(repository=repository, where="reconciler", what="look for lost triggers", error=repr(err))
            )
    ctx.report.finished_at = datetime.now(UTC)
    return ctx.report


async def _reconcile_run(ctx: _Context, workflow_id: str) -> None:
    try:
        # Bounded: a run no worker answers for must not hold up the pass (the next one asks again).
        # The whole state: which commits are the run's own and which reviews it revised on is decided over every
        # candidate, not the latest the ``state`` query shows.
        state = await asyncio.wait_for(runs.get_record(ctx.client, workflow_id), timeout=QUERY_TIMEOUT_S)
    except (RPCError, WorkflowQueryFailedError, WorkflowQueryRejectedError, TimeoutError) as err:
        ctx.report.errors.append(
            Failure(workflow_id=workflow_id, where="temporal", what="query the run's state", error=repr(err))
        )
        return
    try:
        truth = await asyncio.to_thread(_read_truth, ctx.config, state)
    except ForgeError as err:
        ctx.report.errors.append(
            Failure(
                workflow_id=workflow_id,
                repository=state.repository,
                where="forge",
                what="read the run's issue and PR",
                error=str(err),
            )
        )
        return
    trigger = await runs.trigger_of(ctx.client, workflow_id)
    outcome = decide_run(
        state,
        truth,
        trigger_label=ctx.config.trigger_label,
        approver_permission=ctx.config.approver_permission,
        started_by_label=trigger != runs.CLI_TRIGGER,
    )
    for item in outcome:
        if isinstance(item, Skip):
            ctx.report.skipped.append(item)
        else:
            await _deliver(ctx, item)


def _read_truth(config: DurafixConfig, state: RunState) -> RunTruth:
    """Every forge read one run's decision needs, on one adapter (in one thread: an adapter is not
    thread-safe). Any failure raises; a partial truth is never decided on."""
    with Services(config).forge(state.repository) as forge:
        issue = forge.read_issue(state.issue_number)
        bot = forge.login()
        pending = state.pending_approval
        if pending is None:
            return RunTruth(issue=issue, bot=bot)
        pr = forge.get_pr(pending.pr_number)
        deciding = deciding_reviewers(state, pr, bot)
        permissions = {login: forge.get_permission(login) for login in deciding}
        # The approval policy's allow-lists as the receiver applies them (the merge checks them again).
        policy = config.approval_policy_in_force()
        refusals = {login: reviewer_refusal(forge, policy, login) for login in deciding}
        closer = forge.closed_by(pr.number) if pr.state == "closed" and not pr.merged else None
        return RunTruth(
            issue=issue, bot=bot, pr=pr, permissions=permissions, policy_refusals=refusals, closed_by=closer
        )


def _key(decision: Decision) -> str:
    """What makes a signal the same delivery twice (an approval's Update ID deduplicates it anyway)."""
    detail = ""
    if decision.push is not None:
        detail = decision.push.head_sha
    elif decision.rejection is not None:
        detail = decision.rejection.review_id or decision.rejection.reason
    return f"{decision.workflow_id}:{decision.kind}:{detail}"


async def _deliver(ctx: _Context, decision: Decision) -> None:
    wf = decision.workflow_id
    key = _key(decision)
    if decision.kind != "approve" and key in ctx.sent:
        ctx.report.skipped.append(Skip(workflow_id=wf, reason=f"{decision.kind} already delivered: {decision.reason}"))
        return
    delivered = Delivered(workflow_id=wf, kind=decision.kind, reason=decision.reason)
    try:
        if decision.approval is not None:
            delivered.review_id, delivered.head_sha = decision.approval.review_id, decision.approval.head_sha
            ack = await runs.approve(ctx.client, wf, decision.approval)
            delivered.detail = ack.detail
        elif decision.rejection is not None:
            delivered.review_id, delivered.head_sha = decision.rejection.review_id, decision.rejection.head_sha
            await runs.reject(ctx.client, wf, decision.rejection)
        elif decision.push is not None:
            delivered.head_sha = decision.push.head_sha
            await runs.head_moved(ctx.client, wf, decision.push)
        elif decision.kind == "cancel":
            await runs.cancel(ctx.client, wf)
    except WorkflowUpdateFailedError as err:
        ctx.report.errors.append(
            Failure(workflow_id=wf, where="temporal", what=f"deliver {decision.kind}", error=str(err.cause or err))
        )
        return
    except RPCError as err:
        ctx.report.errors.append(
            Failure(workflow_id=wf, where="temporal", what=f"deliver {decision.kind}", error=str(err))
        )
        return
    ctx.sent.add(key)
    ctx.report.delivered.append(delivered)


async def _find_lost_triggers(ctx: _Context, repository: str, open_runs: set[str]) -> None:
    label = ctx.config.trigger_label
    try:
        issues = await asyncio.to_thread(_labelled_issues, ctx.config, repository, label)
    except ForgeError as err:
        ctx.report.errors.append(
            Failure(repository=repository, where="forge", what=f"list open issues labelled {label!r}", error=str(err))
        )
        return
    for issue in issues:
        workflow_id = workflow_id_for(repository, issue.number)
        if workflow_id in open_runs:
            continue
        try:
            status = await runs.status_of(ctx.client, workflow_id)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                ctx.report.errors.append(
                    Failure(workflow_id=workflow_id, where="temporal", what="describe the run", error=str(err))
                )
                continue
        else:
            state = status.name.lower() if status else "unknown"
            ctx.report.skipped.append(Skip(workflow_id=workflow_id, reason=f"the issue's run exists ({state})"))
            continue
        await _start_lost_trigger(ctx, repository, issue, workflow_id)


def _labelled_issues(config: DurafixConfig, repository: str, label: str) -> list[IssueInfo]:
    with Services(config).forge(repository) as forge:
        return forge.open_issues_labelled(label)


@dataclass(frozen=True)
class _TriggerFacts:
    """Who triggered an issue (the label's adder, else its author when the forge keeps no issue events), their
    role, the ``labeled`` event (None without events) and the author's role."""

    who: str
    role: RepoRole
    added: LabelAdded | None
    author_role: RepoRole


def _trigger_facts(config: DurafixConfig, repository: str, issue: IssueInfo) -> _TriggerFacts:
    with Services(config).forge(repository) as forge:
        added = forge.label_added(issue.number, config.trigger_label)
        who = (added.actor if added is not None else None) or issue.author
        role = forge.get_role(who)
        author_role = role if who == issue.author else forge.get_role(issue.author)
        return _TriggerFacts(who, role, added, author_role)


def _say_unpinned(config: DurafixConfig, repository: str, issue: IssueInfo, facts: _TriggerFacts) -> str:
    """Say on the issue, once per ``labeled`` event (a keyed comment whose text does not change from pass to
    pass), that no run started and how to start one; what the write did."""
    label, required = config.trigger_label, config.trigger_permission
    when = facts.added.at.strftime("%Y-%m-%dT%H:%M:%SZ") if facts.added is not None else "unknown"
    changed = (
        f"the issue changed after the label was added at {when}"
        if facts.added is not None
        else "the forge does not say when the label was added"
    )
    body = (
        f"durafix did not start a run on this report. Its `{label}` label (added by @{facts.who}) was not "
        f"received when it was added, and a run would now take the report as it is today: {changed}, and an "
        f"edit since may be by someone below the `{required}` role a trigger takes (the author, "
        f"@{issue.author}, has `{facts.author_role}`). To start a run on the report as it is now, someone with "
        f"`{required}` or more removes the `{label}` label and adds it again."
    )
    with Services(config).forge(repository) as forge:
        return forge.ensure_comment(issue.number, f"reconciler:unpinned:{when}", body).action


def _forge_failure(workflow_id: str, repository: str, what: str, err: ForgeError) -> Failure:
    return Failure(workflow_id=workflow_id, repository=repository, where="forge", what=what, error=str(err))


async def _start_lost_trigger(ctx: _Context, repository: str, issue: IssueInfo, workflow_id: str) -> None:
    config = ctx.config
    try:
        facts = await asyncio.to_thread(_trigger_facts, config, repository, issue)
    except ForgeError as err:
        ctx.report.errors.append(
            _forge_failure(workflow_id, repository, f"read who labelled issue #{issue.number} and their role", err)
        )
        return
    who, role, required = facts.who, facts.role, config.trigger_permission
    if not may_trigger(role, required):
        ctx.report.skipped.append(
            Skip(workflow_id=workflow_id, reason=f"labelled by {who} ({role}); starting a run requires {required}")
        )
        return
    why = unpinnable(issue, facts.added, facts.author_role, required, config.trigger_label)
    if why is not None:
        ctx.report.skipped.append(Skip(workflow_id=workflow_id, reason=f"the report was not pinned: {why}"))
        try:
            await asyncio.to_thread(_say_unpinned, config, repository, issue, facts)
        except ForgeError as err:
            what = f"say on issue #{issue.number} why no run started"
            ctx.report.errors.append(_forge_failure(workflow_id, repository, what, err))
        return
    report = PinnedReport(title=issue.title, body=issue.body, author=issue.author, triggered_by=who)
    try:
        started = await runs.start_run(ctx.client, config, repository, issue.number, trigger=SOURCE, report=report)
    except runs.RunAlreadyEnded as ended:
        ctx.report.skipped.append(Skip(workflow_id=workflow_id, reason=str(ended)))
        return
    except RPCError as err:
        ctx.report.errors.append(
            Failure(workflow_id=workflow_id, where="temporal", what="start the run", error=str(err))
        )
        return
    ctx.report.delivered.append(
        Delivered(
            workflow_id=workflow_id,
            kind="start",
            reason=f"issue #{issue.number} carries {config.trigger_label!r} (added by {who}, {role}) and has no run",
            detail="attached to the existing run" if started.attached else f"started run {started.run_id}",
        )
    )


# ---- the loop ---------------------------------------------------------------------------------------------


@dataclass
class Reconciler:
    """Passes at start and every ``interval_s`` until :meth:`stop`. ``last_pass_at`` (wall clock) and
    :meth:`lag_seconds` tell how long ago the last pass finished (for ``durafix_reconciler_lag_seconds``);
    ``on_pass`` is called with each pass's report. A pass that raises is logged and the loop goes on."""

    client: Client
    config: DurafixConfig
    interval_s: float = 60.0
    on_pass: Callable[[ReconcileReport], None] | None = None
    last_pass_at: datetime | None = None
    last_report: ReconcileReport | None = None
    passes: int = 0
    _sent: set[str] = field(default_factory=set, init=False)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False)
    _started_mono: float = field(default_factory=time.monotonic, init=False)
    _last_mono: float | None = field(default=None, init=False)

    @property
    def running(self) -> bool:
        """Whether the loop started by :func:`start_in_background` is still running."""
        return self._task is not None and not self._task.done()

    def lag_seconds(self) -> float:
        """Seconds since the last pass finished (since the loop started, before the first)."""
        return time.monotonic() - (self._last_mono if self._last_mono is not None else self._started_mono)

    async def run_pass(self) -> ReconcileReport:
        report = await reconcile_once(self.client, self.config, sent=self._sent)
        self.last_report, self.last_pass_at, self._last_mono = report, report.finished_at, time.monotonic()
        self.passes += 1
        if self.on_pass is not None:
            self.on_pass(report)
        return report

    async def run(self) -> None:
        """Pass, wait ``interval_s`` (or until stopped), repeat."""
        self._loop = asyncio.get_running_loop()
        self._started_mono = time.monotonic()
        while not self._stopping.is_set():
            try:
                await self.run_pass()
            except Exception:
                log.exception("reconciler pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=self.interval_s)

    def stop(self) -> None:
        """Stop after the pass under way (if any); safe from any thread, and more than once."""
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stopping.set)
        else:
            self._stopping.set()

    async def wait_stopped(self) -> None:
        if self._task is not None:
            await self._task


def start_in_background(
    loop: asyncio.AbstractEventLoop,
    client: Client,
    config: DurafixConfig,
    *,
    interval_s: float | None = None,
    on_pass: Callable[[ReconcileReport], None] | None = None,
) -> Reconciler:
    """Run a :class:`Reconciler` as a task on ``loop`` (running on another thread, as the webhook receiver's
    is), every ``interval_s`` (default ``config.reconcile_interval_s``); returns it at once. Stop it with
    ``reconciler.stop()``."""

    async def create() -> Reconciler:
        rec = Reconciler(client, config, interval_s or config.reconcile_interval_s, on_pass=on_pass)
        rec._loop = asyncio.get_running_loop()
        rec._task = asyncio.get_running_loop().create_task(rec.run(), name="durafix-reconciler")
        return rec

    return asyncio.run_coroutine_threadsafe(create(), loop).result(timeout=10)
