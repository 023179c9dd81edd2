"""Which temporary roots a worker's sweep removes (:mod:`pipeline.worker.tmp_root`): only a dead owner's, never
a live process's, another PID namespace's, a link's or a directory not named as a root."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from environments.processes import start_time
from pipeline.worker import tmp_root


def named(base: Path, namespace: int, pid: int, started: int) -> Path:
    path = base / f"{tmp_root.PREFIX}{namespace}-{pid}-{started}-abcd1234"
    path.mkdir()
    (path / "durafix-chromium-x").mkdir()
    (path / "durafix-chromium-x" / "file").write_text("left")
    return path


def test_sweep_removes_only_dead_owners_roots_and_follows_no_link(tmp_path: Path) -> None:
    me, ns = os.getpid(), tmp_root.pid_namespace()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_text("not the root's")
    base = tmp_path / "base"
    base.mkdir()
    live = named(base, ns, me, start_time(me))
    # The same pid with another start time: a process that used the pid before this one, dead.
    dead = named(base, ns, me, start_time(me) + 1)
    (dead / "link").symlink_to(outside)
    foreign = named(base, ns + 1, me, start_time(me) + 1)
    link = base / f"{tmp_root.PREFIX}{ns}-{me}-{start_time(me) + 2}-abcd1234"
    link.symlink_to(outside)
    other = base / "durafix-chromium-y"
    other.mkdir()

    assert tmp_root.sweep(base) == [dead]
    assert sorted(p.name for p in base.iterdir()) == sorted(p.name for p in (live, foreign, link, other))
    assert (outside / "kept").read_text() == "not the root's"
    assert tmp_root.remove_of(base, me, start_time(me)) == []  # running: never removed by another
    assert live.is_dir()


def test_start_makes_a_traversable_root_adopted_by_tempfile_and_remove_restores_the_base(tmp_path: Path) -> None:
    before = tempfile.tempdir
    try:
        root = tmp_root.start(tmp_path)
        assert root.path.parent == tmp_path and root.owner_running()
        assert root.path.stat().st_mode & 0o777 == 0o711
        made = Path(tempfile.mkdtemp(prefix="durafix-git-home-"))
        assert made.parent == root.path
        root.remove()
        assert list(tmp_path.iterdir()) == [] and tempfile.gettempdir() == str(tmp_path)
    finally:
        tempfile.tempdir = before
