"""The dependency cache on real git workspaces, with a setup that fakes an install in shell (no network): what is
keyed, stored and restored, what is never used, and two builders of one key. The same with real ``npm ci`` and
``pip install`` is in ``test_depcache_installs.py``."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import uuid
from pathlib import Path

import pytest

from environments.checks import SetupOutcome, SetupSettings, run_setup, run_tests
from environments.depcache import RECORD_NAME, TMP_MARK, TREE_NAME, BuildRecord, CacheKey, DependencyCache
from environments.files import locked
from environments.spec import cached_paths, load_recipe, lock_files
from environments.workspace import Workspace, WorkspaceManager
from tests.support.gitrepo import Repo
from tests.support.projects import SHELL_SETUP, counter_lines, shell_project, write_project

RUN = "repair:acme/deps#1"
REPOSITORY = "acme/deps"


class Setups:
    """Workspaces of one repository rebuilt by a real :class:`WorkspaceManager`, set up through one cache."""

    def __init__(self, tmp: Path, repo: Repo, cache: DependencyCache) -> None:
        self.tmp = tmp
        self.repo = repo
        self.cache = cache
        self.mgr = WorkspaceManager(cache_dir=tmp / "cache", root=tmp / "workspaces")
        self.settings = SetupSettings(cache=cache)

    def workspace(self, op: str, patch: str | None = None) -> Workspace:
        return self.mgr.rebuild(
            run_id=RUN, op_id=f"{RUN}:{op}", clone_url=self.repo.url, base_revision=self.repo.base, patch=patch
        )

    def setup(self, ws: Workspace, progress: list[str] | None = None) -> SetupOutcome:
        heard = progress if progress is not None else []
        return run_setup(
            ws.path,
            load_recipe(ws.path),
            marker=f"test/{uuid.uuid4().hex}",
            log_path=self.log(ws),
            timeout_s=60,
            progress=heard.append,
            settings=self.settings,
            repository=REPOSITORY,
        )

    def log(self, ws: Workspace) -> Path:
        return self.tmp / "logs" / f"{ws.path.name}.log"

    def key(self, ws: Workspace) -> CacheKey:
        key = self.cache.key_for(ws.path, load_recipe(ws.path), repository=REPOSITORY, provider="local")
        assert isinstance(key, CacheKey), key
        return key


@pytest.fixture
def counter(tmp_path: Path) -> Path:
    return tmp_path / "setup-counter"


@pytest.fixture
def setups(tmp_path: Path, counter: Path) -> Setups:
    return Setups(tmp_path, shell_project(tmp_path, counter), DependencyCache(tmp_path / "deps"))


def test_a_second_workspace_gets_the_stored_setup_instead_of_running_it(
    setups: Setups, counter: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="environments.checks")
    first = setups.workspace("a")
    built = setups.setup(first)

    assert built.ran and built.stored is not None and built.restored is None
    record = built.stored
    lock = (first.path / "package-lock.json").read_bytes()
    assert record.repository == REPOSITORY and record.provider == "local"
    assert record.lock_files == {"package-lock.json": hashlib.sha256(lock).hexdigest()}
    assert record.setup == SHELL_SETUP and record.paths == ["node_modules"]
    assert record.created_at and record.files == 2 and record.method == "copy"
    entry = setups.cache.entry_path(setups.key(first))
    assert BuildRecord.model_validate_json((entry / RECORD_NAME).read_text()) == record
    assert counter_lines(counter) == 1
    # The workspace setup ran in is gone before the next one is restored: nothing may still point into it.
    setups.mgr.remove(first)

    second = setups.workspace("b")
    heard: list[str] = []
    reused = setups.setup(second, heard)

    assert not reused.ran and reused.restored == record and reused.stored is None
    assert counter_lines(counter) == 1
    assert heard == ["setup: restoring node_modules from the dependency cache"]
    assert "# dependency cache: restored entry" in setups.log(second).read_text()
    copied = second.path / "node_modules" / "dep" / "lock-copy"
    assert copied.read_bytes() == lock
    # A file of its own, never the entry's (a hard link would let an in-place write reach the entry).
    assert copied.stat().st_ino != (entry / TREE_NAME / "node_modules" / "dep" / "lock-copy").stat().st_ino
    assert copied.stat().st_nlink == 1
    # What named the building workspace names this one: the script (a new file, not the entry's) and the link.
    script = second.path / "node_modules" / "dep" / "bin" / "dep"
    assert f"built in {os.path.realpath(second.path)}\n" in script.read_text()
    assert os.access(script, os.X_OK)
    assert str(first.path) in (entry / TREE_NAME / "node_modules" / "dep" / "bin" / "dep").read_text()
    link = second.path / "node_modules" / ".bin" / "dep"
    assert os.readlink(link) == f"{os.path.realpath(second.path)}/node_modules/dep/bin/dep"
    result = run_tests(second.path, load_recipe(second.path), 30, log_path=setups.tmp / "tests.log")
    assert result.passed, result.output_tail
    assert not list(second.path.glob(".durafix-restore-*"))
    # The worker's log has a line for each setup: what an operator (and the real-project tests) count.
    said = [r.getMessage() for r in caplog.records if r.name == "environments.checks"]
    assert [m.split(" (dependency cache: ")[0] for m in said] == [
        "setup of the base revision's tree: ran the recipe's setup commands",
        "setup of the base revision's tree: restored the dependency cache's entry",
    ], said


def test_a_patch_that_changes_a_lock_file_gets_an_entry_of_its_own(setups: Setups, counter: Path) -> None:
    base = setups.workspace("a")
    setups.setup(base)
    patch = setups.repo.make_patch({"package-lock.json": '{"lockfileVersion": 3, "packages": {"x": {}}}\n'})

    candidate = setups.workspace("b", patch)
    outcome = setups.setup(candidate)

    assert outcome.ran and outcome.stored is not None
    assert counter_lines(counter) == 2
    assert setups.key(candidate).key != setups.key(base).key
    assert len(setups.cache.entries()) == 2


def test_the_key_follows_setup_env_and_cached_paths_not_the_workspace(setups: Setups) -> None:
    ws = setups.workspace("a")
    recipe = load_recipe(ws.path)

    def key(**changes: object) -> str:
        found = setups.cache.key_for(
            ws.path, recipe.model_copy(update=changes), repository=REPOSITORY, provider="local"
        )
        assert isinstance(found, CacheKey), found
        return found.key

    same = key()
    assert same == key()
    assert key(setup=[*recipe.setup, "true"]) != same
    assert key(env={"SETUP_COUNTER": "/elsewhere"}) != same
    assert key(cache=["node_modules", "vendor"]) != same
    other = setups.workspace("b")
    assert setups.cache.key_for(other.path, recipe, repository=REPOSITORY, provider="local") == setups.cache.key_for(
        ws.path, recipe, repository=REPOSITORY, provider="local"
    )
    assert setups.cache.key_for(ws.path, recipe, repository="acme/other", provider="local") != same
    docker = setups.cache.key_for(ws.path, recipe, repository=REPOSITORY, provider="docker")
    assert isinstance(docker, CacheKey) and docker.key != same


def test_recognised_lock_files_and_their_default_cached_paths(tmp_path: Path) -> None:
    root = write_project(
        tmp_path / "p",
        {
            "yarn.lock": "",
            "requirements.txt": "",
            "requirements-dev.txt": "",
            "poetry.lock": "",
            "README.md": "",
            "web/package-lock.json": "{}",
        },
        {"start": "s", "test": "t"},
    )
    recipe = load_recipe(root)
    locks = lock_files(root, recipe)
    assert locks == ["poetry.lock", "requirements-dev.txt", "requirements.txt", "yarn.lock"]
    assert cached_paths(recipe, locks) == [".venv", "node_modules"]
    declared = recipe.model_copy(update={"lock_files": ["web/package-lock.json", "deps.lock"]})
    assert lock_files(root, declared) == ["deps.lock", "web/package-lock.json"]
    assert cached_paths(declared, lock_files(root, declared)) == ["web/node_modules"]
    assert cached_paths(recipe.model_copy(update={"cache": ["vendor/"]}), locks) == ["vendor"]
    assert cached_paths(recipe.model_copy(update={"cache": []}), locks) == []


@pytest.mark.parametrize(
    ("recipe", "lock", "reason"),
    [
        ({"cache": []}, True, "not cached: the recipe declares cache: []"),
        ({}, False, "not cached: no lock file pins what setup installs"),
        (
            {"setup": ['echo x >> "$SETUP_COUNTER"']},
            True,
            "not cached: setup did not create node_modules; declare what it creates in `cache`",
        ),
        (
            {"setup": [*SHELL_SETUP, "echo generated > generated.txt"]},
            True,
            "not cached: setup also changed generated.txt, which the cache would not restore",
        ),
        (
            {"setup": [*SHELL_SETUP, "echo more >> README.md"]},
            True,
            "not cached: setup also changed README.md, which the cache would not restore",
        ),
        ({"cache": ["README.md"]}, True, "not cached: README.md already exists in the workspace"),
    ],
)
def test_setup_runs_every_time_when_its_result_cannot_be_cached(
    tmp_path: Path, counter: Path, recipe: dict[str, object], lock: bool, reason: str
) -> None:
    setups = Setups(tmp_path, shell_project(tmp_path, counter, lock=lock, **recipe), DependencyCache(tmp_path / "deps"))

    workspaces = [setups.workspace(op) for op in ("a", "b")]
    outcomes = [setups.setup(ws) for ws in workspaces]

    assert [(o.ran, o.cache) for o in outcomes] == [(True, reason), (True, reason)]
    assert counter_lines(counter) == 2
    assert all(f"# dependency cache: {reason}" in setups.log(ws).read_text() for ws in workspaces)
    assert not setups.cache.entries()


@pytest.mark.parametrize("damage", ["no record", "torn record", "record of another key", "record of another format"])
def test_an_entry_without_a_complete_record_is_never_used(setups: Setups, counter: Path, damage: str) -> None:
    first = setups.workspace("a")
    setups.setup(first)
    entry = setups.cache.entry_path(setups.key(first))
    record_path = entry / RECORD_NAME
    data = json.loads(record_path.read_text())
    if damage == "no record":
        record_path.unlink()
    elif damage == "torn record":
        record_path.write_text(record_path.read_text()[:40])
    elif damage == "record of another key":
        record_path.write_text(json.dumps({**data, "setup": ["npm install"]}))
    else:
        record_path.write_text(json.dumps({**data, "format": 1}))  # format 1 entries were hard-linked

    second = setups.workspace("b")
    outcome = setups.setup(second)

    assert outcome.ran and outcome.restored is None
    assert counter_lines(counter) == 2
    assert "has no complete build record" in setups.log(second).read_text()
    # The builder, holding the key's lock, replaced the damaged entry with a complete one.
    assert outcome.stored is not None
    assert setups.cache.read_record(entry, setups.key(second)) == outcome.stored
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".")]
    assert not setups.setup(setups.workspace("c")).ran
    assert counter_lines(counter) == 2


def test_an_in_place_write_in_a_restored_workspace_reaches_neither_the_entry_nor_the_next_workspace(
    setups: Setups, counter: Path
) -> None:
    setups.setup(setups.workspace("a"))
    restored = setups.workspace("b")
    assert setups.setup(restored).restored is not None
    # A tool rewriting a file in place (not aside and renamed).
    with (restored.path / "node_modules" / "dep" / "lock-copy").open("a") as fh:
        fh.write("scribbled\n")

    third = setups.workspace("c")
    outcome = setups.setup(third)

    assert not outcome.ran and outcome.restored is not None
    assert "scribbled" not in (third.path / "node_modules" / "dep" / "lock-copy").read_text()
    assert counter_lines(counter) == 1


def test_an_entry_that_changed_since_it_was_built_is_not_used_and_is_rebuilt(setups: Setups, counter: Path) -> None:
    first = setups.workspace("a")
    setups.setup(first)
    entry = setups.cache.entry_path(setups.key(first)) / TREE_NAME
    with (entry / "node_modules" / "dep" / "lock-copy").open("a") as fh:
        fh.write("scribbled\n")

    second = setups.workspace("b")
    outcome = setups.setup(second)

    assert outcome.ran and outcome.stored is not None
    assert "changed since it was built; not used" in setups.log(second).read_text()
    assert "scribbled" not in (second.path / "node_modules" / "dep" / "lock-copy").read_text()
    assert counter_lines(counter) == 2
    third = setups.workspace("c")
    assert setups.setup(third).restored == outcome.stored
    assert "scribbled" not in (third.path / "node_modules" / "dep" / "lock-copy").read_text()


def test_copy_mode_gives_each_workspace_its_own_files(tmp_path: Path, counter: Path) -> None:
    setups = Setups(tmp_path, shell_project(tmp_path, counter), DependencyCache(tmp_path / "deps", restore="copy"))
    first = setups.workspace("a")
    assert setups.setup(first).stored is not None
    second = setups.workspace("b")
    outcome = setups.setup(second)

    assert outcome.restored is not None and outcome.restored.method == "copy"
    name = Path("node_modules") / "dep" / "lock-copy"
    entry = setups.cache.entry_path(setups.key(second)) / TREE_NAME
    inodes = {(ws / name).stat().st_ino for ws in (first.path, second.path, entry)}
    assert len(inodes) == 3
    assert "by copy in" in setups.log(second).read_text()


def test_two_builders_of_one_key_run_setup_once(tmp_path: Path, counter: Path) -> None:
    # Slow enough that the second builder arrives while the first still runs setup.
    repo = shell_project(tmp_path, counter, setup=["sleep 1", *SHELL_SETUP])
    setups = Setups(tmp_path, repo, DependencyCache(tmp_path / "deps", poll_s=0.05))
    workspaces = [setups.workspace(op) for op in ("a", "b")]
    outcomes: dict[int, SetupOutcome] = {}
    heard: dict[int, list[str]] = {0: [], 1: []}

    def build(i: int) -> None:
        outcomes[i] = setups.setup(workspaces[i], heard[i])

    threads = [threading.Thread(target=build, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert counter_lines(counter) == 1
    assert sorted(o.ran for o in outcomes.values()) == [False, True]
    waiter = next(i for i, o in outcomes.items() if not o.ran)
    assert any(text.startswith("setup: waiting for another build") for text in heard[waiter])
    for ws in workspaces:
        assert (ws.path / "node_modules" / "dep" / "lock-copy").is_file()


def test_a_builder_that_gives_up_waiting_builds_aside_and_losing_the_rename_is_harmless(
    tmp_path: Path, counter: Path
) -> None:
    setups = Setups(tmp_path, shell_project(tmp_path, counter), DependencyCache(tmp_path / "deps", wait_s=0.3))
    first = setups.workspace("a")
    key = setups.key(first)
    entry = setups.cache.entry_path(key)
    # A builder that hangs holding the lock: this one waits wait_s, then builds without the lock.
    with locked(setups.cache.build_lock(entry)):
        outcome = setups.setup(first)
        assert outcome.ran and outcome.stored is not None

        second = setups.workspace("b")
        before = setups.cache.checkout_state(second.path)
        (second.path / "node_modules").mkdir()
        (second.path / "node_modules" / "other").write_text("built by the loser\n")
        lost = setups.cache.store(key, second.path, before, exclusive=False)

    assert lost == outcome.stored
    assert not (entry / TREE_NAME / "node_modules" / "other").exists()
    assert [p.name for p in entry.parent.iterdir() if p.name.startswith(".")] == []
    assert counter_lines(counter) == 1


def test_leftovers_of_dead_builders_are_removed_by_the_next_build_and_a_live_ones_is_kept(setups: Setups) -> None:
    first = setups.workspace("a")
    entry = setups.cache.entry_path(setups.key(first))
    entry.parent.mkdir(parents=True)
    dead = entry.with_name(f".{entry.name}{TMP_MARK}dead")
    (dead / TREE_NAME / "node_modules").mkdir(parents=True)
    live = entry.with_name(f".{entry.name}{TMP_MARK}live")
    (live / TREE_NAME).mkdir(parents=True)

    with locked(live.with_name(live.name + ".lock")):
        outcome = setups.setup(first)

    assert outcome.stored is not None
    assert not dead.exists() and live.is_dir()
    assert setups.cache.read_record(entry) == outcome.stored


def test_a_restore_failing_the_recipes_setup_check_is_discarded_and_setup_runs(tmp_path: Path, counter: Path) -> None:
    # The check fails in a workspace holding `broken` (untracked, made before setup), restored or set up anew.
    repo = shell_project(tmp_path, counter, setup_check="test -x node_modules/.bin/dep && test ! -e broken")
    setups = Setups(tmp_path, repo, DependencyCache(tmp_path / "deps"))
    first = setups.workspace("a")
    stored = setups.setup(first).stored
    assert stored is not None and counter_lines(counter) == 1
    entry = setups.cache.entry_path(setups.key(first))

    second = setups.workspace("b")
    (second.path / "broken").touch()
    heard: list[str] = []
    outcome = setups.setup(second, heard)

    assert outcome.ran and outcome.restored is None and counter_lines(counter) == 2
    check = "setup: checking the environment: test -x node_modules/.bin/dep && test ! -e broken"
    assert heard[:2] == ["setup: restoring node_modules from the dependency cache", check]
    assert heard.count(check) == 2, "after the restore, and after setup itself"
    log = setups.log(second).read_text()
    assert f"# dependency cache: miss (entry {stored.key[:12]} failed the recipe's setup_check (exited 1); " in log
    assert "discarded it); running setup" in log
    # What setup made there fails the check too: not stored, and the rejected entry is gone.
    assert outcome.stored is None
    assert outcome.cache == "not cached: the recipe's setup_check failed after setup itself (exited 1)"
    assert not entry.exists()
    assert (second.path / "node_modules" / ".bin" / "dep").exists()

    third = setups.workspace("c")
    rebuilt = setups.setup(third)
    assert rebuilt.ran and rebuilt.stored is not None and counter_lines(counter) == 3
    assert "# dependency cache: miss (no entry yet); running setup" in setups.log(third).read_text()
    fourth = setups.workspace("d")
    again = setups.setup(fourth)
    assert not again.ran and again.restored == rebuilt.stored and counter_lines(counter) == 3


def test_a_binary_file_naming_the_workspace_path_is_never_stored(tmp_path: Path, counter: Path) -> None:
    native = "printf 'ELF\\000built in %s\\000' \"$(pwd -P)\" > node_modules/dep/native.node"
    repo = shell_project(tmp_path, counter, setup=[*SHELL_SETUP, native])
    setups = Setups(tmp_path, repo, DependencyCache(tmp_path / "deps"))

    first = setups.setup(setups.workspace("a"))

    assert first.ran and first.stored is None
    assert first.cache == (
        "not cached: node_modules/dep/native.node is a binary file naming the workspace path, which cannot be relocated"
    )
    assert [p for p in setups.cache.entries() if not p.name.startswith(".")] == []


def test_a_relocated_file_changed_in_the_entry_is_refused_even_with_its_size_and_mtime_kept(
    setups: Setups, counter: Path
) -> None:
    first = setups.workspace("a")
    record = setups.setup(first).stored
    assert record is not None and "node_modules/dep/bin/dep" in record.relocate
    stored = setups.cache.entry_path(setups.key(first)) / TREE_NAME / "node_modules" / "dep" / "bin" / "dep"
    st = stored.stat()
    text = stored.read_text()
    stored.write_text(text.replace("echo dep", "echo own"))
    os.utime(stored, ns=(st.st_atime_ns, st.st_mtime_ns))

    second = setups.workspace("b")
    outcome = setups.setup(second)

    assert outcome.ran and counter_lines(counter) == 2
    log = setups.log(second).read_text()
    assert f"entry {setups.cache.entry_path(setups.key(first)).name} changed since it was built" in log
    assert "(node_modules/dep/bin/dep); not used" in log
    assert "echo own" not in (second.path / "node_modules" / "dep" / "bin" / "dep").read_text()
