"""Benchmark: a run's critical path, labelled report -> draft PR -> awaiting review, against its floor.

Run: ``uv run python -m tests.bench.bench_critical_path [--runs N] [--quick] [--projects cart,tally,leaderboard]
[--spacing S]`` (default N=3; ``--quick`` is one; every project by default). Three projects:

- ``cart``: the sample app (``examples/cart``, what ``durafix demo`` seeds): no setup, a browser reproduction;
- ``tally``: the npm test project (:data:`tests.support.real_projects.TALLY`: ``npm ci`` installs ``is-number``);
- ``leaderboard``: the pip test project (:data:`tests.support.real_projects.LEADERBOARD`: ``humanize`` in a
  ``.venv``).

The real projects get their dependencies as their end-to-end tests do (:mod:`tests.e2e.test_real_projects`): the
recipe's setup runs the package manager's own client against the public registry (npm, PyPI), through the
sandbox's egress proxy; nothing else is reached.

On one embedded e2e stack (:func:`tests.bench.bench_tax.e2e_stack`: the GitHub emulator, the scripted model server
answering the three projects' fixes, the evidence server, a real Temporal dev server, the webhook receiver) with
one ``durafix worker`` process, and the forge writes spaced as the product spaces them against GitHub
(``forge_seconds_between_writes``, default 1 s; the stack alone sets 0 for the emulator), each measured run of a
project:

1. **the run**: a fresh repository (the sample seeded, or the project's checkout onboarded with ``durafix dev
   onboard``), its report opened without the trigger label; the clock starts when the label is added through the
   forge's API (the signed ``issues.labeled`` delivery starts ``repair_bug``) and the run is followed to
   "awaiting review" (its state's ``pending_approval``). The figures are read from what the run records: its
   history's start and the completion of ``forge.ensure_draft_pr`` (the draft PR), and its state's phase
   timeline (``RunState.timeline``, what ``durafix status``, the runs page and the phase-duration metric read),
   each phase lasting until the next one is entered. The forge counts the writes it received meanwhile (its
   fault rules as counters, :mod:`tests.support.requests_seen`: POST, PATCH, PUT, DELETE and pushes; git's
   fetches apart), less the benchmark's own label. The run is then cancelled and its cleanup awaited.
2. **the floor**, on the same repository at the run's base revision, with the worker's library calls and
   settings (:class:`~environments.local.LocalProcessProvider` from the stack's config: the sandbox, the egress
   proxy, the secrets allowlist; a dependency cache and package caches of the floor's own, so the first setup is
   as cold as the run's): the recipe's setup in a fresh workspace with the dependency cache cold (it stores the
   entry), then the recipe's tests there; then in a second fresh workspace the app provisioned (setup again, now
   restored from the warm cache, then the app's start and readiness) and the report's reproduction run once
   against it by the worker's browser runner; plus the writes the run sent times the spacing. Nothing of the
   floor overlaps: the run has ended before it starts.

The ratio is the run (label -> awaiting review) over the floor; a second ratio is over the floor's work alone (its
parts but the write spacing). The floor adds the spacing to the work as if every write waited its full spacing,
but a write that follows the one before by more than the spacing waits for nothing, so a run can come in under
the floor: the least a run can take lies between the two. Medians over the runs, per project, after one
unmeasured run of the sample app (the worker's imports and first workflow tasks); every measured run is the first
run of a fresh repository, whose dependency and package caches are as cold as the floor's first setup.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import yaml
from temporalio.client import Client

from browser.procedure import Procedure
from browser.results import ReproductionStatus
from browser.runner import BrowserRunner
from environments.checks import SetupSettings
from environments.depcache import DependencyCache
from environments.local import LocalProcessProvider
from environments.reproduction import extract_reproduction
from environments.sandbox import Sandbox
from environments.spec import build_recovery_spec
from environments.workspace import WorkspaceManager
from infra.cli.demo import issue_text
from pipeline import client as runs
from pipeline import steps
from pipeline.activities.workspace import rebuild
from pipeline.config import DurafixConfig
from pipeline.ids import branch_for, workflow_id_for
from pipeline.services import Services
from pipeline.state import Phase, RunState
from tests.bench.bench_tax import e2e_stack
from tests.bench.report import argument_parser
from tests.e2e.test_cli import Cli
from tests.e2e.test_pipeline import awaiting_review, state_when
from tests.support.e2e_stack import E2EStack, combined_model_script
from tests.support.real_projects import PROJECTS as REAL_PROJECTS
from tests.support.real_projects import build_checkout
from tests.support.real_projects import model_script as real_model_script
from tests.support.requests_seen import COUNTERS_FETCH_APART, WRITES, ForgeAdmin, counting
from tests.support.run_history import cancel_and_wait, completions

T = TypeVar("T")

PROJECTS = ("cart", "tally", "leaderboard")
DEFAULT_RUNS = 3
RUN_TIMEOUT_S = 1200.0  # a loaded two-core host has taken over 10 minutes to reach the PR
SETUP_TIMEOUT_S = 600.0
TEST_TIMEOUT_S = 600.0
SPACING_DEFAULT = float(DurafixConfig.model_fields["forge_seconds_between_writes"].default)
LABEL_WRITES = 1  # the benchmark's own write inside the counted window: adding the trigger label


@dataclass
class Floor:
    """The least a run's critical path must spend (see the module), each part in seconds."""

    setup_cold_s: float
    setup_warm_s: float
    tests_s: float
    app_start_s: float  # the app's start and readiness, after the warm setup (the reproduction needs the app)
    procedure_s: float  # the reproduction's procedure against the app (its ``runs`` in the browser)
    writes: int
    spacing_s: float
    has_setup: bool  # the recipe has setup commands (the sample app's has none: its setup parts are nothing)
    procedure_runs: int  # how many times the procedure runs (its ``runs``), as a run's reproduction does
    reproduced: bool  # the floor's reproduction found the bug (what a run's base reproduction finds)

    @property
    def reproduction_s(self) -> float:
        return self.app_start_s + self.procedure_s

    @property
    def forge_s(self) -> float:
        return self.writes * self.spacing_s

    @property
    def total_s(self) -> float:
        return self.setup_cold_s + self.setup_warm_s + self.tests_s + self.reproduction_s + self.forge_s


