"""The soak: N repair runs of the sample app on the embedded stack while workers and the Temporal dev server
are killed, then an audit of what the runs left (``durafix chaos``, ``make soak``).

One repository per run (``maintainer/cart-<i>``, the sample app pushed fresh), so every count on the forge
belongs to exactly one run. Runs are started directly with :func:`soak_policy` (short heartbeats, many
attempts), because the policy is part of the workflow input and the receiver would start runs with the
stack's. The reports are opened with the trigger label (a run whose issue does not carry it is cancelled),
by the bot, and the soak's stack requires ``admin`` to trigger a run, so neither the receiver nor its
reconciler starts another run for them.
The receiver still carries every review: each run's PR is approved on the forge, as a reviewer would, at the
head the run asks to have approved, once per head; an approval whose webhook found Temporal down reaches the
run through the receiver's reconciler (every 5 s here).

Faults come from a seeded :class:`random.Random` (the seed is printed): every ``kill_every`` seconds (uniform
between its bounds) the activity process of a random worker that has been polling for at least the lower
bound is SIGKILLed and a replacement started at once (a tick with no such worker, as on a busy host where a
worker takes longer to start than the time between kills, kills nothing and is counted as skipped); on
``server_kills`` of those ticks, drawn at the start among the early ones, the Temporal dev server is killed
instead and restarted on its SQLite file and port. What each kill hits depends on the machine's timing, so a
seed replays the fault plan (the intervals, the server's ticks), not the runs.

A run is *lost* when it has not ended within the deadline of its own start, and has *no outcome* when its
workflow ended without a result (failed, terminated, timed out). The soak fails (exit 1) on any lost run, run
without an outcome, duplicate on the forge, dishonest outcome (merged with no merged PR holding its merge
commit, or a merged PR under any other outcome) or leaked resource; see :mod:`infra.chaos.audit` for how each is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from github import Github, GithubException
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from environments.inventory import clean_run, open_holders, take_inventory
from infra import processes, stack
from infra.chaos.audit import ForgeCount, HistoryFacts, count_on_forge, leaked_resources, read_history
from infra.chaos.faults import Fault, WorkerPool, restart_server, strays_of
from infra.cli.demo import seed_repository
from infra.forge.testing import client as forge_client
from infra.processes import ServiceRecord
from pipeline import client as runs
from pipeline.config import DurafixConfig
from pipeline.ids import workflow_id_for
from pipeline.policies import RunPolicy, StepTimeouts
from pipeline.state import RunState
from pipeline.workflow import RepairBugWorkflow

RECONCILE_INTERVAL_S = 5.0
POLL_S = 1.0


class StateDirInUse(RuntimeError):
    """The soak's state directory holds a running stack; the soak kills what runs there, so it refuses."""


@dataclass(frozen=True)
class SoakPlan:
    """What ``durafix chaos`` was asked for. ``concurrency`` bounds the runs in flight at once (the others wait
    their turn); ``deadline_s`` is how long each run may take from its own start before it is lost."""

    runs: int
    workers: int
    kill_every: tuple[float, float]
    server_kills: int
    seed: int
    state_dir: Path
    deadline_s: float
    concurrency: int
    keep: bool = False
    faults_for_s: float | None = None
    """Faults stop this long after the chaos starts (``None``: until the runs end); the runs then have until the
    deadline to end on a healed stack. A window keeps the soak's liveness check about durafix, not the host:
    under continuous kills, whether a long step ever outlives its worker depends on how loaded the host is."""


@dataclass
class Run:
    """One soak run: where its report is, and what is known of it so far."""

    index: int
    repository: str
    issue: int
    workflow_id: str
    started_s: float | None = None
    ended_s: float | None = None
    status: str = "not started"
    state: RunState | None = None
    approved_heads: set[str] = field(default_factory=set)
    history_seen: int = 0
    held: list[str] = field(default_factory=list)
    forge: ForgeCount | None = None
    history: HistoryFacts | None = None
    leaks: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        if self.state is not None and self.state.outcome is not None:
            return self.state.outcome.value
        return self.status


