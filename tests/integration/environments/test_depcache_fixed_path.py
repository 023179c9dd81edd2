"""What the dependency cache restores is exactly what setup built, and works in every workspace: real installs in
real bubblewrap, where every command sees its workspace at ``/workspace``.

A pip project installing itself editable (``.venv`` and its egg-info cached), an npm project and a pnpm project
linking a package of the checkout into ``node_modules`` (with ``.bin`` entries): one workspace builds the entry
and is deleted, then workspaces whose paths have the same length as the building one's (and one of another
length) restore it, without running setup, and their tests import their *own* source (each workspace has a
``mark.txt`` of its own, which the code prints). The entry is relocated nowhere: its record says it was built at
``/workspace`` and lists nothing to rewrite.
"""

from __future__ import annotations

import dataclasses
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from environments.checks import SetupOutcome, SetupSettings, run_setup, run_tests
from environments.depcache import DependencyCache
from environments.files import path_key
from environments.interface import TestRunResult
from environments.sandbox import SANDBOXED, UNSANDBOXED, WORKSPACE, Sandbox
from environments.spec import dependency_lock_hash, load_recipe
from environments.workspace import Workspace, WorkspaceManager
from tests.conftest import require
from tests.support.gitrepo import Repo
from tests.support.projects import counter_lines
from tests.support.workspace_projects import npm_bin_project, pip_editable_project, pnpm_prefix, pnpm_project

pytestmark = pytest.mark.slow

RUN = "repair:acme/fixed#4"
REPOSITORY = "acme/fixed"


class Worker:
    """Setup and tests of one repository as the local provider runs them: sandboxed, with the dependency cache
    and the repository's package caches."""

    def __init__(self, tmp: Path, sandbox: Sandbox) -> None:
        self.tmp = tmp
        self.sandbox = sandbox
        self.cache = DependencyCache(tmp / "state" / "cache" / "deps")
        self.settings = SetupSettings(cache=self.cache, package_caches=tmp / "state" / "cache" / "packages")
        self.mgr = WorkspaceManager(cache_dir=tmp / "state" / "cache", root=tmp / "state" / "workspaces")
        packages = self.settings.package_cache(REPOSITORY)
        assert packages is not None
        self.packages = packages
        self.packages.mkdir(parents=True, exist_ok=True)
        self.counter = self.packages / "setup-counter"

    def workspace(self, repo: Repo, op: str) -> Workspace:
        ws = self.mgr.rebuild(run_id=RUN, op_id=f"{RUN}:{op}", clone_url=repo.url, base_revision=repo.base)
        # Only this workspace has this mark: the tests print the one their code found.
        (ws.path / "mark.txt").write_text(f"mark-of-{op}\n")
        return ws

    def log(self, ws: Workspace) -> Path:
        return self.tmp / "logs" / f"{ws.path.name}.log"

    def setup(self, ws: Workspace) -> SetupOutcome:
        recipe = load_recipe(ws.path)
        return run_setup(
            ws.path,
            recipe,
            marker=f"test/{uuid.uuid4().hex}",
            log_path=self.log(ws),
            timeout_s=600,
            settings=self.settings,
            repository=REPOSITORY,
            # The base's lock files (as the spec records them): the repository's own package caches are mounted.
            base_lock_hash=dependency_lock_hash(ws.path, recipe),
            sandbox=self.sandbox,
        )

    def tests(self, ws: Workspace) -> TestRunResult:
        return run_tests(ws.path, load_recipe(ws.path), 120, log_path=self.log(ws), sandbox=self.sandbox)


@pytest.fixture
def worker(tmp_path: Path) -> Worker:
    return Worker(tmp_path, Sandbox.detect())


def same_length_ops(count: int) -> list[str]:
    """Operation ids giving workspace paths of one length (the path is ``root/<run key>/<op key>``)."""
    return [f"ws-{chr(ord('a') + i)}" for i in range(count)]