@dataclass
class Measured:
    """One run of a project and its floor: seconds from the label to the draft PR and to awaiting review, the
    phases (label -> run start, then each phase of the timeline up to awaiting review), and what the forge held."""

    project: str
    workflow_id: str
    to_draft_pr_s: float
    to_awaiting_review_s: float
    phases: dict[str, float]
    writes: int
    writes_by_kind: dict[str, int]  # the writes by method (``push``: git pushes), the label left out
    open_prs: int  # open PRs from the run's branch on the forge once it awaited review
    draft_prs: int  # of which drafts
    pending_pr: bool  # the run awaited review of a PR (not ended otherwise)
    floor: Floor

    @property
    def ratio(self) -> float:
        return self.to_awaiting_review_s / self.floor.total_s

    @property
    def ratio_to_work(self) -> float:
        """The run over the floor's work alone (its parts but the write spacing)."""
        return self.to_awaiting_review_s / (self.floor.total_s - self.floor.forge_s)


@dataclass
class Target:
    """A repository the bench made, its report (unlabelled) and the token that labels it."""

    repository: str
    issue: int
    token: str
    procedure: Procedure


def model_script(dest: Path) -> Path:
    """The e2e tests' script for the sample app with the real projects' fixes first: the sample's fix answers
    any report (it is the catch-all), the real projects' match their names."""
    real = yaml.safe_load(real_model_script(dest).read_text())["conversations"]
    combined = yaml.safe_load(combined_model_script(dest).read_text())
    combined["conversations"] = [*real, *combined["conversations"]]
    dest.write_text(yaml.safe_dump(combined, sort_keys=False))
    return dest


def browser_procedure(body: str) -> Procedure:
    """The report's browser procedure (each project's report has one)."""
    found = extract_reproduction(body)
    assert isinstance(found, Procedure), f"the report's reproduction is not a browser procedure: {found!r}"
    return found