@dataclass
class SoakResult:
    plan: SoakPlan
    runs: list[Run]
    faults: list[Fault]
    strays: list[int]
    wall_s: float
    problems: list[str]
    skipped_ticks: int = 0
    faults_stopped_s: float | None = None
    """When ``faults_for_s`` closed the fault window (seconds since the soak started); None: it never did."""

    @property
    def ok(self) -> bool:
        return not self.problems and not any(r.problems for r in self.runs)


def soak_policy(config: DurafixConfig) -> RunPolicy:
    """The run policy of soak runs: the stack's fast policy with heartbeats of seconds (a killed attempt is
    noticed after them; 30 s for the browser's), backoff capped at 2 s, and attempts enough for an activity to
    be killed many times.
    Schedule-to-start is long: under N runs on two cores, a step may wait its turn for minutes."""
    policy = runs.run_policy(config)

    def short(timeouts: StepTimeouts, heartbeat: float | None) -> StepTimeouts:
        return timeouts.model_copy(
            update={
                "schedule_to_start": 1800.0,
                "schedule_to_close": 1800.0,
                "heartbeat": heartbeat,
                "max_attempts": 30,
                "initial_interval": 0.5,
                "maximum_interval": 2.0,
            }
        )

    # Forge steps do not heartbeat: their start-to-close (10 s) is how a killed one is noticed.
    policy.forge = short(policy.forge, None)
    policy.environment = short(policy.environment, 6.0)
    # A browser step heartbeats per procedure step only: on a loaded two-core host, launching Chromium and loading
    # a page took longer than 10 s, and every attempt timed out with no kill at all. The default policy's 30 s.
    policy.browser = short(policy.browser, 30.0)
    policy.model = short(policy.model, 6.0)
    return policy


