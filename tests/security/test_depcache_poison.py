"""The caches setup shares between workspaces cannot be poisoned by one of them: real bubblewrap, real git
workspaces, real files.

- *The dependency cache.* A restored ``node_modules`` file edited in place by one workspace's tests or setup
  (same size, its mtime put back: what a shape digest cannot see) reaches neither the cache entry nor the next
  workspace restored from it.
- *The package caches.* Repository A's setup writes into every package cache directory it is given and into
  every sibling it can find; repository B's setup then reads nothing of it. A candidate of B whose patch changes
  B's lock file installs into a throwaway cache, which B's next setup never sees.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from environments.checks import THROWAWAY_PREFIX, SetupSettings
from environments.depcache import TREE_NAME, DependencyCache
from environments.interface import RecoverySpec
from environments.local import LocalProcessProvider
from environments.sandbox import Sandbox, bwrap_problem
from environments.spec import build_recovery_spec
from environments.workspace import Workspace, WorkspaceManager
from tests.conftest import require
from tests.support.gitrepo import Repo, make_repo
from tests.support.projects import write_project

RUN = "repair:acme/poison#1"
GOOD = "module.exports = 'GOOD';\n"
LIB = "node_modules/dep/lib.js"
# Same size, mtime put back: invisible to the (path, mode, size, mtime) digest of a tree.
EDIT_IN_PLACE = (
    "python3 -I -c \"import os; p = '" + LIB + "'; st = os.stat(p); f = open(p, 'r+b'); f.seek(18); "
    "f.write(b'EVIL'); f.close(); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\""
)
INSTALL = f'mkdir -p node_modules/dep && printf "{GOOD.strip()}\\n" > {LIB}'


@pytest.fixture(autouse=True)
def _bwrap() -> None:
    problem = bwrap_problem()
    require(problem is None, f"bubblewrap is unusable: {problem}")


class Worker:
    """One worker's state: workspaces, a local provider in bubblewrap, setup settings shared by every run."""

    def __init__(self, tmp: Path, settings: SetupSettings) -> None:
        self.tmp = tmp
        self.settings = settings
        self.mgr = WorkspaceManager(cache_dir=tmp / "cache", root=tmp / "workspaces")
        self.provider = LocalProcessProvider(
            tmp / "environments", setup=settings, sandbox=Sandbox.detect(), stop_grace_s=2.0
        )

    def workspace(self, repo: Repo, patch: str | None = None) -> Workspace:
        op = f"{RUN}:{uuid.uuid4().hex[:8]}"
        return self.mgr.rebuild(run_id=RUN, op_id=op, clone_url=repo.url, base_revision=repo.base, patch=patch)

    def spec(self, repository: str, repo: Repo) -> RecoverySpec:
        ws = self.workspace(repo)
        try:
            return build_recovery_spec(repository, repo.url, repo.base, ws.path)
        finally:
            self.mgr.remove(ws)

    def check(self, spec: RecoverySpec, ws: Workspace, *, command: str | None = None) -> str:
        """Setup and the tests (or ``command``) in ``ws`` as a verification runs them; returns the log."""
        log = self.tmp / "logs" / f"{ws.path.name}-{uuid.uuid4().hex[:6]}.log"
        result = self.provider.run_checks(
            spec,
            str(ws.path),
            run_id=RUN,
            op_id=f"{RUN}:check",
            log_path=log,
            setup_timeout_s=60,
            test_timeout_s=60,
            command=command,
        )
        assert result.passed, result.output_tail
        return log.read_text()

    def close(self) -> None:
        self.provider.cleanup_run(RUN)
        self.mgr.cleanup_run(RUN)


def project(tmp: Path, name: str, recipe: dict[str, object], files: dict[str, str] | None = None) -> Repo:
    source = write_project(
        tmp / f"{name}-source",
        {"package-lock.json": '{"lockfileVersion": 3, "packages": {}}\n', ".gitignore": "node_modules/\n"}
        | (files or {}),
        {"start": "sleep 300", **recipe},
    )
    return make_repo(tmp / name, source)