def check_restores(
    worker: Worker, repo: Repo, *, followers: list[str], built_paths: list[str], printed: Callable[[str, Path], str]
) -> dict[str, int]:
    """The first workspace builds the entry and is deleted; each of ``followers`` restores it without running setup
    (its setup_check runs), and its tests print ``printed(op, where the command sees the workspace)``: its own
    mark, from its own code. Returns each workspace's path length by operation."""
    lengths: dict[str, int] = {}
    first = worker.workspace(repo, "ws-0")
    lengths["ws-0"] = len(str(first.path))
    built = worker.setup(first)
    assert built.ran and built.stored is not None, worker.log(first).read_text()
    record = built.stored
    if worker.sandbox.sandboxed:
        assert record.mount == WORKSPACE and record.relocate == {} and record.drop == []
    else:
        # Setup saw the workspace's own path: the restore relocates, and drops the bytecode naming it.
        assert record.mount == "" and record.relocate and record.drop
    assert record.paths == built_paths
    result = worker.tests(first)
    assert result.passed, result.output_tail
    assert printed("ws-0", worker.sandbox.inside(first.path)) in result.output_tail
    assert counter_lines(worker.counter) == 1
    first_path = first.path
    worker.mgr.remove(first)
    assert not first_path.exists()

    for op in followers:
        ws = worker.workspace(repo, op)
        lengths[op] = len(str(ws.path))
        outcome = worker.setup(ws)
        log = worker.log(ws).read_text()
        assert not outcome.ran and outcome.restored == record, log
        assert f"# dependency cache: restored entry {record.key[:12]} instead of running setup" in log
        assert f"$ {load_recipe(ws.path).setup_check}\n" in log
        result = worker.tests(ws)
        assert result.passed, result.output_tail
        assert printed(op, worker.sandbox.inside(ws.path)) in result.output_tail
        assert "mark-of-ws-0" not in result.output_tail
        assert str(first_path) not in result.output_tail
    assert counter_lines(worker.counter) == 1, "no install ran after the first"
    assert [worker.cache.read_record(entry) for entry in worker.cache.entries()] == [record]
    return lengths


def check_node_restores(worker: Worker, repo: Repo, semver: str) -> None:
    """:func:`check_restores` for a node project, whose install is ``node_modules``: restored in a workspace whose
    path is as long as the first's and in a longer one, each prints its own ``lib/index.js`` and the ``semver``
    it loads from ``node_modules/`` (``semver``: that package's path there)."""
    check_restores(
        worker,
        repo,
        followers=[*same_length_ops(1), "ws-longer-path-0"],
        built_paths=["node_modules"],
        printed=lambda op, where: f"mark mark-of-{op} {where}/lib/index.js {where}/node_modules/{semver}",
    )


@pytest.mark.parametrize("kind", [SANDBOXED, UNSANDBOXED])
def test_an_editable_pip_install_restored_imports_each_workspaces_own_source(
    worker: Worker, tmp_path: Path, kind: str
) -> None:
    worker.sandbox = dataclasses.replace(worker.sandbox, kind=kind)
    repo = pip_editable_project(tmp_path, worker.counter)
    same = same_length_ops(3)
    other = "ws-longer-path-0"

    lengths = check_restores(
        worker,
        repo,
        followers=[*same, other],
        built_paths=[".venv", "durapkg.egg-info"],
        printed=lambda op, where: f"mark mark-of-{op} {where}/durapkg/__init__.py\ncli mark-of-{op} {where}/durapkg/",
    )

    assert {lengths[op] for op in same} == {lengths["ws-0"]} != {lengths[other]}
    # The editable install is a finder mapping the package to a folder (what named the building workspace).
    last = worker.mgr.root / path_key(RUN) / path_key(f"{RUN}:{other}")
    [finder] = (last / ".venv").glob("lib/python3*/site-packages/__editable___durapkg_*_finder.py")
    assert f"'durapkg': '{worker.sandbox.inside(last)}/durapkg'" in finder.read_text()


def test_an_npm_install_with_bin_links_is_restored_and_runs_each_workspaces_own_code(
    worker: Worker, tmp_path: Path
) -> None:
    require(shutil.which("npm") is not None, "npm is missing")
    repo = npm_bin_project(tmp_path, worker.counter)

    check_node_restores(worker, repo, "semver/")


def test_a_pnpm_install_is_cached_with_its_store_outside_the_workspace_and_restored(
    worker: Worker, tmp_path: Path
) -> None:
    require(shutil.which("npm") is not None, "npm is missing (pnpm is installed with it)")
    worker.sandbox = dataclasses.replace(worker.sandbox, read_only=(pnpm_prefix(),))
    repo = pnpm_project(tmp_path, worker.counter)

    check_node_restores(worker, repo, ".pnpm/semver@")

    store = worker.packages / "pnpm-store"
    assert any(store.rglob("*")), "pnpm kept its store in the repository's package cache"
    for ws_dir in worker.mgr.root.glob("*/*"):
        assert not (ws_dir / ".pnpm-store").exists()
    # The store is another mount in the sandbox: pnpm copied from it, so no workspace file is the store's.
    workspace = next(p for p in worker.mgr.root.glob("*/*") if p.is_dir())
    files = [p for p in (workspace / "node_modules").rglob("*") if p.is_file() and not p.is_symlink()]
    assert files and all(p.stat().st_nlink == 1 for p in files)
