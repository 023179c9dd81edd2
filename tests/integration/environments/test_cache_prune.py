"""``durafix cache prune`` on mirrors and root filesystem tarballs, against real git repositories, real
workspaces borrowing from the mirrors, and real locks held the way a worker holds them. "Old" is made by
setting a stamp's mtime, never by waiting."""

from __future__ import annotations

import json
import os
import shlex
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from environments.cache_prune import DependencySource, MirrorSource, prune, survey
from environments.checks import SetupSettings, run_setup
from environments.depcache import TMP_MARK, DependencyCache
from environments.docker.images import build_lock_path, rootfs_stamp_path
from environments.files import locked
from environments.ports import free_port
from environments.spec import load_recipe
from environments.workspace import Workspace, WorkspaceManager
from pipeline.cli import run_command
from pipeline.config import DurafixConfig
from tests.support.durafix_cli import run_durafix
from tests.support.gitrepo import Repo, git, make_repo
from tests.support.projects import shell_project

DAY = 86400.0
RUN = "repair:acme/cart#40"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The state directory the command reads (``$DURAFIX_STATE_DIR``), with no Docker engine configured."""
    state_dir = tmp_path / "state"
    DurafixConfig(state_dir=state_dir).save()
    for var in ("DURAFIX_DOCKER_HOST", "DOCKER_HOST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DURAFIX_ENVIRONMENT_PROVIDER", "local")
    monkeypatch.setenv("DURAFIX_STATE_DIR", str(state_dir))
    return state_dir


def worker_workspaces(state: Path) -> WorkspaceManager:
    """The workspace manager (and mirror cache) a worker with this state directory uses."""
    return WorkspaceManager(cache_dir=state / "cache", root=state / "workspaces")


def age(path: Path, days: float) -> None:
    """Make ``path`` look last touched ``days`` ago."""
    then = time.time() - days * DAY
    os.utime(path, (then, then))


@dataclass
class Mirrors:
    """Three repositories a worker has seen: ``old`` (unused for 30 days, no workspace), ``borrowed`` (as old,
    but a live workspace stands on it) and ``fresh`` (used just now, no workspace)."""

    mgr: WorkspaceManager
    old: Repo
    borrowed: Repo
    fresh: Repo
    workspace: Workspace

    def mirror(self, repo: Repo) -> Path:
        return self.mgr.mirrors.path_for(repo.url)


@pytest.fixture
def mirrors(state: Path, tmp_path: Path) -> Iterator[Mirrors]:
    mgr = worker_workspaces(state)
    repos = [make_repo(tmp_path / name) for name in ("old", "borrowed", "fresh")]
    built = [
        mgr.rebuild(run_id=RUN, op_id=f"{RUN}:{i}", clone_url=repo.url, base_revision=repo.base)
        for i, repo in enumerate(repos)
    ]
    mgr.remove(built[0])
    mgr.remove(built[2])
    result = Mirrors(mgr, old=repos[0], borrowed=repos[1], fresh=repos[2], workspace=built[1])
    for repo in (result.old, result.borrowed):
        age(mgr.mirrors.stamp_path(result.mirror(repo)), 30)
    yield result
    mgr.cleanup_run(RUN)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = run_command(["cache", "prune", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def by_name(entries: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    return {e["name"]: e for e in entries}


def test_every_ensure_stamps_the_mirror_and_a_rebuild_refreshes_an_old_stamp(state: Path, repo: Repo) -> None:
    mgr = worker_workspaces(state)
    mgr.rebuild(run_id=RUN, op_id=f"{RUN}:a", clone_url=repo.url, base_revision=repo.base)
    stamp = mgr.mirrors.stamp_path(mgr.mirrors.path_for(repo.url))
    assert stamp.is_file()
    age(stamp, 30)
    before = time.time()

    mgr.rebuild(run_id=RUN, op_id=f"{RUN}:b", clone_url=repo.url, base_revision=repo.base)

    assert stamp.stat().st_mtime >= before - 1
    assert mgr.mirrors.last_used(mgr.mirrors.path_for(repo.url)) == (stamp.stat().st_mtime, True)
    mgr.cleanup_run(RUN)


def test_the_dry_run_lists_the_old_unused_mirror_keeps_the_others_and_removes_nothing(
    mirrors: Mirrors, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["--json"], capsys)

    assert code == 0
    document = json.loads(out)
    assert document["dry_run"] is True and document["older_than"] == "14d"
    assert document["images_checked"] is False and document["unavailable"] == []
    [eligible] = document["eligible"]
    assert eligible["kind"] == "mirror" and eligible["name"] == mirrors.old.url
    assert eligible["ref"] == str(mirrors.mirror(mirrors.old))
    assert eligible["last_used_from"] == "stamp" and eligible["reason"] == "unused for more than 14d"
    assert eligible["size_bytes"] > 0
    kept = by_name(document["kept"])
    assert set(kept) == {mirrors.borrowed.url, mirrors.fresh.url}
    assert kept[mirrors.borrowed.url]["reason"] == f"in use: borrowed by workspace {mirrors.workspace.path}"
    assert kept[mirrors.fresh.url]["reason"] == "used within 14d"

    code, out, _ = run([], capsys)

    assert code == 0
    plan, kept_table = out.split("kept:\n")
    assert "no Docker engine is configured: images were not checked" in plan
    assert "would remove (unused for more than 14d):" in plan
    header, row = plan.split("would remove (unused for more than 14d):\n")[1].strip().splitlines()[:2]
    assert header.split() == ["KIND", "NAME", "SIZE", "LAST", "USED", "WHY"]
    assert row.split()[:2] == ["mirror", mirrors.old.url] and "30d ago" in row
    assert mirrors.borrowed.url in kept_table and mirrors.fresh.url in kept_table
    assert out.rstrip().endswith("to remove: durafix cache prune --older-than 14d --yes")
    assert all(mirrors.mirror(r).is_dir() for r in (mirrors.old, mirrors.borrowed, mirrors.fresh))


def test_yes_removes_the_old_unused_mirror_and_nothing_a_workspace_borrows(
    mirrors: Mirrors, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["--yes", "--json"], capsys)

    assert code == 0
    document = json.loads(out)
    assert document["dry_run"] is False
    assert [e["name"] for e in document["removed"]] == [mirrors.old.url]
    assert document["skipped"] == [] and document["remaining"] == []
    assert not mirrors.mirror(mirrors.old).exists()
    assert mirrors.mirror(mirrors.borrowed).is_dir() and mirrors.mirror(mirrors.fresh).is_dir()
    # The workspace still reads every object it borrows.
    assert git("rev-parse", "HEAD^{tree}", cwd=mirrors.workspace.path) == mirrors.workspace.tree_sha
    git("fsck", "--connectivity-only", cwd=mirrors.workspace.path)

    # A pruned mirror is only a cache: the next rebuild clones it again.
    again = mirrors.mgr.rebuild(
        run_id=RUN, op_id=f"{RUN}:again", clone_url=mirrors.old.url, base_revision=mirrors.old.base
    )
    assert git("rev-parse", "HEAD", cwd=again.path) == mirrors.old.base

    code, out, _ = run(["--yes"], capsys)

    assert code == 0
    assert "unused for more than 14d: 0 removed, 0 skipped, 0 could not be removed" in out


def test_a_shorter_threshold_takes_the_fresh_mirror_too_but_never_the_borrowed_one(
    mirrors: Mirrors, capsys: pytest.CaptureFixture[str]
) -> None:
    age(mirrors.mgr.mirrors.stamp_path(mirrors.mirror(mirrors.fresh)), 2)
    age(mirrors.mgr.mirrors.stamp_path(mirrors.mirror(mirrors.borrowed)), 365)

    code, out, _ = run(["--older-than", "36h", "--yes"], capsys)

    assert code == 0
    assert "unused for more than 36h: 2 removed, 0 skipped, 0 could not be removed" in out
    assert not mirrors.mirror(mirrors.old).exists() and not mirrors.mirror(mirrors.fresh).exists()
    assert mirrors.mirror(mirrors.borrowed).is_dir()


def test_a_mirror_without_a_stamp_counts_from_its_directory(
    mirrors: Mirrors, capsys: pytest.CaptureFixture[str]
) -> None:
    fresh = mirrors.mirror(mirrors.fresh)
    mirrors.mgr.mirrors.stamp_path(fresh).unlink()
    age(fresh, 20)

    code, out, _ = run(["--json"], capsys)

    assert code == 0
    eligible = by_name(json.loads(out)["eligible"])
    assert eligible[mirrors.fresh.url]["last_used_from"] == "created"
    assert eligible[mirrors.fresh.url]["reason"] == "unused for more than 14d"


def test_a_mirror_being_built_on_or_fetched_is_kept_as_busy(
    mirrors: Mirrors, capsys: pytest.CaptureFixture[str]
) -> None:
    old = mirrors.mirror(mirrors.old)
    # A workspace build holds the mirror between ensure and writing its alternates file: nothing on disk
    # says it borrows the mirror yet.
    with mirrors.mgr.mirrors.borrowed(mirrors.old.url, mirrors.old.base):
        age(mirrors.mgr.mirrors.stamp_path(old), 30)
        code, out, _ = run(["--yes", "--json"], capsys)

    assert code == 0
    document = json.loads(out)
    assert document["eligible"] == [] and document["removed"] == []
    assert by_name(document["kept"])[mirrors.old.url]["reason"] == (
        "in use: being served, or a workspace is being built from it"
    )
    assert old.is_dir()

    with locked(mirrors.mgr.mirrors.build_lock(old)):
        code, out, _ = run(["--yes", "--json"], capsys)

    assert by_name(json.loads(out)["kept"])[mirrors.old.url]["reason"] == "busy: being cloned or fetched"
    assert old.is_dir()


def test_the_plan_only_narrows_a_mirror_used_or_borrowed_since_the_listing_is_skipped(mirrors: Mirrors) -> None:
    now = time.time()
    source = MirrorSource(mirrors.mgr)
    first, second = (survey([source], timedelta(days=14), now) for _ in range(2))
    assert [e.name for _, e in first.eligible] == [mirrors.old.url]
    # After the listing a worker builds a workspace on the mirror: its stamp is fresh, and it is borrowed.
    ws = mirrors.mgr.rebuild(run_id=RUN, op_id=f"{RUN}:late", clone_url=mirrors.old.url, base_revision=mirrors.old.base)

    outcome = prune(first)

    assert outcome.removed == [] and [e.reason for e in outcome.skipped] == ["used since the listing"]

    age(mirrors.mgr.mirrors.stamp_path(mirrors.mirror(mirrors.old)), 30)
    outcome = prune(second)

    assert outcome.removed == [] and [e.reason for e in outcome.skipped] == [f"in use: borrowed by workspace {ws.path}"]
    assert mirrors.mirror(mirrors.old).is_dir()


def test_rootfs_tarballs_are_pruned_by_their_stamp_without_an_engine_unless_their_build_lock_is_held(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = state / "environments" / "cache"
    cache.mkdir(parents=True)
    old, fresh, building = (cache / f"rootfs-{c * 12}.tar" for c in "abc")
    for tarball in (old, fresh, building):
        tarball.write_bytes(b"\0" * 4096)
    for tarball in (old, building):
        rootfs_stamp_path(tarball).touch()
        age(rootfs_stamp_path(tarball), 20)
    # Unstamped: its creation counts, and it was made just now.
    age(fresh, 0)

    with locked(build_lock_path(cache, f"durafix/base:{'c' * 12}")):
        code, out, _ = run(["--yes", "--json"], capsys)

    assert code == 0
    document = json.loads(out)
    assert [(e["kind"], e["name"], e["size_bytes"]) for e in document["removed"]] == [
        ("rootfs-tarball", old.name, 4096)
    ]
    kept = by_name(document["kept"])
    assert kept[fresh.name]["last_used_from"] == "created"
    assert kept[building.name]["reason"] == "busy: its base image is being built"
    assert not old.exists() and not rootfs_stamp_path(old).exists()
    assert fresh.is_file() and building.is_file() and rootfs_stamp_path(building).is_file()


def test_an_unreachable_engine_leaves_images_unchecked_prunes_the_rest_and_exits_1(
    mirrors: Mirrors, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DURAFIX_DOCKER_HOST", f"tcp://127.0.0.1:{free_port()}")

    code, out, err = run(["--yes", "--json"], capsys)

    assert code == 1
    document = json.loads(out)
    assert document["images_checked"] is False
    [unavailable] = document["unavailable"]
    assert unavailable["provider"] == "docker" and "engine not reachable" in unavailable["reason"]
    assert "images were not checked" in err
    assert [e["name"] for e in document["removed"]] == [mirrors.old.url]
    assert not mirrors.mirror(mirrors.old).exists()


def test_mirror_drops_that_one_mirror_however_fresh_and_prints_what_was_removed(
    mirrors: Mirrors, capsys: pytest.CaptureFixture[str]
) -> None:
    fresh = mirrors.mirror(mirrors.fresh)

    code, out, _ = run(["--mirror", mirrors.fresh.url], capsys)

    assert code == 0
    assert out.startswith("dry run, nothing was changed; would remove:\n")
    assert mirrors.fresh.url in out and fresh.is_dir()
    assert out.rstrip().endswith(f"to remove: durafix cache prune --mirror {mirrors.fresh.url} --yes")

    code, out, _ = run(["--mirror", mirrors.fresh.url, "--yes", "--json"], capsys)

    assert code == 0
    document = json.loads(out)
    assert document["dry_run"] is False and document["mirror"] == mirrors.fresh.url
    [removed] = document["removed"]
    assert (removed["kind"], removed["name"], removed["ref"]) == ("mirror", mirrors.fresh.url, str(fresh))
    assert removed["size_bytes"] > 0 and document["skipped"] == document["remaining"] == []
    assert not fresh.exists()
    # Only the mirror named: the old one (as unused as it gets) and the borrowed one stay.
    assert mirrors.mirror(mirrors.old).is_dir() and mirrors.mirror(mirrors.borrowed).is_dir()

    # The next rebuild clones it afresh; dropping it again prints the table and the path.
    ws = mirrors.mgr.rebuild(
        run_id=RUN, op_id=f"{RUN}:again", clone_url=mirrors.fresh.url, base_revision=mirrors.fresh.base
    )
    mirrors.mgr.remove(ws)
    code, out, _ = run(["--mirror", mirrors.fresh.url, "--yes"], capsys)

    assert code == 0
    removed_table = out.split("removed:\n")[1]
    assert removed_table.splitlines()[1].split()[:2] == ["mirror", mirrors.fresh.url]
    assert f"path: {fresh}" in out
    assert not fresh.exists()


def test_mirror_keeps_a_mirror_a_workspace_borrows_and_exits_1(
    mirrors: Mirrors, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["--mirror", mirrors.borrowed.url, "--yes", "--json"], capsys)

    assert code == 1
    document = json.loads(out)
    assert document["eligible"] == [] and document["removed"] == []
    reason = f"in use: borrowed by workspace {mirrors.workspace.path}"
    assert [e["reason"] for e in document["kept"]] == [reason]
    assert f"mirror {mirrors.borrowed.url} was not removed: {reason}" in err
    assert mirrors.mirror(mirrors.borrowed).is_dir()
    git("fsck", "--connectivity-only", cwd=mirrors.workspace.path)


def test_mirror_is_not_cut_under_a_fetch_in_progress_and_goes_once_it_is_done(
    mirrors: Mirrors, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mirror = mirrors.mirror(mirrors.fresh)
    wanted = mirrors.fresh.push_commit("NEWS", "later\n", "a commit the mirror lacks")
    # The mirror's fetch runs this upload-pack: it says it started, then waits at a gate the test opens.
    started, gate = tmp_path / "fetch-started", tmp_path / "fetch-gate"
    waiting = f"touch {shlex.quote(str(started))}; while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.05; done;"
    git("config", "remote.origin.uploadpack", f"{waiting} git-upload-pack", cwd=mirror)
    fetched: list[Path] = []
    fetch = threading.Thread(target=lambda: fetched.append(mirrors.mgr.mirrors.ensure(mirrors.fresh.url, wanted)))
    fetch.start()
    try:
        deadline = time.monotonic() + 30
        while not started.exists():
            assert time.monotonic() < deadline, "the fetch never reached the remote"
            time.sleep(0.05)

        code, out, err = run(["--mirror", mirrors.fresh.url, "--yes", "--json"], capsys)

        assert code == 1
        document = json.loads(out)
        assert document["removed"] == [] and [e["reason"] for e in document["kept"]] == [
            "busy: being cloned or fetched"
        ]
        assert "was not removed: busy: being cloned or fetched" in err
        assert mirror.is_dir()
    finally:
        gate.touch()
        fetch.join(timeout=60)
    assert fetched == [mirror]
    git("cat-file", "-e", f"{wanted}^{{commit}}", cwd=mirror)

    code, out, _ = run(["--mirror", mirrors.fresh.url, "--yes", "--json"], capsys)

    assert code == 0
    assert [e["ref"] for e in json.loads(out)["removed"]] == [str(mirror)]
    assert not mirror.exists()


def test_mirror_of_an_unknown_url_fails_naming_the_cached_mirrors(
    mirrors: Mirrors, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unknown = (tmp_path / "never-seen.git").as_uri()

    code, out, err = run(["--mirror", unknown, "--yes", "--json"], capsys)

    assert code == 1
    document = json.loads(out)
    assert document["mirror"] == unknown and "removed" not in document
    assert sorted(document["known"]) == sorted(r.url for r in (mirrors.old, mirrors.borrowed, mirrors.fresh))
    assert f"no mirror of {unknown} is cached (mirrors cached: " in err and "nothing was removed" in err
    assert all(mirrors.mirror(r).is_dir() for r in (mirrors.old, mirrors.borrowed, mirrors.fresh))


def test_mirror_with_no_mirror_cached_at_all_says_none(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["--mirror", "https://example.com/acme/cart.git"], capsys)

    assert code == 1
    assert "no mirror of https://example.com/acme/cart.git is cached (mirrors cached: none)" in err


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["prune", "--older-than", "5m"],
        ["prune", "--older-than", "7x"],
        ["prune", "--older-than", "-1d"],
        ["prune", "--older-than", "30d", "--mirror", "https://example.com/acme/cart.git"],
    ],
)
def test_usage_errors_exit_2_before_anything_is_read(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        run_command(["cache", *argv])

    assert exited.value.code == 2


def test_the_durafix_command_prunes_the_caches_of_the_state_dir_it_is_given(mirrors: Mirrors, state: Path) -> None:
    proc = run_durafix(state, "cache", "prune", "--older-than", "7d", "--yes", "--json")

    assert proc.returncode == 0, proc.stderr
    assert [e["name"] for e in json.loads(proc.stdout)["removed"]] == [mirrors.old.url]
    assert not mirrors.mirror(mirrors.old).exists()


@dataclass
class Dependencies:
    """Dependency cache entries of the worker: ``old`` (restored 30 days ago), ``fresh`` (built just now), ``reading``
    (as old, being restored right now), and leftovers of two unfinished builds, one whose builder died and one whose
    builder still runs."""

    cache: DependencyCache
    entries: dict[str, Path]
    dead_build: Path
    live_build: Path


@pytest.fixture
def dependencies(state: Path, tmp_path: Path) -> Iterator[Dependencies]:
    mgr = worker_workspaces(state)
    cache = DependencyCache(state / "cache" / "deps")
    repo = shell_project(tmp_path, tmp_path / "counter")
    entries = {}
    for repository in ("acme/old", "acme/fresh", "acme/reading"):
        ws = mgr.rebuild(run_id=RUN, op_id=f"{RUN}:{repository}", clone_url=repo.url, base_revision=repo.base)
        outcome = run_setup(
            ws.path,
            load_recipe(ws.path),
            marker=f"test/{repository}",
            log_path=tmp_path / "setup.log",
            timeout_s=60,
            settings=SetupSettings(cache=cache),
            repository=repository,
        )
        assert outcome.stored is not None
        [entries[repository]] = [
            p for p in cache.entries() if (r := cache.read_record(p)) and r.repository == repository
        ]
        mgr.remove(ws)
    for repository in ("acme/old", "acme/reading"):
        age(cache.stamp_path(entries[repository]), 30)
    old = entries["acme/old"]
    dead_build = old.with_name(f".{old.name}{TMP_MARK}dead")
    live_build = old.with_name(f".{old.name}{TMP_MARK}live")
    for leftover in (dead_build, live_build):
        (leftover / "tree" / "node_modules").mkdir(parents=True)
        age(leftover, 30)
    yield Dependencies(cache, entries, dead_build, live_build)
    mgr.cleanup_run(RUN)


def test_old_dependency_entries_and_dead_builds_are_pruned_never_one_being_restored_or_built(
    dependencies: Dependencies, capsys: pytest.CaptureFixture[str]
) -> None:
    cache, entries = dependencies.cache, dependencies.entries
    reading = entries["acme/reading"]
    with (
        locked(cache.use_lock(reading), shared=True),
        locked(dependencies.live_build.with_name(dependencies.live_build.name + ".lock")),
    ):
        code, out, _ = run(["--json"], capsys)
        assert code == 0
        dry = json.loads(out)
        code, out, _ = run(["--yes", "--json"], capsys)

    assert code == 0
    eligible = {e["ref"]: e for e in dry["eligible"] if e["kind"] == "dependencies"}
    assert set(eligible) == {str(entries["acme/old"]), str(dependencies.dead_build)}
    assert eligible[str(entries["acme/old"])]["name"].startswith("acme/old node_modules (package-lock.json) ")
    assert "unfinished build of" in eligible[str(dependencies.dead_build)]["name"]
    kept = {e["ref"]: e["reason"] for e in dry["kept"] if e["kind"] == "dependencies"}
    assert kept == {
        str(entries["acme/fresh"]): "used within 14d",
        str(reading): "in use: being restored into a workspace",
        str(dependencies.live_build): "busy: being built",
    }
    document = json.loads(out)
    assert {e["ref"] for e in document["removed"]} == set(eligible)
    assert not entries["acme/old"].exists() and not dependencies.dead_build.exists()
    assert not dependencies.dead_build.with_name(dependencies.dead_build.name + ".lock").exists()
    assert entries["acme/fresh"].is_dir() and reading.is_dir() and dependencies.live_build.is_dir()
    assert cache.read_record(reading) is not None


def test_a_dependency_entry_built_again_since_the_listing_is_skipped(dependencies: Dependencies) -> None:
    source = DependencySource(dependencies.cache)
    plan = survey([source], timedelta(days=14), time.time())
    old = dependencies.entries["acme/old"]
    assert str(old) in {e.ref for _, e in plan.eligible}
    # A restore after the listing stamps the entry.
    dependencies.cache.stamp_path(old).touch()

    outcome = prune(plan)

    assert [e.ref for e in outcome.skipped] == [str(old)] and outcome.skipped[0].reason == "used since the listing"
    assert old.is_dir()
