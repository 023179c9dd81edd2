"""The dependency cache with real installs from the registries, through the package managers' own clients
(``npm ci`` of ``is-number``, ``pip install`` of ``six`` into a ``.venv``), on the worker as durafix wires it
(:class:`~pipeline.services.Services` from config, the activities run as a worker runs them).

A second provision and a verification after the first restore what the first setup stored: setup does not run
again (its last command counts itself in a file outside the workspace), the app still has to answer its probe and
the tests still run. A setup SIGKILLed half-way, in the install or while its entry is being stored, leaves nothing
that is ever used.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from temporalio.testing import ActivityEnvironment

from environments.cache_prune import DependencySource, prune, survey
from environments.checks import SetupSettings, run_setup
from environments.depcache import RECORD_NAME, TMP_MARK, TREE_NAME, DependencyCache
from environments.files import path_key
from environments.interface import EnvironmentHandle
from environments.processes import stop_owned
from environments.spec import load_recipe, spec_from_json
from environments.workspace import Workspace, WorkspaceManager
from evidence.interface import ArtifactKind, ArtifactRef
from pipeline.config import DurafixConfig
from pipeline.services import Services
from pipeline.steps import CleanupRunInput, PrepareSpecInput, ProvisionInput
from tests.conftest import require
from tests.support.gitrepo import Repo
from tests.support.projects import counter_lines, npm_project, pip_project
from tests.support.step_inputs import first_verify

pytestmark = pytest.mark.slow

PROJECT_ROOT = Path(__file__).resolve().parents[3]
RUN = "repair:acme/deps#9"
A = TypeVar("A")
R = TypeVar("R")
REPOSITORY = "acme/deps"


class Host:
    """One worker host: :class:`Services` built from config on its own state directory."""

    def __init__(self, tmp: Path) -> None:
        self.config = DurafixConfig(state_dir=tmp / "state", evidence_url=(tmp / "evidence").as_uri())
        self.services = Services(self.config)
        self.env = self.services.environment_activities()

    def run(self, fn: Callable[[A], R], arg: A) -> R:
        """One activity attempt, as a worker runs it."""
        return ActivityEnvironment().run(fn, arg)

    def spec(self, repo: Repo) -> ArtifactRef:
        inp = PrepareSpecInput(
            run_id=RUN, op_id=f"{RUN}:spec", repository=REPOSITORY, clone_url=repo.url, base_revision=repo.base
        )
        return self.run(self.env.prepare_spec, inp)

    def provision(self, spec_ref: ArtifactRef, n: int) -> EnvironmentHandle:
        return self.run(self.env.provision, ProvisionInput(run_id=RUN, op_id=f"{RUN}:env-base:{n}", spec_ref=spec_ref))

    def provision_log(self, n: int) -> str:
        run_dir = self.config.state_dir / "environments" / path_key(RUN)
        return (run_dir / f"{path_key(f'{RUN}:env-base:{n}')}.log").read_text()

    def cache(self) -> DependencyCache:
        cache = self.services.setup.cache
        assert cache is not None, "the dependency cache is on by default"
        return cache


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    worker = Host(tmp_path)
    yield worker
    worker.run(worker.env.cleanup_run, CleanupRunInput(run_id=RUN))


@pytest.fixture
def counter(tmp_path: Path) -> Path:
    # Setup runs sandboxed: besides its workspace it may write only its repository's package caches
    # (STATE/cache/packages/<repository>), so the count of setups that ran is kept there.
    path = tmp_path / "state" / "cache" / "packages" / path_key(REPOSITORY) / "setup-counter"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def answers(handle: EnvironmentHandle) -> int:
    return httpx.get(handle.base_url + "/healthz", trust_env=False, timeout=10).status_code


def check_reuse(host: Host, repo: Repo, counter: Path, installed: str, patch: str) -> None:
    """Provision, provision again, verify a candidate: setup runs once, the other two restore its entry."""
    spec_ref = host.spec(repo)
    spec = spec_from_json(host.services.store.read_bytes(spec_ref))

    first = host.provision(spec_ref, 1)
    assert answers(first) == 200
    assert counter_lines(counter) == 1
    [entry] = host.cache().entries()
    record = host.cache().read_record(entry)
    assert record is not None
    assert record.repository == REPOSITORY and record.provider == "local"
    assert record.setup == spec.recipe.setup
    assert record.lock_hash == spec.dependency_lock_hash
    assert set(record.lock_files) == {installed} and record.created_at
    assert "# dependency cache: stored entry" in host.provision_log(1)
    host.run(host.env.teardown, first)

    second = host.provision(spec_ref, 2)
    assert answers(second) == 200
    assert counter_lines(counter) == 1
    assert "# dependency cache: restored entry" in host.provision_log(2)

    patch_ref = host.services.store.put_bytes(
        patch.encode(), kind=ArtifactKind.PATCH, run_id=RUN, name="candidate.patch", media_type="text/x-diff"
    )
    verify = first_verify(RUN, spec_ref, patch_ref, "Check more", 1_700_000_200)
    result = host.run(host.env.verify_candidate, verify)
    test_log = host.services.store.read_bytes(result.test_output_ref).decode()
    assert result.tests_passed, test_log
    assert "# dependency cache: restored entry" in test_log
    assert counter_lines(counter) == 1
    # Still the one entry, and its record unchanged: nothing was rebuilt.
    assert host.cache().entries() == [entry]
    assert host.cache().read_record(entry) == record


def test_npm_a_second_provision_and_a_verify_reuse_the_cached_node_modules(
    host: Host, tmp_path: Path, counter: Path
) -> None:
    require(subprocess.run(["npm", "--version"], capture_output=True, check=False).returncode == 0, "npm is missing")
    repo = npm_project(tmp_path, counter)
    test_js = (repo.work / "test.js").read_text()
    patch = repo.make_patch({"test.js": test_js + 'assert.strictEqual(isNumber(" 7 "), true);\n'})

    check_reuse(host, repo, counter, "package-lock.json", patch)

    packages = host.config.state_dir / "cache" / "packages" / path_key(REPOSITORY) / "npm"
    assert any(packages.rglob("*")), "npm kept its download cache under the state directory"


def test_pip_a_second_provision_and_a_verify_reuse_the_cached_venv(host: Host, tmp_path: Path, counter: Path) -> None:
    repo = pip_project(tmp_path, counter)
    patch = repo.make_patch({"app.py": (repo.work / "app.py").read_text() + "# reviewed\n"})

    check_reuse(host, repo, counter, "requirements.txt", patch)


class Child:
    """:mod:`tests.support.workers.setup_child` on one workspace, to be killed."""

    def __init__(self, ws: Workspace, cache: DependencyCache, log: Path) -> None:
        self.marker = f"killed-setup/{uuid.uuid4().hex}"
        self.log = log
        self.stderr = log.with_suffix(".stderr")
        with self.stderr.open("wb") as stderr:
            self.proc = self._start(ws, cache, log, stderr.fileno())

    def _start(self, ws: Workspace, cache: DependencyCache, log: Path, stderr: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.workers.setup_child",
                str(ws.path),
                str(cache.root),
                str(log),
                self.marker,
                REPOSITORY,
            ],
            cwd=PROJECT_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )

    def kill_when(self, condition: Callable[[], bool], what: str, timeout_s: float = 240) -> None:
        deadline = time.monotonic() + timeout_s
        try:
            while not condition():
                if self.proc.poll() is not None:
                    raise AssertionError(f"setup ended before {what}:\n{self.stderr.read_text()}")
                assert time.monotonic() < deadline, f"never reached {what}:\n{self.log.read_text()}"
                time.sleep(0.005)
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        finally:
            self.proc.kill()
            self.proc.wait()
            # The setup command runs in its own session and outlives the worker that started it.
            stop_owned(self.marker, grace_s=1.0)


@pytest.fixture
def workspaces(tmp_path: Path) -> WorkspaceManager:
    return WorkspaceManager(cache_dir=tmp_path / "cache", root=tmp_path / "workspaces")


def setup_again(workspaces: WorkspaceManager, repo: Repo, cache: DependencyCache, op: str, log: Path) -> Workspace:
    """A fresh workspace set up in this process (not killed), as the next attempt would."""
    ws = workspaces.rebuild(run_id=RUN, op_id=f"{RUN}:{op}", clone_url=repo.url, base_revision=repo.base)
    run_setup(
        ws.path,
        load_recipe(ws.path),
        marker=f"test/{uuid.uuid4().hex}",
        log_path=log,
        timeout_s=300,
        settings=SetupSettings(cache=cache),
        repository=REPOSITORY,
    )
    return ws


def test_a_setup_killed_during_npm_ci_leaves_no_entry_and_the_next_one_runs_setup(
    tmp_path: Path, counter: Path, workspaces: WorkspaceManager
) -> None:
    hold = tmp_path / "hold"
    hold.touch()
    # npm ci has installed, setup is still running (held), nothing is stored yet.
    repo = npm_project(tmp_path, counter, extra_setup=[f"if [ -e {hold} ]; then sleep 120; fi"])
    cache = DependencyCache(tmp_path / "deps")
    ws = workspaces.rebuild(run_id=RUN, op_id=f"{RUN}:killed", clone_url=repo.url, base_revision=repo.base)
    child = Child(ws, cache, tmp_path / "killed.log")

    child.kill_when(
        lambda: (
            (ws.path / "node_modules" / "is-number" / "package.json").exists() and "sleep 120" in child.log.read_text()
        ),
        "the held setup step",
    )
    hold.unlink()

    assert counter_lines(counter) == 0
    assert [p for p in cache.entries() if not p.name.startswith(".")] == []
    again = setup_again(workspaces, repo, cache, "again", tmp_path / "again.log")
    assert counter_lines(counter) == 1
    assert (again.path / "node_modules" / "is-number" / "package.json").is_file()
    [entry] = cache.entries()
    assert cache.read_record(entry) is not None


def test_an_entry_half_stored_by_a_killed_setup_is_never_used(
    tmp_path: Path, counter: Path, workspaces: WorkspaceManager
) -> None:
    # Enough files that storing them takes a while: the kill lands while the entry is half filled.
    many = (
        "python3 -c \"import pathlib; [pathlib.Path('node_modules/.many', f'{i % 50}', f'{i}.js').parent.mkdir("
        "parents=True, exist_ok=True) or pathlib.Path('node_modules/.many', f'{i % 50}', f'{i}.js').write_text('x')"
        ' for i in range(20000)]"'
    )
    repo = npm_project(tmp_path, counter, extra_setup=[many])
    cache = DependencyCache(tmp_path / "deps")
    ws = workspaces.rebuild(run_id=RUN, op_id=f"{RUN}:killed", clone_url=repo.url, base_revision=repo.base)
    child = Child(ws, cache, tmp_path / "killed.log")

    def half_stored() -> list[Path]:
        return [p for p in cache.entries() if TMP_MARK in p.name and (p / TREE_NAME / "node_modules").is_dir()]

    child.kill_when(lambda: bool(half_stored()), "storing the entry")

    [leftover] = cache.entries()
    assert TMP_MARK in leftover.name and not (leftover / RECORD_NAME).exists()
    assert counter_lines(counter) == 1, "setup itself had finished"
    entry = leftover.with_name(leftover.name[1:].split(TMP_MARK)[0])
    assert not entry.exists()

    again = setup_again(workspaces, repo, cache, "again", tmp_path / "again.log")
    assert counter_lines(counter) == 2, "nothing of the half-stored entry was used: setup ran again"
    assert "no entry yet" in (tmp_path / "again.log").read_text()
    assert cache.entries() == [entry], "the next builder removed what the dead one left"
    record = cache.read_record(entry)
    installed = [p for p in (again.path / "node_modules").rglob("*") if p.is_file() and not p.is_symlink()]
    assert record is not None and record.files == len(installed) > 20000
    third = setup_again(workspaces, repo, cache, "third", tmp_path / "third.log")
    assert counter_lines(counter) == 2
    assert len(list((third.path / "node_modules" / ".many").rglob("*.js"))) == 20000
    # Nothing is left for pruning to clean up either: the one entry was just used.
    plan = survey([DependencySource(cache)], older_than=timedelta(days=1), now=time.time())
    assert plan.eligible == [] and [e.ref for e in plan.kept] == [str(entry)]
    assert prune(plan).removed == []