class CriticalPath:
    def __init__(self, stack: E2EStack, client: Client, work: Path) -> None:
        self.stack = stack
        self.client = client
        self.work = work
        self.forge = ForgeAdmin(stack.config.forge_api_url, stack.admin_token)
        self.browser: BrowserRunner | None = None

    def close(self) -> None:
        if self.browser is not None:
            self.browser.close()

    # ---- the repositories ----------------------------------------------------------------------------------

    def target(self, project: str) -> Target:
        """A fresh repository of ``project`` with its report opened, not labelled (the receiver ignores it)."""
        stack = self.stack
        if project == "cart":
            repository = stack.new_repository()
            issue = stack.open_report(repository, labelled=False)
            return Target(repository, issue, stack.config.forge_token, browser_procedure(issue_text()[1]))
        (real,) = [p for p in REAL_PROJECTS if p.name == project]
        name = f"{project}-{uuid.uuid4().hex[:8]}"
        checkout = build_checkout(real, self.work / name)
        onboarded = Cli(stack.state_dir).json(
            "dev", "onboard", str(checkout), "--name", name, "--receiver-url", stack.receiver.url
        )
        repository = str(onboarded["repository"])
        token = str(onboarded["tokens"]["owner"]["token"])
        gh_issue = stack.github(token).get_repo(repository).create_issue(title=real.first.title, body=real.first.body)
        return Target(repository, int(gh_issue.number), token, browser_procedure(real.first.body))

    # ---- one measured run ----------------------------------------------------------------------------------

    async def one(self, project: str, spacing_s: float) -> Measured:
        stack = self.stack
        target = await asyncio.to_thread(self.target, project)
        workflow_id = workflow_id_for(target.repository, target.issue)
        repo = stack.github(target.token).get_repo(target.repository)
        gh_issue = repo.get_issue(target.issue)
        await asyncio.sleep(1)  # the "opened" delivery (ignored) is not what is timed

        with counting(self.forge, COUNTERS_FETCH_APART) as seen:
            wall0 = time.time()
            await asyncio.to_thread(gh_issue.add_to_labels, stack.config.trigger_label)
            state = await state_when(self.client, workflow_id, awaiting_review, timeout_s=RUN_TIMEOUT_S)
        writes = sum(seen.by_kind.get(kind, 0) for kind in WRITES) - LABEL_WRITES
        branch = branch_for(workflow_id)
        pulls = await asyncio.to_thread(
            lambda: [
                p for p in stack.github().get_repo(target.repository).get_pulls(state="open") if p.head.ref == branch
            ]
        )
        started, draft_pr = await self.history_marks(workflow_id)
        phases = phases_of(state, wall0, started)
        awaited = next(
            (m.at.timestamp() - wall0 for m in state.timeline if m.phase == Phase.AWAITING_REVIEW), float("nan")
        )
        await self.cancel(workflow_id)

        assert state.reproduction is not None, f"{workflow_id} awaited review without a reproduction"
        floor = await asyncio.to_thread(
            self.floor, target, state.reproduction.revision, writes, spacing_s, f"bench-floor-{uuid.uuid4().hex[:8]}"
        )
        return Measured(
            project=project,
            workflow_id=workflow_id,
            to_draft_pr_s=draft_pr - wall0,
            to_awaiting_review_s=awaited,
            phases=phases,
            writes=writes,
            writes_by_kind={
                kind: seen.by_kind.get(kind, 0) - (LABEL_WRITES if kind == "POST" else 0) for kind in WRITES
            },
            open_prs=len(pulls),
            draft_prs=sum(bool(p.draft) for p in pulls),
            pending_pr=state.pending_approval is not None,
            floor=floor,
        )

    async def history_marks(self, workflow_id: str) -> tuple[float, float]:
        """When the run started, and when ``forge.ensure_draft_pr`` completed (NaN: it did not), from its history."""
        history = await completions(self.client, workflow_id)
        return history.started, history.done.get((steps.ENSURE_DRAFT_PR.name, 1), float("nan"))

    async def cancel(self, workflow_id: str) -> None:
        """Cancel the run and wait until it closed (its cleanup done): nothing of it runs beside the floor."""
        await cancel_and_wait(self.client, workflow_id, 300)

    # ---- the floor -----------------------------------------------------------------------------------------

    def floor(self, target: Target, revision: str, writes: int, spacing_s: float, run_id: str) -> Floor:
        """The floor's parts (see the module) on ``target``'s repository at ``revision``, under a run ID of its own;
        everything it made is removed afterwards."""
        config = self.stack.config
        root = self.work / run_id
        services = Services(config)
        settings = SetupSettings(
            cache=DependencyCache(root / "deps", restore=config.dependency_restore),
            package_caches=root / "packages",
            passthrough=tuple(config.setup_passthrough),
            egress_hosts=tuple(config.setup_egress),
            ca_bundle=config.ca_bundle_path(),
        )
        provider = LocalProcessProvider(
            root / "environments",
            setup=settings,
            sandbox=Sandbox.detect(unsandboxed=config.unsandboxed),
            allowed_secrets=config.secret_allowlist,
        )
        workspaces = WorkspaceManager(cache_dir=root / "cache", root=root / "workspaces")
        clone_url = config.clone_url(target.repository)

        def workspace(op: str) -> Path:
            return rebuild(workspaces, services.git_token, run_id, f"{run_id}:{op}", clone_url, revision).path

        try:
            ws = workspace("checks")
            spec = build_recovery_spec(target.repository, clone_url, revision, ws)
            cold_s, _ = timed(
                lambda: provider.run_setup(
                    spec, str(ws), run_id=run_id, log_path=root / "setup-cold.log", timeout_s=SETUP_TIMEOUT_S
                )
            )
            tests_s, tests = timed(
                lambda: provider.run_checks(
                    spec,
                    str(ws),
                    run_id=run_id,
                    op_id=f"{run_id}:tests",
                    log_path=root / "tests.log",
                    setup_timeout_s=SETUP_TIMEOUT_S,
                    test_timeout_s=TEST_TIMEOUT_S,
                    setup=False,
                )
            )
            assert tests.passed, f"the recipe's tests fail on {revision[:12]}: {tests}"

            app_ws = workspace("app")
            marks = {"setup": time.perf_counter(), "start": 0.0}

            def progress(text: str) -> None:
                if text.startswith("starting app:") and not marks["start"]:
                    marks["start"] = time.perf_counter()

            handle = provider.provision(
                run_id=run_id, op_id=f"{run_id}:app", spec=spec, workspace=str(app_ws), progress=progress
            )
            ready = time.perf_counter()
            assert marks["start"], "the provider never said it was starting the app"
            try:
                if self.browser is None:
                    self.browser = BrowserRunner(sandbox=config.browser_sandbox)
                out = root / "browser"
                out.mkdir(parents=True)
                browse = time.perf_counter()
                found = self.browser.run(
                    target.procedure, handle.base_url, out, allowed_origins=spec.recipe.browser_origins
                )
                procedure_s = time.perf_counter() - browse
            finally:
                provider.teardown(handle)
            return Floor(
                setup_cold_s=cold_s,
                setup_warm_s=marks["start"] - marks["setup"],
                tests_s=tests_s,
                app_start_s=ready - marks["start"],
                procedure_s=procedure_s,
                writes=writes,
                spacing_s=spacing_s,
                has_setup=bool(spec.recipe.setup),
                procedure_runs=target.procedure.runs,
                reproduced=found.status == ReproductionStatus.REPRODUCED,
            )
        finally:
            provider.cleanup_run(run_id)
            workspaces.cleanup_run(run_id)


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """The seconds ``fn()`` took, and what it answered."""
    started = time.perf_counter()
    answer = fn()
    return time.perf_counter() - started, answer


