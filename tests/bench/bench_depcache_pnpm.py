"""Benchmark: provisioning the pnpm fixture cold vs from the dependency cache (its store outside the workspace).

Run: ``uv run python -m tests.bench.bench_depcache_pnpm [--runs 5]``. Needs ``npm`` (pnpm is installed with it,
:func:`tests.support.workspace_projects.pnpm_prefix`) and the npm registry. Each provision rebuilds a fresh
workspace, runs the local provider (bubblewrap, pnpm's directory read-only in it) until the app answers its
readiness probe, and tears it down, as ``env.provision`` does. Three cases, median of ``--runs`` each:

- *cold*: empty dependency cache and empty pnpm store and metadata cache (``pnpm install --frozen-lockfile``
  fetches from the registry);
- *store only*: empty dependency cache, the repository's pnpm store kept from before;
- *dependency cache*: the entry is there, setup does not run (``node_modules`` is restored, unchanged: the
  sandbox's workspace is ``/workspace`` in every workspace).

Prints medians and ratios, never asserts a time.
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from environments.checks import SetupSettings
from environments.depcache import DependencyCache
from environments.interface import RecoverySpec
from environments.local import LocalProcessProvider
from environments.sandbox import Sandbox
from environments.spec import build_recovery_spec
from environments.workspace import WorkspaceManager
from tests.bench.report import argument_parser
from tests.support.gitrepo import Repo
from tests.support.workspace_projects import pnpm_prefix, pnpm_project

RUN = "repair:bench/pnpm#1"
REPOSITORY = "bench/pnpm"


class Bench:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.settings = SetupSettings(cache=DependencyCache(root / "deps"), package_caches=root / "packages")
        packages = self.settings.package_cache(REPOSITORY)
        assert packages is not None
        self.packages = packages
        self.packages.mkdir(parents=True)
        self.counter = self.packages / "setup-counter"
        self.repo: Repo = pnpm_project(root / "fixture", self.counter)
        self.mgr = WorkspaceManager(cache_dir=root / "cache", root=root / "workspaces")
        sandbox = dataclasses.replace(Sandbox.detect(), read_only=(pnpm_prefix(),))
        self.provider = LocalProcessProvider(root / "environments", setup=self.settings, sandbox=sandbox)
        self.ops = 0

    def spec(self) -> RecoverySpec:
        ws = self.mgr.rebuild(run_id=RUN, op_id=f"{RUN}:spec", clone_url=self.repo.url, base_revision=self.repo.base)
        try:
            return build_recovery_spec(REPOSITORY, self.repo.url, self.repo.base, ws.path)
        finally:
            self.mgr.remove(ws)

    def provision(self, spec: RecoverySpec) -> float:
        self.ops += 1
        op = f"{RUN}:env:{self.ops}"
        started = time.perf_counter()
        ws = self.mgr.rebuild(run_id=RUN, op_id=op, clone_url=self.repo.url, base_revision=self.repo.base)
        (ws.path / "mark.txt").write_text(f"{op}\n")  # what the fixture's app reads
        handle = self.provider.provision(run_id=RUN, op_id=op, spec=spec, workspace=str(ws.path))
        elapsed = time.perf_counter() - started
        self.provider.teardown(handle)
        self.mgr.remove(ws)
        return elapsed

    def forget(self, *, store: bool) -> None:
        """Drop the dependency cache's entries, and pnpm's store and metadata cache when ``store``."""
        shutil.rmtree(self.root / "deps", ignore_errors=True)
        if store:
            for name in ("pnpm-store", "pnpm-cache"):
                shutil.rmtree(self.packages / name, ignore_errors=True)

    def close(self) -> None:
        self.provider.cleanup_run(RUN)


def times(values: list[float]) -> str:
    return f"{statistics.median(values):7.3f} s  ({', '.join(f'{v:.3f}' for v in values)})"


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if shutil.which("npm") is None:
        print("npm is not installed: skipped")
        return
    with tempfile.TemporaryDirectory(prefix="bench-depcache-pnpm-") as tmp:
        bench = Bench(Path(tmp))
        try:
            spec = bench.spec()
            cold, store_only = [], []
            for _ in range(args.runs):
                bench.forget(store=True)
                cold.append(bench.provision(spec))
            for _ in range(args.runs):
                bench.forget(store=False)
                store_only.append(bench.provision(spec))
            cached = [bench.provision(spec) for _ in range(args.runs)]
        finally:
            bench.close()
        installs = len(bench.counter.read_text().splitlines())
    print(f"dependency cache benchmark: pnpm fixture (semver + a linked lib), median of {args.runs} provisions each")
    print(f"  {'cold (no caches, pnpm from the registry):':<46}{times(cold)}")
    print(f"  {'pnpm store only (dependency cache empty):':<46}{times(store_only)}")
    print(f"  {'dependency cache (setup skipped, restored):':<46}{times(cached)}")
    print(f"  {'ratio (cold / dependency cache):':<46}{statistics.median(cold) / statistics.median(cached):7.2f}x")
    print(f"  setup ran {installs} times for {3 * args.runs} provisions")


if __name__ == "__main__":
    main()
