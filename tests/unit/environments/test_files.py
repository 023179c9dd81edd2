from __future__ import annotations

from pathlib import Path

from environments.files import locked, remove_abandoned, remove_tree


def test_remove_abandoned_takes_the_dead_ones_and_their_locks_and_leaves_the_one_in_use(tmp_path: Path) -> None:
    dead = tmp_path / ".work-dead"
    dead.mkdir()
    (dead / "file").write_text("left by a process that died")
    (tmp_path / ".work-dead.lock").touch()
    unlocked = tmp_path / ".work-nolock"  # its lock file already gone: nobody can hold it
    unlocked.mkdir()
    live = tmp_path / ".work-live"
    live.mkdir()
    stray = tmp_path / ".work-file"  # not a directory: not one of the work directories
    stray.write_text("x")
    with locked(tmp_path / ".work-live.lock"):
        remove_abandoned(tmp_path.glob(".work-*"), remove_tree)
        assert live.is_dir() and (tmp_path / ".work-live.lock").exists()
    assert not dead.exists() and not (tmp_path / ".work-dead.lock").exists()
    assert not unlocked.exists() and not (tmp_path / ".work-nolock.lock").exists()
    assert stray.read_text() == "x"
