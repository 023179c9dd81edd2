"""The model's file tools stay inside the workspace and follow their edit rules, on a real file system."""

from __future__ import annotations

from pathlib import Path

import pytest

from browser.patterns import compile_pattern
from repair import workspace_tools
from repair.workspace_tools import ToolRefused, WorkspaceTools


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "secret.txt").write_text("do not read\n")
    return secret


@pytest.fixture
def ws(tmp_path: Path, outside: Path) -> WorkspaceTools:
    root = tmp_path / "ws"
    (root / "pkg").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    (root / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (root / "README.md").write_text("hello\nhello again\n")
    (root / "link-out").symlink_to(outside)
    (root / "secret-link.txt").symlink_to(outside / "secret.txt")
    (root / "link-in.py").symlink_to(root / "pkg" / "mod.py")
    return WorkspaceTools(root)


def test_list_files_is_recursive_and_leaves_out_git(ws: WorkspaceTools) -> None:
    listed = ws.list_files(".").splitlines()
    assert "pkg/mod.py" in listed and "README.md" in listed
    assert not [p for p in listed if p.startswith(".git")]
    assert ws.list_files("pkg") == "pkg/mod.py"


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/etc/passwd", "absolute"),
        ("../outside/secret.txt", "'..'"),
        ("pkg/../../outside/secret.txt", "'..'"),
        (".git/config", ".git"),
        (".GIT/config", ".git"),
        ("link-out/secret.txt", "outside the repository"),
        ("secret-link.txt", "outside the repository"),
    ],
)
def test_paths_leaving_the_workspace_are_refused_for_reads(ws: WorkspaceTools, path: str, reason: str) -> None:
    with pytest.raises(ToolRefused, match=reason):
        ws.read_file(path)


@pytest.mark.parametrize("path", ["../evil.txt", "/tmp/evil.txt", ".git/hooks/pre-commit", "link-out/evil.txt"])
def test_writes_outside_the_workspace_are_refused_and_write_nothing(
    ws: WorkspaceTools, outside: Path, path: str
) -> None:
    with pytest.raises(ToolRefused):
        ws.write_file(path, "evil")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert not (ws.root / ".git" / "hooks").exists()


def test_overwriting_through_a_symlink_to_outside_is_refused(ws: WorkspaceTools, outside: Path) -> None:
    with pytest.raises(ToolRefused, match="outside"):
        ws.replace_in_file("secret-link.txt", "do not", "did")
    assert (outside / "secret.txt").read_text() == "do not read\n"


def test_symlink_inside_the_workspace_is_followed(ws: WorkspaceTools) -> None:
    assert ws.read_file("link-in.py") == "def f():\n    return 1\n"


def test_replace_needs_exactly_one_match(ws: WorkspaceTools) -> None:
    with pytest.raises(ToolRefused, match="occurs 2 times"):
        ws.replace_in_file("README.md", "hello", "bye")
    with pytest.raises(ToolRefused, match="occurs 0 times"):
        ws.replace_in_file("README.md", "absent", "bye")
    assert ws.read_file("README.md") == "hello\nhello again\n"
    ws.replace_in_file("README.md", "hello again", "bye")
    assert ws.read_file("README.md") == "hello\nbye\n"


def test_write_file_creates_parent_directories_but_not_over_a_directory(ws: WorkspaceTools) -> None:
    assert ws.write_file("tests/new/test_x.py", "x = 1\n") == "wrote 6 bytes to tests/new/test_x.py"
    assert (ws.root / "tests" / "new" / "test_x.py").read_text() == "x = 1\n"
    with pytest.raises(ToolRefused, match="directory"):
        ws.write_file("pkg", "x")


def test_search_reports_path_and_line_and_skips_git_and_outside_links(ws: WorkspaceTools) -> None:
    assert ws.search(r"return \d") == "pkg/mod.py:2:     return 1"
    assert ws.search("core") == "(no matches)"
    assert ws.search("do not read") == "(no matches)"
    with pytest.raises(ToolRefused, match="regular expression"):
        ws.search("(unclosed")


def test_a_catastrophic_search_pattern_from_the_model_is_searched_in_bounded_work(
    ws: WorkspaceTools, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python's backtracking engine never finishes this pattern on a 5,000-character line; the tool hands it to
    RE2, whose work is its program's size times the characters searched, each line searched once."""
    (ws.root / "long.txt").write_text("x" * 5000 + "\n")
    compiled = compile_pattern("(x+x+)+y")
    assert type(compiled).__module__ == "re2" and compiled.programsize <= 16
    searched: list[str] = []

    class Counting:
        def search(self, line: str) -> object:
            searched.append(line)
            return compiled.search(line)

    with pytest.raises(ToolRefused, match="backreference"):
        ws.search(r"(a)\1")
    monkeypatch.setattr(workspace_tools, "compile_pattern", lambda _pattern: Counting())
    assert ws.search("(x+x+)+y") == "(no matches)"
    assert searched.count("x" * 5000) == 1


def test_non_utf8_files_are_refused(ws: WorkspaceTools) -> None:
    (ws.root / "blob.bin").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ToolRefused, match="UTF-8"):
        ws.read_file("blob.bin")
