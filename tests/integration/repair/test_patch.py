"""Patches taken from a real git workspace, and the refusals of ``validate_patch``."""

from __future__ import annotations

from pathlib import Path

import pytest

from repair.patch import validate_patch, workspace_patch
from tests.support.repair import git


def new_file_patch(path: str, mode: str = "100644", body: str = "+x\n") -> str:
    return f"diff --git a/{path} b/{path}\nnew file mode {mode}\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n{body}"


def test_workspace_patch_holds_edits_and_new_files_and_leaves_the_index_alone(cart_repo: Path) -> None:
    cart = cart_repo / "cart.py"
    cart.write_text(cart.read_text().replace("item.unit_price_cents for", "line_total(item) for"))
    (cart_repo / "tests" / "test_quantities.py").write_text("import unittest\n")

    patch, files = workspace_patch(cart_repo)

    assert files == ["cart.py", "tests/test_quantities.py"]
    assert "+    return sum(line_total(item) for item in items)" in patch
    assert "+++ b/tests/test_quantities.py" in patch
    assert git(cart_repo, "diff", "--cached", "--name-only") == ""
    assert "?? tests/test_quantities.py" in git(cart_repo, "status", "--porcelain")
    assert validate_patch(cart_repo, patch).ok


def test_workspace_patch_of_an_untouched_tree_is_empty(cart_repo: Path) -> None:
    assert workspace_patch(cart_repo) == ("", [])


def test_valid_patch_applies_to_base_even_when_the_working_tree_is_dirty(cart_repo: Path) -> None:
    (cart_repo / "cart.py").write_text("scribbled over\n")
    patch = new_file_patch("tests/test_more.py")
    check = validate_patch(cart_repo, patch)
    assert check.ok, check.reasons
    assert check.files == ["tests/test_more.py"]
    assert check.size_bytes == len(patch.encode())


@pytest.mark.parametrize(
    ("patch", "reason"),
    [
        ("", "empty"),
        ("  \n", "empty"),
        ("this is not a diff\n", "not a valid patch"),
        (new_file_patch(".git/hooks/post-checkout"), "touches .git"),
        (new_file_patch("src/.Git/config"), "touches .git"),
        (new_file_patch("../outside.py"), "escapes the repository"),
        (new_file_patch("/etc/cron.d/x"), "absolute"),
        (new_file_patch("link", mode="120000", body="+/etc/passwd\n"), "symlink"),
    ],
)
def test_refused_patches_say_why(cart_repo: Path, patch: str, reason: str) -> None:
    check = validate_patch(cart_repo, patch)
    assert not check.ok
    assert any(reason in r for r in check.reasons), check.reasons


def test_patch_over_the_size_limit_is_refused(cart_repo: Path) -> None:
    check = validate_patch(cart_repo, new_file_patch("big.txt", body="+" + "x" * 400 + "\n"), max_bytes=200)
    assert not check.ok
    assert check.reasons[0].startswith("patch is ") and "the limit is 200" in check.reasons[0]


def test_binary_patch_is_refused(cart_repo: Path) -> None:
    (cart_repo / "logo.bin").write_bytes(bytes(range(256)))
    git(cart_repo, "add", "logo.bin")
    binary = git(cart_repo, "diff", "--cached", "--binary")
    git(cart_repo, "reset", "-q")
    check = validate_patch(cart_repo, binary)
    assert "GIT binary patch" in binary
    assert check.reasons == ["patch carries binary content"]


def test_patch_that_does_not_apply_to_base_is_refused(cart_repo: Path) -> None:
    stale = (
        "diff --git a/cart.py b/cart.py\n--- a/cart.py\n+++ b/cart.py\n"
        "@@ -21,2 +21,2 @@\n"
        '     """Total of the cart in cents."""\n'
        "-    return sum(item.price for item in items)\n"
        "+    return sum(line_total(item) for item in items)\n"
    )
    check = validate_patch(cart_repo, stale)
    assert not check.ok
    assert check.reasons[0].startswith("does not apply to HEAD")
    assert "cart.py" in check.reasons[0]
