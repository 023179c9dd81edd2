from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from environments.files import path_key
from environments.git import GitInterrupted
from environments.interface import ResourceKind, RunFencedError
from environments.mirror import RevisionNotFoundError
from environments.workspace import PatchError, TreeMismatchError, WorkspaceManager
from tests.support.gitrepo import Repo, fixed_cart_source, git

RUN = "repair:acme/cart#12"
OTHER_RUN = "repair:acme/cart#13"
PROJECT = Path(__file__).resolve().parents[3]


def manager(tmp_path: Path, name: str = "w1") -> WorkspaceManager:
    return WorkspaceManager(cache_dir=tmp_path / name / "cache", root=tmp_path / name / "root")


def test_rebuild_checks_out_the_base_revision_from_the_mirror(tmp_path: Path, repo: Repo) -> None:
    mgr = manager(tmp_path)
    ws = mgr.rebuild(run_id=RUN, op_id=f"{RUN}:reproduce", clone_url=repo.url, base_revision=repo.base)

    assert git("rev-parse", "HEAD", cwd=ws.path) == repo.base
    assert git("status", "--porcelain", cwd=ws.path) == ""
    assert ws.tree_sha == git("rev-parse", f"{repo.base}^{{tree}}", cwd=repo.work)
    assert (ws.path / "cart.py").read_text() == (repo.work / "cart.py").read_text()
    alternates = (ws.path / ".git/objects/info/alternates").read_text().strip()
    assert alternates == str(mgr.mirrors.path_for(repo.url) / "objects")
    # The workspace borrows objects: it stores none of its own.
    assert not any((ws.path / ".git/objects/pack").iterdir())


def test_rebuild_applies_the_patch_and_reports_its_tree(tmp_path: Path, repo: Repo) -> None:
    patch = repo.make_patch({"cart.py": fixed_cart_source(repo)})
    ws = manager(tmp_path).rebuild(
        run_id=RUN, op_id=f"{RUN}:repair:1", clone_url=repo.url, base_revision=repo.base, patch=patch
    )

    assert "line_total(item) for item in items" in (ws.path / "cart.py").read_text()
    assert git("diff", "--cached", "--name-only", cwd=ws.path) == "cart.py"
    assert ws.tree_sha == git("write-tree", cwd=ws.path)
    assert ws.tree_sha != git("rev-parse", f"{repo.base}^{{tree}}", cwd=repo.work)


def test_rebuild_accepts_the_recorded_tree_and_refuses_another(tmp_path: Path, repo: Repo) -> None:
    patch = repo.make_patch({"cart.py": fixed_cart_source(repo)})
    mgr = manager(tmp_path)
    first = mgr.rebuild(run_id=RUN, op_id=f"{RUN}:verify", clone_url=repo.url, base_revision=repo.base, patch=patch)
    again = mgr.rebuild(
        run_id=RUN,
        op_id=f"{RUN}:verify",
        clone_url=repo.url,
        base_revision=repo.base,
        patch=patch,
        expected_tree=first.tree_sha,
    )
    assert again.tree_sha == first.tree_sha

    wrong = git("rev-parse", f"{repo.base}^{{tree}}", cwd=repo.work)
    with pytest.raises(TreeMismatchError):
        mgr.rebuild(
            run_id=RUN,
            op_id=f"{RUN}:verify",
            clone_url=repo.url,
            base_revision=repo.base,
            patch=patch,
            expected_tree=wrong,
        )
    # Nothing of the refused build (or the earlier one for that operation) is left to be used.
    assert not first.path.exists()
    assert [p.name for p in first.path.parent.iterdir() if p.name.startswith(".")] == []


def test_a_patch_that_does_not_apply_is_refused(tmp_path: Path, repo: Repo) -> None:
    patch = repo.make_patch({"cart.py": fixed_cart_source(repo)}).replace("unit_price_cents", "price_cents")
    with pytest.raises(PatchError):
        manager(tmp_path).rebuild(
            run_id=RUN, op_id=f"{RUN}:repair:2", clone_url=repo.url, base_revision=repo.base, patch=patch
        )