def phases_of(state: RunState, wall0: float, started: float) -> dict[str, float]:
    """Seconds per stage, in order: the label to the run's start (the forge's delivery, the receiver, the start),
    intake (up to the first phase entered), then each phase of the timeline until the next was entered, up to
    awaiting review. A phase entered again is named with its count (``provision (2)``)."""
    out = {"label -> run started (webhook)": started - wall0}
    before, name = started, "intake"
    seen: dict[str, int] = {}
    for mark in state.timeline:
        at = mark.at.timestamp()
        out[name] = out.get(name, 0.0) + at - before
        if mark.phase == Phase.AWAITING_REVIEW:
            break
        phase = mark.phase.value
        seen[phase] = seen.get(phase, 0) + 1
        name = phase if seen[phase] == 1 else f"{phase} ({seen[phase]})"
        before = at
    return out


# ---- the bench -----------------------------------------------------------------------------------------------


@contextmanager
def bench_stack(root: Path, spacing_s: float) -> Iterator[E2EStack]:
    """The e2e stack with the three projects' model script and the forge writes spaced by ``spacing_s``, with one
    ``durafix worker`` process."""
    with e2e_stack(root, model_script=model_script, configure=lambda c: spaced(c, spacing_s)) as stack:
        stack.spawn_worker()
        yield stack


def spaced(config: DurafixConfig, spacing_s: float) -> None:
    config.forge_seconds_between_writes = spacing_s


def bench(runs_n: int, projects: tuple[str, ...] = PROJECTS, spacing_s: float = SPACING_DEFAULT) -> list[Measured]:
    """``runs_n`` measured runs of each of ``projects`` (see the module), taking turns, on one fresh stack.
    Synchronous: the stack starts and stops outside any event loop."""
    with (
        tempfile.TemporaryDirectory(prefix="durafix-bench-critical-") as tmp,
        bench_stack(Path(tmp), spacing_s) as stack,
    ):
        return asyncio.run(on_stack(stack, runs_n, projects, spacing_s, Path(tmp), warm=True))


