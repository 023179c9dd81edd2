"""Benchmark: provisioning the npm fixture cold vs from the dependency cache, and what a restore costs by method.

Run: ``uv run python -m tests.bench.bench_depcache [--runs 5] [--files 10000]``. Needs ``npm`` and the npm
registry. Each provision rebuilds a fresh workspace (a new operation), runs the local provider until the app answers
its readiness probe, and tears it down, as ``env.provision`` does. Three cases, median of ``--runs`` each:

- *cold*: empty dependency cache and empty npm download cache (``npm ci`` fetches ``is-number`` from the registry);
- *package cache only*: empty dependency cache, npm's download cache under the state directory kept from before;
- *dependency cache*: the entry is there, setup does not run (``node_modules`` is restored).

Then one repair run's setup work, before the dependency cache and with it: the four setups a run does
(``env.run_baseline`` and ``env.verify_candidate`` call :func:`~environments.checks.run_setup` on a fresh
workspace, the base's and the candidate's ``env.provision`` run it inside the local provider before starting the
app; verify and the candidate's provision are on base + a patch that leaves the lock file alone), each on its
own freshly rebuilt workspace, as those activities do. Three cases, median of ``--runs`` runs each:

- *without the dependency cache*: every setup runs ``npm ci`` (npm's download cache warm, as on a worker that
  has installed these packages before);
- *with it, first run of this lock file*: the baseline runs setup and stores the entry, the other three restore;
- *with it, later run*: all four restore.

Each is printed as the sum of the four setups (the time until ``run_setup`` returned, or until the provider
reported ``starting app``) and as the four steps end to end (workspace, setup, and for the provisions the app's
start and readiness), with the ratio to the run without the cache.

Then the restore alone, of the fixture's ``node_modules`` padded with ``--files`` generated files so that the
per-file cost shows, median of ``--runs`` each and the ratio to the first, measured in the same run:

- *hard links*: what ``auto`` did on a filesystem without reflinks before restores became copies (a workspace's
  in-place write reached the entry); not offered any more, measured here as the baseline;
- *hard links, verified by content*: the same, then a sha256 of every restored file checked against the one
  taken when the entry was stored (the alternative to copies that was weighed);
- *copies* (``copy``) and ``auto`` (reflinks where the filesystem has them, else the same copies).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from environments.checks import SetupSettings, run_setup
from environments.depcache import CacheKey, DependencyCache, RestoreMode, _Copier, _walk
from environments.interface import RecoverySpec
from environments.local import LocalProcessProvider
from environments.sandbox import WORKSPACE
from environments.spec import build_recovery_spec, load_recipe
from environments.workspace import WorkspaceManager
from tests.bench.report import argument_parser
from tests.support.gitrepo import Repo
from tests.support.projects import npm_project

RUN = "repair:bench/deps#1"


@dataclass
class Bench:
    """Workspaces of ``repo`` under ``root``, with the dependency cache (``deps``) and package caches beside them."""

    root: Path
    repo: Repo
    ops: int = 0

    def __post_init__(self) -> None:
        self.mgr = WorkspaceManager(cache_dir=self.root / "cache", root=self.root / "workspaces")
        self.deps = self.root / "deps"
        self.packages = self.root / "packages"

    def spec(self) -> RecoverySpec:
        ws = self.mgr.rebuild(run_id=RUN, op_id=f"{RUN}:spec", clone_url=self.repo.url, base_revision=self.repo.base)
        try:
            return build_recovery_spec("bench/deps", self.repo.url, self.repo.base, ws.path)
        finally:
            self.mgr.remove(ws)

    def provision(self, spec: RecoverySpec, *, restore: RestoreMode = "auto") -> float:
        self.ops += 1
        op = f"{RUN}:env:{self.ops}"
        settings = SetupSettings(cache=DependencyCache(self.deps, restore=restore), package_caches=self.packages)
        provider = LocalProcessProvider(self.root / "environments", setup=settings, stop_grace_s=2.0)
        started = time.perf_counter()
        ws = self.mgr.rebuild(run_id=RUN, op_id=op, clone_url=self.repo.url, base_revision=self.repo.base)
        handle = provider.provision(run_id=RUN, op_id=op, spec=spec, workspace=str(ws.path))
        elapsed = time.perf_counter() - started
        provider.teardown(handle)
        self.mgr.remove(ws)
        return elapsed

    def restore(self, key: CacheKey, method: str) -> float:
        """One restore of ``key`` into a fresh workspace by ``method``: ``hardlink``, ``hardlink+verify`` (see the
        module), or a :data:`RestoreMode`."""
        self.ops += 1
        ws = self.mgr.rebuild(
            run_id=RUN, op_id=f"{RUN}:restore:{self.ops}", clone_url=self.repo.url, base_revision=self.repo.base
        )
        if method.startswith("hardlink"):
            cache: DependencyCache = HardLinkCache(self.deps)
        else:
            cache = DependencyCache(self.deps, restore="copy" if method == "copy" else "auto")
        expected = self.stored_content if method == "hardlink+verify" else ""
        os.sync()  # what earlier cases wrote is on disk before this one is timed
        started = time.perf_counter()
        restored = cache.restore(key, ws.path)
        if expected:
            assert content_digest(ws.path, key.paths, self.relocated) == expected, "the entry changed"
        elapsed = time.perf_counter() - started
        assert not isinstance(restored, str), restored
        self.mgr.remove(ws)
        return elapsed

    @property
    def stored_content(self) -> str:
        """The content digest the verifying alternative would record when storing (taken once, not timed)."""
        if not hasattr(self, "_stored_content"):
            cache = DependencyCache(self.deps)
            entry = next(p for p in cache.entries() if not p.name.startswith("."))
            record = cache.read_record(entry)
            assert record is not None
            self.relocated = frozenset(record.relocate)
            self._stored_content = content_digest(entry / "tree", record.paths, self.relocated)
        return self._stored_content

    def key(self) -> CacheKey:
        ws = self.mgr.rebuild(run_id=RUN, op_id=f"{RUN}:key", clone_url=self.repo.url, base_revision=self.repo.base)
        try:
            # The local provider's setup runs sandboxed, seeing every workspace at the sandbox's fixed path.
            key = DependencyCache(self.deps).key_for(
                ws.path, load_recipe(ws.path), repository="bench/deps", provider="local", mount=WORKSPACE
            )
        finally:
            self.mgr.remove(ws)
        assert isinstance(key, CacheKey), key
        return key

    def close(self) -> None:
        self.mgr.cleanup_run(RUN)
        LocalProcessProvider(self.root / "environments").cleanup_run(RUN)


class HardLinks(_Copier):
    """Hard links, as restores were made before they became copies (the benchmark's baseline only)."""

    def put(self, src: Path, dst: Path) -> None:
        os.link(src, dst, follow_symlinks=False)
        self.counts["hardlink"] = self.counts.get("hardlink", 0) + 1


class HardLinkCache(DependencyCache):
    def _copier(self) -> _Copier:
        return HardLinks("copy")


def content_digest(root: Path, paths: list[str], skip: frozenset[str]) -> str:
    """sha256 over each regular file's path and the sha256 of its bytes (``skip``: the relocated files, which a
    restore rewrites on purpose)."""
    digest = hashlib.sha256()
    for rel, st in _walk(root, paths):
        if not os.path.isfile(root / rel) or os.path.islink(root / rel) or rel in skip:
            continue
        with (root / rel).open("rb") as fh:
            digest.update(f"{rel} {hashlib.file_digest(fh, 'sha256').hexdigest()} {st.st_size}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class RunTimes:
    """One run's four setups: their summed setup time and the four steps' time end to end (seconds)."""

    setup: float
    steps: float


class AppStart:
    """A provider's ``progress`` callback noting when it said it was starting the app (its setup was done)."""

    def __init__(self) -> None:
        self.at: float | None = None

    def __call__(self, state: str) -> None:
        if self.at is None and state.startswith("starting app"):
            self.at = time.perf_counter()


@dataclass
class RunSetups:
    """The setup work of one repair run on ``repo``, done the way the environment activities do it."""

    root: Path
    repo: Repo
    spec: RecoverySpec
    patch: str
    runs: int = 0

    # The installs setup ran (``npm ci``), heard from the setups' progress: a candidate's setup gets a throwaway
    # package cache, so nothing it writes outside its workspace could count them.
    installs: int = 0

    def __post_init__(self) -> None:
        self.mgr = WorkspaceManager(cache_dir=self.root / "cache", root=self.root / "workspaces")

    def heard(self, state: str) -> None:
        if state.startswith("setup: npm ci"):
            self.installs += 1

    def once(self, settings: SetupSettings) -> RunTimes:
        """Baseline, base provision, verify, candidate provision of a new run, with ``settings`` for every setup."""
        self.runs += 1
        run_id = f"repair:bench/run#{self.runs}"
        provider = LocalProcessProvider(self.root / "environments", setup=settings, stop_grace_s=2.0)
        setup = steps = 0.0
        try:
            for step, patch, app in (
                ("baseline", None, False),
                ("env-base:1", None, True),
                ("verify:1", self.patch, False),
                ("env-candidate-1:1", self.patch, True),
            ):
                op = f"{run_id}:{step}"
                started = time.perf_counter()
                ws = self.mgr.rebuild(
                    run_id=run_id, op_id=op, clone_url=self.repo.url, base_revision=self.repo.base, patch=patch
                )
                setup_started = time.perf_counter()
                if app:
                    # The provider sets up, then says it starts the app: setup is what came before.
                    heard = AppStart()

                    def progress(state: str, heard: AppStart = heard) -> None:
                        heard(state)
                        self.heard(state)

                    handle = provider.provision(
                        run_id=run_id, op_id=op, spec=self.spec, workspace=str(ws.path), progress=progress
                    )
                    done = time.perf_counter()
                    assert heard.at is not None, "the provider never said it was starting the app"
                    setup += heard.at - setup_started
                    provider.teardown(handle)
                else:
                    run_setup(
                        ws.path,
                        self.spec.recipe,
                        marker=f"bench/{op}",
                        log_path=self.root / f"{step}.log",
                        progress=self.heard,
                        timeout_s=300,
                        settings=settings,
                        repository=self.spec.repository,
                        base_lock_hash=self.spec.dependency_lock_hash,
                    )
                    done = time.perf_counter()
                    setup += done - setup_started
                steps += done - started
                self.mgr.remove(ws)
        finally:
            provider.cleanup_run(run_id)
            self.mgr.cleanup_run(run_id)
        return RunTimes(setup=setup, steps=steps)


def run_setup_cases(root: Path, runs: int) -> None:
    """One run's setups without the dependency cache and with it (first and later run of the lock file)."""
    repo = npm_project(root / "run-fixture", None)
    bench = Bench(root / "run-spec", repo)
    try:
        spec = bench.spec()
    finally:
        bench.close()
    # A candidate changes code, not the lock file, so its setup has the same key as the base's.
    patch = repo.make_patch({"app.js": (repo.work / "app.js").read_text() + "// the candidate's change\n"})
    run = RunSetups(root / "runs", repo, spec, patch)
    deps, packages = root / "runs" / "deps", root / "runs" / "packages"
    without = SetupSettings(package_caches=packages)

    def cached() -> SetupSettings:
        return SetupSettings(cache=DependencyCache(deps), package_caches=packages)

    run.once(without)  # warms npm's download cache, as a worker's is; not counted
    installs = [run.installs]
    before = [run.once(without) for _ in range(runs)]
    installs.append(run.installs)
    first = []
    for _ in range(runs):
        shutil.rmtree(deps, ignore_errors=True)
        first.append(run.once(cached()))
    installs.append(run.installs)
    later = [run.once(cached()) for _ in range(runs)]
    installs.append(run.installs)
    ran = [b - a for a, b in itertools.pairwise(installs)]

    print(f"one run's setups (baseline, base provision, verify, candidate provision), median of {runs} runs each:")
    print(f"  {'':<46}{'setup (4 setups)':<20}{'the 4 steps end to end':<24}setup ran")
    base_setup = statistics.median(t.setup for t in before)
    base_steps = statistics.median(t.steps for t in before)
    for label, results, count in (
        ("without the dependency cache:", before, ran[0]),
        ("with it, first run of the lock file:", first, ran[1]),
        ("with it, later run:", later, ran[2]),
    ):
        setup_s = statistics.median(t.setup for t in results)
        steps_s = statistics.median(t.steps for t in results)
        print(f"  {label:<46}{setup_s:7.3f} s{'':<11}{steps_s:7.3f} s{'':<15}{count}/{4 * runs}")
    for label, results in (("first run", first), ("later run", later)):
        setup_ratio = base_setup / statistics.median(t.setup for t in results)
        steps_ratio = base_steps / statistics.median(t.steps for t in results)
        what = f"ratio (without / with, {label}):"
        print(f"  {what:<46}{setup_ratio:7.2f}x{'':<12}{steps_ratio:7.2f}x")
    print("  per run, setup s / steps s:")
    for label, results in (("without", before), ("first", first), ("later", later)):
        print(f"    {label + ':':<9}" + ", ".join(f"{t.setup:.2f}/{t.steps:.2f}" for t in results))


def repository_packages(packages: Path) -> Path:
    """The package cache directory of the benchmark's repository under ``packages``, made now: the sandbox binds
    it only if it exists, and setup's counter is written there."""
    directory = SetupSettings(package_caches=packages).package_cache("bench/deps")
    assert directory is not None
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def times(values: list[float]) -> str:
    return f"{statistics.median(values):7.3f} s  ({', '.join(f'{v:.3f}' for v in values)})"


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--files", type=int, default=10_000, help="generated files added for the restore comparison")
    args = parser.parse_args()
    if shutil.which("npm") is None:
        print("npm is not installed: skipped")
        return
    with tempfile.TemporaryDirectory(prefix="bench-depcache-") as tmp:
        root = Path(tmp)
        # Setup runs sandboxed and may write only its workspace and the package caches: the counter lives there.
        bench = Bench(root, npm_project(root / "fixture", repository_packages(root / "packages") / "counter"))
        try:
            spec = bench.spec()
            cold, packages_only, cached = [], [], []
            for _ in range(args.runs):
                shutil.rmtree(bench.deps, ignore_errors=True)
                # npm's download cache only: the setup counter lives beside it.
                shutil.rmtree(repository_packages(bench.packages) / "npm", ignore_errors=True)
                cold.append(bench.provision(spec))
            for _ in range(args.runs):
                shutil.rmtree(bench.deps, ignore_errors=True)
                packages_only.append(bench.provision(spec))
            cached = [bench.provision(spec) for _ in range(args.runs)]
        finally:
            bench.close()
        installs = len((repository_packages(root / "packages") / "counter").read_text().splitlines())

        padding = (
            f"python3 -c \"import pathlib; d = pathlib.Path('node_modules/.padding'); d.mkdir(); "
            f"[(d / f'{{i}}.js').write_text('module.exports = {{}};') for i in range({args.files})]\""
        )
        padded = Bench(
            root / "padded",
            npm_project(
                root / "padded" / "fixture",
                repository_packages(root / "padded" / "packages") / "counter",
                extra_setup=[padding],
            ),
        )
        try:
            bench_spec = padded.spec()
            padded.provision(bench_spec)
            key = padded.key()
            methods = ("hardlink", "hardlink+verify", "copy", "auto")
            restores: dict[str, list[float]] = {method: [] for method in methods}
            for i in range(args.runs):
                # Interleaved and rotated, so that a change of the machine's load and what the previous case
                # left to write back hit every method alike.
                for method in methods[i % len(methods) :] + methods[: i % len(methods)]:
                    restores[method].append(padded.restore(key, method))
        finally:
            padded.close()
        files = sum(1 for p in (padded.deps).rglob("*") if p.is_file()) - 2  # the record and the stamp
    cold_s, cached_s = statistics.median(cold), statistics.median(cached)
    print(f"dependency cache benchmark: npm fixture (is-number), median of {args.runs} provisions each")
    print(f"  {'cold (no caches, npm ci from the registry):':<46}{times(cold)}")
    print(f"  {'package cache only (npm ci from its cache):':<46}{times(packages_only)}")
    print(f"  {'dependency cache (setup skipped, restored):':<46}{times(cached)}")
    print(f"  {'ratio (cold / dependency cache):':<46}{cold_s / cached_s:7.2f}x")
    print(f"  setup ran {installs} times for {3 * args.runs} provisions")
    print(f"restore of node_modules with {files} files, median of {args.runs} (ratio to hard links):")
    baseline = statistics.median(restores["hardlink"])
    for method, label in (
        ("hardlink", "hard links (before; not offered):"),
        ("hardlink+verify", "hard links, verified by content:"),
        ("copy", "copies (copy):"),
        ("auto", "auto (reflinks, else copies):"),
    ):
        ratio = statistics.median(restores[method]) / baseline
        print(f"  {label:<46}{times(restores[method])}  {ratio:5.2f}x")
    with tempfile.TemporaryDirectory(prefix="bench-depcache-run-") as tmp:
        run_setup_cases(Path(tmp), args.runs)


if __name__ == "__main__":
    main()