def test_a_git_killed_by_a_signal_is_no_verdict_on_the_patch(
    tmp_path: Path, repo: Repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A git child SIGKILLed while the patch is staged (the OOM killer, a process-tree kill) fails the build as
    :class:`GitInterrupted`, which the activities retry (``tests/unit/pipeline/test_classify.py``), never as a patch
    that does not apply (a verdict that ends the run); the same build succeeds once git is left alone."""
    real = shutil.which("git")
    assert real is not None
    shims = tmp_path / "shims"
    shims.mkdir()
    shim = shims / "git"
    shim.write_text(f'#!/bin/sh\ncase " $* " in *" read-tree "*) kill -KILL $$ ;; esac\nexec {real} "$@"\n')
    shim.chmod(0o755)
    patch = repo.make_patch({"cart.py": fixed_cart_source(repo)})
    mgr = manager(tmp_path)
    op = f"{RUN}:publish"
    with monkeypatch.context() as m:
        m.setenv("PATH", f"{shims}:{os.environ['PATH']}")
        with pytest.raises(GitInterrupted) as caught:
            mgr.rebuild(run_id=RUN, op_id=op, clone_url=repo.url, base_revision=repo.base, patch=patch)
    assert caught.value.returncode == -signal.SIGKILL
    ws = mgr.rebuild(run_id=RUN, op_id=op, clone_url=repo.url, base_revision=repo.base, patch=patch)
    assert "line_total(item) for item in items" in (ws.path / "cart.py").read_text()


def test_a_revision_newer_than_the_mirror_is_fetched(tmp_path: Path, repo: Repo) -> None:
    mgr = manager(tmp_path)
    mgr.rebuild(run_id=RUN, op_id=f"{RUN}:a", clone_url=repo.url, base_revision=repo.base)
    newer = repo.push_commit("NOTES.md", "later\n", "a later commit")

    ws = mgr.rebuild(run_id=RUN, op_id=f"{RUN}:b", clone_url=repo.url, base_revision=newer)
    assert (ws.path / "NOTES.md").read_text() == "later\n"


def test_an_unknown_revision_is_reported(tmp_path: Path, repo: Repo) -> None:
    with pytest.raises(RevisionNotFoundError):
        manager(tmp_path).rebuild(run_id=RUN, op_id=f"{RUN}:a", clone_url=repo.url, base_revision="1" * 40)


def test_commit_is_deterministic_across_workers_with_separate_caches(tmp_path: Path, repo: Repo) -> None:
    patch = repo.make_patch({"cart.py": fixed_cart_source(repo)})
    shas = []
    for name in ("worker-a", "worker-b"):
        mgr = manager(tmp_path, name)
        ws = mgr.rebuild(run_id=RUN, op_id=f"{RUN}:commit", clone_url=repo.url, base_revision=repo.base, patch=patch)
        (ws.path / "stray.log").write_text(f"noise from {name}\n")
        shas.append(mgr.commit(ws, "Fix cart total\n\nMultiply by quantity.", timestamp=1_700_000_000))
        assert mgr.commit(ws, "Fix cart total\n\nMultiply by quantity.", timestamp=1_700_000_000) == shas[-1]
        assert git("rev-parse", "HEAD", cwd=ws.path) == shas[-1]

    assert shas[0] == shas[1]
    ws_dir = manager(tmp_path, "worker-a").root / path_key(RUN) / path_key(f"{RUN}:commit")
    assert git("log", "-1", "--format=%an <%ae>|%cn <%ce>|%at|%ct|%P", cwd=ws_dir) == (
        f"durafix <durafix@localhost>|durafix <durafix@localhost>|1700000000|1700000000|{repo.base}"
    )
    assert git("show", "--name-only", "--format=", "HEAD", cwd=ws_dir) == "cart.py"


def test_a_rebuild_killed_half_way_is_never_reused(tmp_path: Path, repo: Repo) -> None:
    patch = repo.make_patch({"cart.py": fixed_cart_source(repo)})
    mgr = manager(tmp_path)
    op = f"{RUN}:repair:1"
    reached = tmp_path / "patch-applied"
    # A real worker process doing the rebuild, stopped right after the patch was applied.
    child = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        import environments.workspace as workspace
        real_run_git = workspace.run_git
        def run_git(args, **kw):
            out = real_run_git(args, **kw)
            if args[0] == "apply" and "--check" not in args:
                Path({str(reached)!r}).write_text("yes")
                time.sleep(600)
            return out
        workspace.run_git = run_git
        mgr = workspace.WorkspaceManager(Path({str(mgr.mirrors.cache_dir)!r}), Path({str(mgr.root)!r}))
        mgr.rebuild(run_id={RUN!r}, op_id={op!r}, clone_url={repo.url!r}, base_revision={repo.base!r},
                    patch=sys.stdin.read())
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], cwd=PROJECT, stdin=subprocess.PIPE, text=True)
    try:
        assert proc.stdin is not None
        proc.stdin.write(patch)
        proc.stdin.close()
        deadline = time.monotonic() + 60
        while not reached.exists():
            assert proc.poll() is None, "the rebuilding process ended early"
            assert time.monotonic() < deadline, "the rebuilding process never reached the patch"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    run_dir = mgr.root / path_key(RUN)
    final = run_dir / path_key(op)
    assert not final.exists(), "a half-built tree was exposed under its final name"
    leftovers = [p for p in run_dir.iterdir() if p.name.startswith(f".{path_key(op)}.tmp-")]
    assert len(leftovers) == 1
    [owned] = mgr.list_owned(RUN)
    assert owned.op_id == op and owned.detail["present"] == "no"

    ws = mgr.rebuild(run_id=RUN, op_id=op, clone_url=repo.url, base_revision=repo.base, patch=patch)
    assert ws.path == final
    assert not any(p.exists() for p in leftovers)
    assert git("status", "--porcelain", cwd=ws.path) == "M  cart.py"


def test_a_leftover_tree_for_the_same_operation_is_replaced(tmp_path: Path, repo: Repo) -> None:
    mgr = manager(tmp_path)
    op = f"{RUN}:reproduce"
    ws = mgr.rebuild(run_id=RUN, op_id=op, clone_url=repo.url, base_revision=repo.base)
    (ws.path / "cart.py").write_text("corrupted by an earlier attempt\n")
    (ws.path / "half-written.tmp").write_text("x")

    again = mgr.rebuild(run_id=RUN, op_id=op, clone_url=repo.url, base_revision=repo.base)
    assert again.path == ws.path
    assert not (again.path / "half-written.tmp").exists()
    assert git("status", "--porcelain", "--untracked-files=all", cwd=again.path) == ""


def test_a_fresh_worker_restores_an_unpublished_commit_from_a_bundle(tmp_path: Path, repo: Repo) -> None:
    patch = repo.make_patch({"cart.py": fixed_cart_source(repo)})
    first = manager(tmp_path, "worker-a")
    ws = first.rebuild(run_id=RUN, op_id=f"{RUN}:commit", clone_url=repo.url, base_revision=repo.base, patch=patch)
    commit = first.commit(ws, "Fix cart total", timestamp=1_700_000_000)
    bundle = first.snapshot(ws, tmp_path / "evidence" / "candidate.bundle", commit)

    fresh = manager(tmp_path, "worker-b")
    with pytest.raises(RevisionNotFoundError):
        fresh.rebuild(run_id=RUN, op_id=f"{RUN}:push", clone_url=repo.url, base_revision=commit)
    restored = fresh.rebuild(
        run_id=RUN,
        op_id=f"{RUN}:push",
        clone_url=repo.url,
        base_revision=commit,
        bundle=bundle,
        expected_tree=ws.tree_sha,
    )
    assert git("rev-parse", "HEAD", cwd=restored.path) == commit
    assert (restored.path / "cart.py").read_text() == (ws.path / "cart.py").read_text()
    assert git("rev-parse", f"refs/durafix/bundles/{commit}", cwd=fresh.mirrors.path_for(repo.url)) == commit


def test_snapshot_needs_a_commit_beyond_the_base(tmp_path: Path, repo: Repo) -> None:
    mgr = manager(tmp_path)
    ws = mgr.rebuild(run_id=RUN, op_id=f"{RUN}:a", clone_url=repo.url, base_revision=repo.base)
    with pytest.raises(ValueError, match="nothing to snapshot"):
        mgr.snapshot(ws, tmp_path / "b.bundle", repo.base)


def test_workspaces_are_owned_per_run_and_cleanup_touches_only_that_run(tmp_path: Path, repo: Repo) -> None:
    mgr = manager(tmp_path)
    mine = [
        mgr.rebuild(run_id=RUN, op_id=f"{RUN}:{step}", clone_url=repo.url, base_revision=repo.base)
        for step in ("reproduce", "verify")
    ]
    theirs = mgr.rebuild(run_id=OTHER_RUN, op_id=f"{OTHER_RUN}:reproduce", clone_url=repo.url, base_revision=repo.base)

    owned = mgr.list_owned(RUN)
    assert {(r.op_id, r.resource_id) for r in owned} == {(ws.op_id, str(ws.path)) for ws in mine}
    assert all(r.kind is ResourceKind.WORKSPACE and r.run_id == RUN for r in owned)
    assert len(mgr.list_owned()) == 3

    report = mgr.cleanup_run(RUN)
    assert report.complete and {r.op_id for r in report.removed} == {ws.op_id for ws in mine}
    assert not any(ws.path.exists() for ws in mine)
    assert mgr.list_owned(RUN) == []
    assert theirs.path.is_dir() and [r.op_id for r in mgr.list_owned(OTHER_RUN)] == [theirs.op_id]
    assert mgr.mirrors.path_for(repo.url).is_dir()

    second = mgr.cleanup_run(RUN)
    assert second.complete and second.removed == []


def test_a_cleaned_up_run_cannot_rebuild(tmp_path: Path, repo: Repo) -> None:
    mgr = manager(tmp_path)
    mgr.cleanup_run(RUN)
    with pytest.raises(RunFencedError):
        mgr.rebuild(run_id=RUN, op_id=f"{RUN}:late", clone_url=repo.url, base_revision=repo.base)
    assert mgr.list_owned(RUN) == []


def test_remove_deletes_one_workspace_and_its_record(tmp_path: Path, repo: Repo) -> None:
    mgr = manager(tmp_path)
    keep = mgr.rebuild(run_id=RUN, op_id=f"{RUN}:keep", clone_url=repo.url, base_revision=repo.base)
    gone = mgr.rebuild(run_id=RUN, op_id=f"{RUN}:gone", clone_url=repo.url, base_revision=repo.base)
    mgr.remove(gone)
    mgr.remove(gone)
    assert not gone.path.exists() and keep.path.is_dir()
    assert [r.op_id for r in mgr.list_owned(RUN)] == [keep.op_id]


def test_credentials_in_the_clone_url_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="credentials"):
        manager(tmp_path).rebuild(
            run_id=RUN, op_id=f"{RUN}:a", clone_url="https://user:secret@example.com/a/b.git", base_revision="a" * 40
        )
    assert not (tmp_path / "w1" / "cache" / "mirrors").exists()


def test_workspace_paths_are_safe_for_any_run_id(tmp_path: Path, repo: Repo) -> None:
    ws = manager(tmp_path).rebuild(
        run_id="repair:../../etc#1", op_id="repair:../../etc#1:x", clone_url=repo.url, base_revision=repo.base
    )
    assert ws.path.is_relative_to(tmp_path / "w1" / "root")
    assert os.sep not in ws.path.name