@pytest.mark.parametrize("writer", ["tests", "setup"])
def test_an_in_place_edit_of_a_restored_file_reaches_neither_the_cache_nor_the_next_workspace(
    tmp_path: Path, writer: str
) -> None:
    if writer == "tests":
        recipe: dict[str, object] = {"setup": [INSTALL], "test": EDIT_IN_PLACE}
    else:
        # A setup that, run again in a workspace whose node_modules was restored, edits it in place.
        recipe = {"setup": [f"if [ -e {LIB} ]; then {EDIT_IN_PLACE}; else {INSTALL}; fi"], "test": "true"}
    repo = project(tmp_path, "app", recipe)
    deps = DependencyCache(tmp_path / "deps")
    worker = Worker(tmp_path, SetupSettings(cache=deps, package_caches=tmp_path / "packages"))
    try:
        spec = worker.spec("acme/app", repo)
        builder = worker.workspace(repo)
        assert "# dependency cache: stored entry" in worker.check(spec, builder)
        restored = worker.workspace(repo)
        assert "# dependency cache: restored entry" in worker.check(spec, restored)
        if writer == "setup":
            # node_modules is there now: setup runs again (nothing is restored over it) and edits in place.
            assert "already exists in the workspace" in worker.check(spec, restored)
            assert "# dependency cache: stored entry" not in worker.check(spec, builder)
        edited = [(ws.path / LIB).read_text() for ws in (builder, restored)]
        assert all("EVIL" in text and len(text) == len(GOOD) for text in edited), edited  # the attack ran

        later = worker.workspace(repo)
        log = worker.check(spec, later, command="true")

        assert "# dependency cache: restored entry" in log  # restored, not set up anew
        assert (later.path / LIB).read_text() == GOOD
        [entry] = [p for p in deps.entries() if not p.name.startswith(".")]
        assert (entry / TREE_NAME / LIB).read_text() == GOOD
    finally:
        worker.close()


# Plants a file in every package cache directory setup was given, and in every sibling of its repository's
# directory it can reach; then lists what it can see of the package caches into the workspace.
POISON = (
    'for d in "$npm_config_cache" "$PIP_CACHE_DIR" "$UV_CACHE_DIR"; do echo poison > "$d/planted"; '
    'for s in "$d"/../../*/npm "$d"/../../*/pip; do echo poison > "$s/planted" 2>/dev/null; done; done; true'
)
SEE = (
    'for d in "$npm_config_cache" "$PIP_CACHE_DIR" "$UV_CACHE_DIR"; do ls -A "$d"; cat "$d"/* 2>/dev/null; done '
    "> seen.txt; true"
)


def test_one_repositorys_setup_cannot_change_what_anothers_install_reads(tmp_path: Path) -> None:
    packages = tmp_path / "packages"
    worker = Worker(tmp_path, SetupSettings(package_caches=packages))
    attacker = project(tmp_path, "attacker", {"setup": [POISON], "test": "true"})
    victim = project(tmp_path, "victim", {"setup": [SEE, 'echo "$npm_config_cache" > cache-dir.txt'], "test": "true"})
    try:
        attacker_spec = worker.spec("acme/attacker", attacker)
        victim_spec = worker.spec("acme/victim", victim)
        first = worker.workspace(victim)
        worker.check(victim_spec, first)  # the victim's caches exist before the attacker runs
        attacked = worker.workspace(attacker)
        worker.check(attacker_spec, attacked)
        planted = list(packages.rglob("planted"))
        own = worker.settings.package_cache("acme/attacker")
        assert own is not None and planted and all(p.is_relative_to(own) for p in planted)

        later = worker.workspace(victim)
        worker.check(victim_spec, later)

        assert "poison" not in (later.path / "seen.txt").read_text()
        assert (first.path / "cache-dir.txt").read_text() == (later.path / "cache-dir.txt").read_text()
    finally:
        worker.close()