async def on_stack(
    stack: E2EStack, runs_n: int, projects: tuple[str, ...], spacing_s: float, work: Path, *, warm: bool
) -> list[Measured]:
    """``runs_n`` rounds, each a measured run of every project in turn; after one unmeasured run of the sample app
    when ``warm`` (the worker's imports and first workflow tasks, the browser: what a worker that has been up a
    while has paid already)."""
    path = CriticalPath(stack, await runs.connect(stack.config), work)
    out = []
    try:
        if warm:
            print("warming up: one run of the sample app (not measured)", file=sys.stderr, flush=True)
            await path.one("cart", spacing_s)
        for i in range(runs_n):
            for project in projects:
                m = await path.one(project, spacing_s)
                print(
                    f"  {project} run {i + 1}: awaiting review at {m.to_awaiting_review_s:.1f}s, "
                    f"floor {m.floor.total_s:.1f}s",
                    file=sys.stderr,
                    flush=True,
                )
                out.append(m)
    finally:
        path.close()
    return out


def rows_of(results: list[Measured]) -> list[tuple[str, float]]:
    """The table's rows of one project: medians over its runs."""

    def med(fn: Callable[[Measured], float]) -> float:
        return statistics.median(fn(m) for m in results)

    rows = [("label -> draft PR opened", med(lambda m: m.to_draft_pr_s))]
    rows.append(("label -> awaiting review", med(lambda m: m.to_awaiting_review_s)))
    stages = list(dict.fromkeys(stage for m in results for stage in m.phases))
    rows += [(f"  {stage}", statistics.median(m.phases.get(stage, 0.0) for m in results)) for stage in stages]
    floor = results[0].floor
    counted = {kind: statistics.median(m.writes_by_kind[kind] for m in results) for kind in WRITES}
    kinds = ", ".join(f"{n:.0f} {kind}" for kind, n in counted.items() if n)
    setup = "" if floor.has_setup else " (no setup in the recipe)"
    rows += [
        ("floor", med(lambda m: m.floor.total_s)),
        (f"  setup, dependency cache cold{setup}", med(lambda m: m.floor.setup_cold_s)),
        (f"  setup, dependency cache warm{setup}", med(lambda m: m.floor.setup_warm_s)),
        ("  tests (recipe's test command)", med(lambda m: m.floor.tests_s)),
        ("  reproduction: app start + readiness", med(lambda m: m.floor.app_start_s)),
        (f"  reproduction: browser procedure, {floor.procedure_runs} run(s)", med(lambda m: m.floor.procedure_s)),
        (
            f"  forge writes: {med(lambda m: m.writes):.0f} ({kinds}) x {floor.spacing_s:g} s",
            med(lambda m: m.floor.forge_s),
        ),
    ]
    return rows


def report(results: list[Measured], command: str) -> None:
    print(f"$ {command}")
    print(
        f"clock: from the trigger label added on the forge (its issues.labeled webhook starts the run); medians of "
        f"{len(results) // max(1, len({m.project for m in results}))} run(s) per project; forge writes spaced "
        f"{results[0].floor.spacing_s:g} s"
    )
    print("| project | phase / figure | wall s |")
    print("|---|---|---:|")
    for project in dict.fromkeys(m.project for m in results):
        mine = [m for m in results if m.project == project]
        for label, seconds in rows_of(mine):
            print(f"| {project} | {label} | {seconds:.2f} |")
        ratio = statistics.median(m.ratio for m in mine)
        print(f"| {project} | ratio run / floor (awaiting review / floor) | {ratio:.2f}x |")
        work = statistics.median(m.ratio_to_work for m in mine)
        print(f"| {project} | ratio run / the floor's work alone (its parts but the write spacing) | {work:.2f}x |")
    drafts = sum(m.pending_pr and m.open_prs == m.draft_prs == 1 for m in results)
    print(f"runs that awaited review with one PR on the forge, a draft: {drafts} of {len(results)}")


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--runs", type=int, default=None, help=f"measured runs per project (default {DEFAULT_RUNS})")
    parser.add_argument("--quick", action="store_true", help="as --runs 1")
    parser.add_argument("--projects", default=",".join(PROJECTS), help=f"comma-separated, of {', '.join(PROJECTS)}")
    parser.add_argument(
        "--spacing",
        type=float,
        default=SPACING_DEFAULT,
        help=f"seconds between forge writes (default {SPACING_DEFAULT:g})",
    )
    args = parser.parse_args()
    n = args.runs or (1 if args.quick else DEFAULT_RUNS)
    projects = tuple(p.strip() for p in args.projects.split(",") if p.strip())
    unknown = sorted(set(projects) - set(PROJECTS))
    if unknown:
        parser.error(f"unknown projects {unknown}; choose from {list(PROJECTS)}")
    results = bench(n, projects, args.spacing)
    report(
        results,
        f"python -m tests.bench.bench_critical_path --runs {n} --projects {','.join(projects)} "
        f"--spacing {args.spacing:g}",
    )


if __name__ == "__main__":
    main()