class Soak:
    """Runs one :class:`SoakPlan` on a fresh stack in ``plan.state_dir``; ``say`` prints progress."""

    def __init__(self, plan: SoakPlan, say: Callable[[str], None]) -> None:
        self.plan = plan
        self._say = say
        self.rng = random.Random(plan.seed)
        self.faults: list[Fault] = []
        self.runs: list[Run] = []
        self.problems: list[str] = []
        self._t0 = time.monotonic()
        self._in_flight: set[int] = set()
        self.skipped_ticks = 0
        self.faults_stopped_s: float | None = None
        self._config: DurafixConfig | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def say(self, msg: str) -> None:
        self._say(f"[{self.elapsed():6.1f}s] {msg}")

    # -- setup ---------------------------------------------------------------------------------------------

    def _refuse_a_running_stack(self) -> None:
        state_dir = self.plan.state_dir
        recorded = stack.read_stack(state_dir)
        if any(processes.is_alive(rec) for rec in recorded.services.values()):
            raise StateDirInUse(
                f"a stack is running in {state_dir}: the soak kills its workers and its Temporal server, so it "
                "runs only on a state directory of its own (another --state-dir, or `durafix dev down` first)"
            )

    def _up(self) -> tuple[DurafixConfig, stack.StackState]:
        state_dir = self.plan.state_dir
        config = stack.up(state_dir, quiet=True)
        config.fast_timeouts = True
        config.reconcile_interval_s = RECONCILE_INTERVAL_S
        # The reports carry the trigger label (a run whose issue loses it is cancelled, by the receiver and by the
        # reconciler), but the soak starts each run itself, with its own policy: a label added by the bot, who
        # holds write, must not start another. Approvals are judged by approver_permission, which stays.
        config.trigger_permission = "admin"
        config.save()
        self._config = config
        return config, stack.read_stack(state_dir)

    def _receiver(self) -> ServiceRecord:
        rec = stack.spawn_receiver(self.plan.state_dir, "receiver", "chaos-receiver.log")
        try:
            # Generous: on a loaded two-core host the receiver's imports alone can take half a minute.
            stack.wait_receiver(rec, 120)
        except BaseException:
            processes.stop(rec)
            raise
        return rec

    def _open_reports(self, config: DurafixConfig, st: stack.StackState, receiver: ServiceRecord) -> None:
        from infra.cli.demo import issue_text

        title, body = issue_text()
        bot = forge_client(config.forge_api_url, config.forge_token)
        for i in range(1, self.plan.runs + 1):
            repository = seed_repository(config, st.admin_token, stack.REVIEWER_LOGIN, receiver.url, f"cart-{i}")
            issue = bot.get_repo(repository).create_issue(title=title, body=body, labels=[config.trigger_label])
            self.runs.append(Run(i, repository, issue.number, workflow_id_for(repository, issue.number)))
        self.say(f"seeded {self.plan.runs} repositories with the sample app and opened a report on each")

    # -- the faults ----------------------------------------------------------------------------------------

    async def _chaos(self, pool: WorkerPool) -> None:
        lo, hi = self.plan.kill_every
        k = self.plan.server_kills
        window = range(2, 2 + 3 * k + max(2, self.plan.runs // 3))
        server_ticks = set(self.rng.sample(list(window), k)) if k else set()
        tick, quiet = 0, False
        stop_at = None if self.plan.faults_for_s is None else self.elapsed() + self.plan.faults_for_s
        while True:
            await asyncio.sleep(self.rng.uniform(lo, hi))
            if stop_at is not None and self.elapsed() >= stop_at:
                self.faults_stopped_s = self.elapsed()
                self.say(f"faults stop after {self.plan.faults_for_s:g}s (--faults-for): the runs now end on their own")
                return
            tick += 1
            if tick in server_ticks:
                self.say("SIGKILL the Temporal dev server; restarting it on its SQLite file")
                outage = await restart_server(self.plan.state_dir, self.elapsed)
                self.faults.append(outage)
                self.say(f"Temporal dev server back after {outage.down_s:.1f}s")
                continue
            eligible = pool.eligible(polled_for_s=lo)
            if not eligible:
                self.skipped_ticks += 1
                if not quiet:
                    self.say(f"no worker has been polling for {lo:g}s: ticks kill nothing until one has")
                quiet = True
                continue
            quiet = False
            victim = self.rng.choice(eligible)
            fault = pool.kill(victim, self.elapsed())
            if fault is None:
                self.say(f"{victim.name} had died on its own; started a replacement")
                continue
            self.faults.append(fault)
            then = f"started pid {fault.replacement}" if fault.replacement else "its supervisor replaces it"
            self.say(f"SIGKILL {fault.target} (activity process {fault.pid}); {then}")

    # -- the runs ------------------------------------------------------------------------------------------

    async def _start(self, client: Client, config: DurafixConfig, run: Run, policy: RunPolicy) -> None:
        while True:
            try:
                await runs.start_run(
                    client,
                    config,
                    run.repository,
                    run.issue,
                    trigger=f"chaos:{self.plan.seed}:{run.index}",
                    policy=policy,
                )
                break
            except RPCError:  # the server is being restarted; the start is idempotent (the ID attaches)
                await asyncio.sleep(POLL_S)
        run.started_s = self.elapsed()
        run.status = "running"
        self._in_flight.add(run.index)

    async def _poll(self, client: Client, reviewer: Github, run: Run) -> None:
        """One look at a run in flight: record its end, or approve the head it asks to have approved."""
        handle = runs.handle_for(client, run.workflow_id)
        try:
            desc = await handle.describe(rpc_timeout=timedelta(seconds=5))
        except RPCError:
            return
        if desc.status != WorkflowExecutionStatus.RUNNING:
            await self._ended(client, run, desc.status)
            return
        # The state changes only with the history: a query of an unchanged run would only queue up behind the
        # others on a workflow whose worker was just killed (the server's query buffer is small).
        length = desc.raw_info.history_length
        if length == run.history_seen:
            return
        try:
            state = await handle.query(RepairBugWorkflow.state, rpc_timeout=timedelta(seconds=5))
        except Exception:  # no workflow worker answered in time (one was just killed): look again next poll
            return
        run.history_seen = length
        pending = state.pending_approval
        if pending is None or pending.head_sha in run.approved_heads:
            return
        try:
            await asyncio.to_thread(self._approve, reviewer, run, pending.pr_number, pending.head_sha)
        except GithubException as err:  # the forge refused or failed: approve at the next poll
            self.say(f"run {run.index}: approving PR #{pending.pr_number} failed ({err.status}); will retry")
            return
        run.approved_heads.add(pending.head_sha)
        self.say(f"run {run.index}: approved PR #{pending.pr_number} at {pending.head_sha[:12]} on the forge")

    @staticmethod
    def _approve(reviewer: Github, run: Run, pr_number: int, head: str) -> None:
        repo = reviewer.get_repo(run.repository)
        repo.get_pull(pr_number).create_review(commit=repo.get_commit(head), event="APPROVE", body="LGTM (soak)")

    async def _ended(self, client: Client, run: Run, status: WorkflowExecutionStatus | None) -> None:
        run.ended_s = self.elapsed()
        run.status = status.name.lower() if status else "closed"
        self._in_flight.discard(run.index)
        if status == WorkflowExecutionStatus.COMPLETED:
            run.state = await _result(client, run.workflow_id)
        self.say(f"run {run.index} ended: {run.outcome} ({self._progress()})")

    def _progress(self) -> str:
        started = sum(r.started_s is not None for r in self.runs)
        ended = sum(r.ended_s is not None for r in self.runs)
        workers = sum(f.kind == "worker" for f in self.faults)
        servers = sum(f.kind == "server" for f in self.faults)
        return (
            f"runs started {started}/{self.plan.runs}, ended {ended}/{self.plan.runs}; "
            f"worker kills {workers}, server kills {servers}/{self.plan.server_kills}"
        )

    async def _drive(self, client: Client, config: DurafixConfig, reviewer: Github) -> None:
        """Start runs as slots free up, approve what they ask, and record each end. A run not ended
        ``deadline_s`` after its own start is lost: it gives up its slot and is no longer watched."""
        policy = soak_policy(config)
        waiting = list(self.runs)
        while True:
            while waiting and len(self._in_flight) < self.plan.concurrency:
                run = waiting.pop(0)
                await self._start(client, config, run, policy)
                self.say(f"run {run.index} started: {run.workflow_id} ({self._progress()})")
            if not waiting and not self._in_flight:
                return
            flying = [r for r in self.runs if r.index in self._in_flight]
            await asyncio.gather(*(self._poll(client, reviewer, r) for r in flying))
            for run in flying:
                started = run.started_s
                if run.ended_s is None and started is not None and self.elapsed() - started > self.plan.deadline_s:
                    self._lost(run)
            await asyncio.sleep(POLL_S)

    def _lost(self, run: Run) -> None:
        run.status = "lost"
        run.problems.append(f"not ended within {self.plan.deadline_s:.0f}s of its start")
        self._in_flight.discard(run.index)
        self.say(f"run {run.index} lost: not ended {self.plan.deadline_s:.0f}s after its start ({self._progress()})")

    # -- the audit -----------------------------------------------------------------------------------------

    async def _audit(self, client: Client, config: DurafixConfig) -> None:
        for run in self.runs:
            if run.started_s is None:
                continue
            run.forge = await asyncio.to_thread(count_on_forge, config, run.repository, run.issue, run.workflow_id)
            with contextlib.suppress(RPCError):
                run.history = await read_history(client, run.workflow_id, self.faults)
            owned = leaked_resources(config, run.workflow_id)
            # A lost run still holds what it works with: not a leak (the run is a problem already).
            if run.ended_s is None:
                run.held = owned
            else:
                run.leaks = owned
            run.problems += judge(run)

    async def run(self) -> SoakResult:
        plan = self.plan
        self.say(f"seed {plan.seed}; state directory {plan.state_dir}")
        self._refuse_a_running_stack()
        pool = WorkerPool(plan.state_dir, plan.workers)
        receiver: ServiceRecord | None = None
        strays: list[int] = []
        try:
            # The stack's readiness probes run event loops of their own: not on this one.
            config, st = await asyncio.to_thread(self._up)
            receiver = await asyncio.to_thread(self._receiver)
            # Workers first: they import and connect while the repositories are seeded.
            pool.start()
            await asyncio.to_thread(self._open_reports, config, st, receiver)
            client = await runs.connect(config)
            reviewer = forge_client(config.forge_api_url, st.reviewer_token)
            chaos = asyncio.create_task(self._chaos(pool))
            try:
                await self._drive(client, config, reviewer)
            finally:
                failed = chaos.done() and chaos.exception() is not None
                chaos.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await chaos
            if failed:
                self.problems.append(f"fault injection failed: {chaos.exception()!r}")
            servers = sum(f.kind == "server" for f in self.faults)
            if servers < plan.server_kills:
                self.problems.append(
                    f"only {servers} of {plan.server_kills} server kills happened before the runs ended"
                )
            self.say(
                "all runs ended; auditing the forge, the histories and the disk" if not self._in_flight else "auditing"
            )
            await self._audit(client, config)
            strays = await _settled_strays(pool)
            if strays:
                self.problems.append(f"processes left by killed workers: {', '.join(map(str, strays))}")
        finally:
            if not plan.keep:
                pool.stop()
                if self._config is not None:
                    self._clean_lost(self._config)
                if receiver is not None:
                    processes.stop(receiver)
                stack.down(plan.state_dir, quiet=True)
        return SoakResult(
            plan,
            self.runs,
            self.faults,
            strays,
            self.elapsed(),
            self.problems,
            self.skipped_ticks,
            self.faults_stopped_s,
        )

    def _clean_lost(self, config: DurafixConfig) -> None:
        """Remove what lost runs hold (their own cleanup never ran), as ``durafix cleanup --run`` does: each
        holder tombstones the run first, so nothing is recreated for it. What remains is said, not hidden."""
        holders, unopened = open_holders(
            config.state_dir, environment_provider=config.environment_provider, docker_host=config.docker_host
        )
        for run in self.runs:
            if run.ended_s is not None or run.started_s is None:
                continue
            planned = take_inventory(holders, unopened, run.workflow_id).resources
            report = clean_run(holders, run.workflow_id, planned, unopened)
            left = [*(r.resource_id for r in report.remaining), *report.errors]
            self.say(
                f"run {run.index} lost: removed {len(report.removed)} of its resources"
                + (f"; remaining: {', '.join(left)}" if left else "")
            )


async def _result(client: Client, workflow_id: str) -> RunState:
    """The completed run's result, read again while the server is being restarted."""
    while True:
        try:
            return await runs.handle_for(client, workflow_id).result(rpc_timeout=timedelta(seconds=10))
        except RPCError:
            await asyncio.sleep(POLL_S)


async def _settled_strays(pool: WorkerPool, settle_s: float = 10.0) -> list[int]:
    """Processes left in killed workers' groups, after ``settle_s`` for orphans to notice their parent died."""
    deadline = time.monotonic() + settle_s
    while True:
        strays = strays_of(pool.killed)
        if not strays or time.monotonic() > deadline:
            return strays
        await asyncio.sleep(0.5)


def judge(run: Run) -> list[str]:
    """The run's problems: duplicates on the forge, a dishonest outcome, an end without an outcome, leaks."""
    problems: list[str] = []
    count = run.forge
    if run.ended_s is not None and run.state is None:
        problems.append(f"the workflow ended {run.status} without an outcome")
    if count is not None:
        for what, n in (
            ("tickets", count.tickets),
            ("branches", count.branches),
            ("PRs", count.pull_requests),
            ("evidence comments", count.evidence_comments),
        ):
            if n > 1:
                problems.append(f"duplicate: {n} {what}")
        if run.state is not None:
            merged_sha = run.state.merged_sha
            if run.outcome == "merged" and (merged_sha is None or merged_sha not in count.merged):
                problems.append(f"dishonest: merged, but no merged PR on the forge has merge commit {merged_sha}")
            elif run.outcome == "merged" and count.main_head != merged_sha:
                problems.append(f"dishonest: merged as {merged_sha}, but main is at {count.main_head}")
            elif run.outcome != "merged" and count.merged:
                problems.append(f"dishonest: {run.outcome}, but a PR of the run merged ({', '.join(count.merged)})")
    problems += [f"leaked: {leak}" for leak in run.leaks]
    return problems