def test_a_candidate_that_changes_the_lock_file_installs_into_a_throwaway_cache(tmp_path: Path) -> None:
    packages = tmp_path / "packages"
    worker = Worker(tmp_path, SetupSettings(package_caches=packages))
    setup = [
        f"if grep -q candidate package-lock.json; then {POISON}; else {SEE}; fi",
        'echo "$npm_config_cache" > cache-dir.txt',
    ]
    repo = project(tmp_path, "app", {"setup": setup, "test": "true"})
    try:
        spec = worker.spec("acme/app", repo)
        shared = worker.settings.package_cache("acme/app")
        assert shared is not None
        base = worker.workspace(repo)
        worker.check(spec, base)
        patch = repo.make_patch({"package-lock.json": '{"lockfileVersion": 3, "packages": {"candidate": {}}}\n'})
        dead = packages / f"{THROWAWAY_PREFIX}of-a-killed-worker"
        (dead / "npm").mkdir(parents=True)
        (dead / "npm" / "planted").write_text("poison\n")
        candidate = worker.workspace(repo, patch)
        worker.check(spec, candidate)
        assert not dead.exists()  # nobody held its lock: swept when the candidate's cache was made
        used = Path((candidate.path / "cache-dir.txt").read_text().strip())
        assert used.parent.name.startswith(THROWAWAY_PREFIX) and used.parent.parent == packages
        assert not used.exists()  # removed when its setup ended

        later = worker.workspace(repo)
        worker.check(spec, later)

        assert "poison" not in (later.path / "seen.txt").read_text()
        assert Path((later.path / "cache-dir.txt").read_text().strip()).parent == shared
        assert not list(packages.rglob("planted"))
    finally:
        worker.close()


def test_a_candidate_that_keeps_the_lock_file_neither_writes_the_package_cache_nor_stores_an_entry(
    tmp_path: Path,
) -> None:
    """A patch that changes what setup runs (a ``postinstall`` script, say) but not the lock files: its setup gets
    a throwaway package cache, and what it produced is never stored as a dependency-cache entry, so neither
    reaches the base's next setup or a later workspace restored from the cache."""
    packages = tmp_path / "packages"
    deps = DependencyCache(tmp_path / "deps")
    worker = Worker(tmp_path, SetupSettings(cache=deps, package_caches=packages))
    # setup.sh is the repository's: the candidate's patch rewrites it to poison what it can reach.
    repo = project(
        tmp_path,
        "app",
        {"setup": ["sh setup.sh", 'echo "$npm_config_cache" > node_modules/cache-dir.txt'], "test": "true"},
        {"setup.sh": INSTALL + "\n"},
    )
    try:
        spec = worker.spec("acme/app", repo)
        shared = worker.settings.package_cache("acme/app")
        assert shared is not None
        poisoned = f"{POISON}\nmkdir -p node_modules/dep && echo \"module.exports = 'EVIL';\" > {LIB}\n"
        candidate = worker.workspace(repo, repo.make_patch({"setup.sh": poisoned}))
        log = worker.check(spec, candidate)
        assert "a candidate's setup result is not stored" in log
        used = Path((candidate.path / "node_modules" / "cache-dir.txt").read_text().strip())
        assert used.parent.name.startswith(THROWAWAY_PREFIX) and not used.exists()
        assert not [p for p in deps.entries() if not p.name.startswith(".")]  # nothing stored from it
        assert not list(shared.rglob("planted"))

        base = worker.workspace(repo)
        assert "# dependency cache: stored entry" in worker.check(spec, base)  # the base's own result
        later = worker.workspace(repo)
        assert "# dependency cache: restored entry" in worker.check(spec, later, command="true")
        assert (later.path / LIB).read_text() == GOOD
        assert not list(packages.rglob("planted"))
    finally:
        worker.close()
