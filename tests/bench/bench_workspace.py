"""Benchmark: rebuilding a workspace from the mirror cache + patch vs a fresh ``git clone`` + patch.

Run: ``uv run python -m tests.bench.bench_workspace [--files 10000] [--runs 5]``. Prints the median
wall time of each and their ratio. The remote is a local bare repository reached through ``file://``, which
makes git use its real transport (pack negotiation and transfer) instead of hard-linking objects; a remote
across a network only widens the gap.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

from environments.git import git_env, run_git
from environments.workspace import WorkspaceManager
from tests.bench.report import argument_parser

RUN = "repair:bench/repo#1"


def generate_repository(root: Path, files: int) -> tuple[Path, str, str]:
    """A bare repository of ``files`` small source files; returns (bare path, head commit, a patch)."""
    src = root / "src"
    for i in range(files):
        path = src / f"pkg{i % 100:02d}" / f"sub{i % 7}" / f"module_{i:05d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"VALUE_{j} = {i * j}  # line {j} of module {i}\n" for j in range(20)))
    env = git_env(
        extra={
            "GIT_AUTHOR_NAME": "bench",
            "GIT_AUTHOR_EMAIL": "bench@localhost",
            "GIT_COMMITTER_NAME": "bench",
            "GIT_COMMITTER_EMAIL": "bench@localhost",
        }
    )
    run_git(["init", "--quiet", "-b", "main", str(src)])
    run_git(["add", "-A"], cwd=src)
    run_git(["commit", "--quiet", "-m", "generated"], cwd=src, env=env)
    head = run_git(["rev-parse", "HEAD"], cwd=src)
    target = src / "pkg00" / "sub0" / "module_00000.py"
    target.write_text(target.read_text().replace("VALUE_3 = 0", "VALUE_3 = 42"))
    patch = run_git(["diff"], cwd=src) + "\n"
    bare = root / "remote.git"
    run_git(["clone", "--quiet", "--bare", str(src), str(bare)])
    return bare, head, patch


def time_rebuild(mgr: WorkspaceManager, url: str, head: str, patch: str, op: str) -> float:
    # A new operation each time, so both sides build from nothing and neither pays for deleting a tree.
    started = time.perf_counter()
    ws = mgr.rebuild(run_id=RUN, op_id=f"{RUN}:{op}", clone_url=url, base_revision=head, patch=patch)
    elapsed = time.perf_counter() - started
    mgr.remove(ws)
    return elapsed


def time_fresh_clone(url: str, head: str, patch: str, dest: Path) -> float:
    started = time.perf_counter()
    run_git(["clone", "--quiet", "--no-checkout", url, str(dest)])
    run_git(["checkout", "--quiet", "--detach", head], cwd=dest)
    run_git(["apply", "--index", "-"], cwd=dest, stdin=patch)
    elapsed = time.perf_counter() - started
    shutil.rmtree(dest)
    return elapsed


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-workspace-") as tmp:
        root = Path(tmp)
        bare, head, patch = generate_repository(root, args.files)
        url = bare.as_uri()
        mgr = WorkspaceManager(cache_dir=root / "cache", root=root / "workspaces")
        time_rebuild(mgr, url, head, patch, "warm")  # fill the mirror cache, as on a worker that saw the repo
        rebuild = [time_rebuild(mgr, url, head, patch, f"run-{i}") for i in range(args.runs)]
        clone = [time_fresh_clone(url, head, patch, root / f"clone-{i}") for i in range(args.runs)]
        mgr.cleanup_run(RUN)
    rebuild_s = statistics.median(rebuild)
    clone_s = statistics.median(clone)
    print(f"workspace rebuild benchmark: {args.files} files, median of {args.runs} runs each")
    print(f"  rebuild from mirror cache + patch: {rebuild_s:.3f} s  ({', '.join(f'{t:.3f}' for t in rebuild)})")
    print(f"  fresh git clone + patch:           {clone_s:.3f} s  ({', '.join(f'{t:.3f}' for t in clone)})")
    print(f"  ratio (fresh clone / rebuild):     {clone_s / rebuild_s:.2f}x")


if __name__ == "__main__":
    main()
