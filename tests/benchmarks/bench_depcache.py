"""Benchmark: provisioning the npm fixture cold vs from the dependency cache, and what a restore costs by method.

Run: ``uv run python -m tests.benchmarks.bench_depcache [--runs 5] [--files 10000]``. Needs ``npm`` and the npm
registry. Each provision rebuilds a fresh workspace (a new operation), runs the local provider until the app answers
its readiness probe, and tears it down, as ``env.provision`` does. Three cases, median of ``--runs`` each:

- *cold*: empty dependency cache and empty npm download cache (``npm ci`` fetches ``is-number`` from the registry);
- *package cache only*: empty dependency cache, npm's download cache under the state directory kept from before;
- *dependency cache*: the entry is there, setup does not run (``node_modules`` is restored).

Then the restore alone, hard links (``auto`` on a filesystem without reflinks) vs plain copies, of the fixture's
``node_modules`` padded with ``--files`` generated files, so that the per-file cost shows.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from environments.checks import SetupSettings
from environments.depcache import CacheKey, DependencyCache, RestoreMode
from environments.interface import RecoverySpec
from environments.local import LocalProcessProvider
from environments.spec import build_recovery_spec, load_recipe
from environments.workspace import WorkspaceManager
from tests.environments.gitrepo import Repo
from tests.environments.projects import npm_project

RUN = "repair:bench/deps#1"


class Bench:
    def __init__(self, root: Path, repo: Repo) -> None:
        self.root = root
        self.repo = repo
        self.mgr = WorkspaceManager(cache_dir=root / "cache", root=root / "workspaces")
        self.ops = 0

    @property
    def deps(self) -> Path:
        return self.root / "deps"

    @property
    def packages(self) -> Path:
        return self.root / "packages"

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

    def restore(self, key: CacheKey, restore: RestoreMode) -> float:
        self.ops += 1
        ws = self.mgr.rebuild(
            run_id=RUN, op_id=f"{RUN}:restore:{self.ops}", clone_url=self.repo.url, base_revision=self.repo.base
        )
        started = time.perf_counter()
        restored = DependencyCache(self.deps, restore=restore).restore(key, ws.path)
        elapsed = time.perf_counter() - started
        assert not isinstance(restored, str), restored
        self.mgr.remove(ws)
        return elapsed

    def key(self) -> CacheKey:
        ws = self.mgr.rebuild(run_id=RUN, op_id=f"{RUN}:key", clone_url=self.repo.url, base_revision=self.repo.base)
        try:
            key = DependencyCache(self.deps).key_for(
                ws.path, load_recipe(ws.path), repository="bench/deps", provider="local"
            )
        finally:
            self.mgr.remove(ws)
        assert isinstance(key, CacheKey), key
        return key

    def close(self) -> None:
        self.mgr.cleanup_run(RUN)
        LocalProcessProvider(self.root / "environments").cleanup_run(RUN)


def times(values: list[float]) -> str:
    return f"{statistics.median(values):7.3f} s  ({', '.join(f'{v:.3f}' for v in values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--files", type=int, default=10_000, help="generated files added for the restore comparison")
    args = parser.parse_args()
    if shutil.which("npm") is None:
        print("npm is not installed: skipped")
        return
    with tempfile.TemporaryDirectory(prefix="bench-depcache-") as tmp:
        root = Path(tmp)
        # Setup runs sandboxed and may write only its workspace and the package caches: the counter lives there.
        bench = Bench(root, npm_project(root / "fixture", root / "packages" / "counter"))
        try:
            spec = bench.spec()
            cold, packages_only, cached = [], [], []
            for _ in range(args.runs):
                shutil.rmtree(bench.deps, ignore_errors=True)
                shutil.rmtree(bench.packages, ignore_errors=True)
                cold.append(bench.provision(spec))
            for _ in range(args.runs):
                shutil.rmtree(bench.deps, ignore_errors=True)
                packages_only.append(bench.provision(spec))
            cached = [bench.provision(spec) for _ in range(args.runs)]
        finally:
            bench.close()
        installs = len((root / "packages" / "counter").read_text().splitlines())

        padding = (
            f"python3 -c \"import pathlib; d = pathlib.Path('node_modules/.padding'); d.mkdir(); "
            f"[(d / f'{{i}}.js').write_text('module.exports = {{}};') for i in range({args.files})]\""
        )
        padded = Bench(
            root / "padded",
            npm_project(root / "padded" / "fixture", root / "padded" / "packages" / "counter", extra_setup=[padding]),
        )
        try:
            bench_spec = padded.spec()
            padded.provision(bench_spec)
            key = padded.key()
            hardlink = [padded.restore(key, "auto") for _ in range(args.runs)]
            copy = [padded.restore(key, "copy") for _ in range(args.runs)]
        finally:
            padded.close()
        files = sum(1 for p in (padded.deps).rglob("*") if p.is_file()) - 2  # the record and the stamp
    cold_s, cached_s = statistics.median(cold), statistics.median(cached)
    copy_ratio = statistics.median(copy) / statistics.median(hardlink)
    print(f"dependency cache benchmark: npm fixture (is-number), median of {args.runs} provisions each")
    print(f"  {'cold (no caches, npm ci from the registry):':<46}{times(cold)}")
    print(f"  {'package cache only (npm ci from its cache):':<46}{times(packages_only)}")
    print(f"  {'dependency cache (setup skipped, restored):':<46}{times(cached)}")
    print(f"  {'ratio (cold / dependency cache):':<46}{cold_s / cached_s:7.2f}x")
    print(f"  setup ran {installs} times for {3 * args.runs} provisions")
    print(f"restore of node_modules with {files} files, median of {args.runs}:")
    print(f"  {'hard links (auto):':<46}{times(hardlink)}")
    print(f"  {'copies (copy):':<46}{times(copy)}")
    print(f"  {'ratio (copy / hard links):':<46}{copy_ratio:7.2f}x")


if __name__ == "__main__":
    main()
