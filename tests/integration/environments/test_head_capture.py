"""A pushed head read as its change from the base, and a change rebuilt on a moved base, on real git."""

from __future__ import annotations

from pathlib import Path

from environments.head_capture import capture_head, rebuild_on_base
from tests.support.gitrepo import git


def commit(work: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (work / name).write_text(text)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", message, cwd=work)
    return git("rev-parse", "HEAD", cwd=work)


def repo(tmp_path: Path) -> tuple[Path, str]:
    work = tmp_path / "work"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    base = commit(work, {"cart.py": "a\nb\nc\nd\ne\nf\ng\n", "notes.md": "one\n"}, "base")
    return work, base


def test_a_captured_head_applied_on_the_base_is_the_heads_tree(tmp_path: Path) -> None:
    work, base = repo(tmp_path)
    commit(work, {"cart.py": "a\nB\nc\nd\ne\nf\ng\n"}, "the fix")
    head = commit(work, {"notes.md": "one\ntwo\n"}, "a maintainer's push")
    captured = capture_head(work, base, head)
    assert captured.message == "a maintainer's push" and captured.descends_from_base
    git("checkout", "-q", "--detach", base, cwd=work)
    git("apply", "--index", "-", cwd=work, stdin=captured.patch)
    assert git("write-tree", cwd=work) == captured.tree == git("rev-parse", f"{head}^{{tree}}", cwd=work)


def test_a_change_rebuilt_on_a_moved_base_is_the_same_change_or_a_conflict(tmp_path: Path) -> None:
    work, base = repo(tmp_path)
    git("checkout", "-q", "-b", "fix", cwd=work)
    head = commit(work, {"cart.py": "a\nB\nc\nd\ne\nf\ng\n"}, "the fix")
    git("checkout", "-q", "main", cwd=work)
    elsewhere = commit(work, {"cart.py": "a\nb\nc\nd\ne\nf\nG\n"}, "another change on main")
    rebuilt = rebuild_on_base(work, base, head, elsewhere)
    assert not rebuilt.conflict and rebuilt.same_change and rebuilt.tree is not None
    assert git("show", f"{rebuilt.tree}:cart.py", cwd=work) == "a\nB\nc\nd\ne\nf\nG"

    clash = commit(work, {"cart.py": "a\nX\nc\nd\ne\nf\nG\n"}, "the same line changed on main")
    conflicted = rebuild_on_base(work, base, head, clash)
    assert conflicted.conflict and "cart.py" in conflicted.detail
