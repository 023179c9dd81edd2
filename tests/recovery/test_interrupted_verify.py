"""A worker SIGKILLed while applying a candidate's patch: the next attempt rebuilds from recorded inputs.

Whether the dead worker's filesystem is lost (a fresh host: no mirror cache, no workspaces) or kept (the same
host restarted, the half-built tree still on disk), the retried ``env.verify_candidate`` commits exactly
what an undisturbed run on another worker commits, runs the tests on that tree, and reuses nothing the
dead attempt built.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.steps import VerifyInput
from tests.support.gitrepo import Repo, fixed_cart_source, git
from tests.support.recovery_workers import RUN_ID, Remote, Worker

pytestmark = pytest.mark.slow

PROJECT_ROOT = Path(__file__).resolve().parents[2]
COMMIT_TIMESTAMP = 1_700_000_100
BUGGY_TOTAL = "sum(item.unit_price_cents for item in items)"
QUANTITY_TEST = """
    def test_total_counts_quantities(self) -> None:
        self.assertEqual(compute_total([Item("a", "A", 450, 3), Item("b", "B", 725, 2)]), 2800)
"""


def candidate_patch(repo: Repo) -> str:
    """Two files, so that it can be half applied: the fix in ``cart.py`` and a test that needs it."""
    tests = (repo.work / "tests" / "test_cart.py").read_text()
    with_test = tests.replace("\n\nif __name__", QUANTITY_TEST + "\n\nif __name__")
    assert with_test != tests, "the sample's test module changed shape; update the test fixture"
    return repo.make_patch({"cart.py": fixed_cart_source(repo), "tests/test_cart.py": with_test})


def tree_with(repo: Repo, patch: str) -> str:
    """The tree of base + ``patch``, computed by plain git in the author's clone."""
    git("apply", "--index", "-", cwd=repo.work, stdin=patch)
    try:
        return git("write-tree", cwd=repo.work)
    finally:
        git("reset", "-q", "--hard", cwd=repo.work)


def kill_while_applying(worker: Worker, inp: VerifyInput, scratch: Path) -> Path:
    """Run the activity in a worker process on ``worker``'s host, SIGKILL it mid-patch; the tree it left."""
    scratch.mkdir()
    config_json, input_json, ready = scratch / "config.json", scratch / "input.json", scratch / "ready"
    config_json.write_text(worker.config.model_dump_json())
    input_json.write_text(inp.model_dump_json())
    log = scratch / "worker.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.workers.interrupted_verify",
                str(config_json),
                str(input_json),
                str(ready),
            ],
            cwd=PROJECT_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if proc.poll() is not None:
                raise AssertionError(f"the worker exited {proc.returncode} before git apply:\n{log.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the worker never reached git apply:\n{log.read_text()}")
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    return Path(ready.read_text())


@pytest.mark.parametrize("filesystem", ["lost", "kept"])
def test_verify_after_a_worker_died_mid_patch_commits_what_an_undisturbed_run_commits(
    filesystem: str, remote: Remote, new_worker: Callable[[str], Worker], tmp_path: Path
) -> None:
    host = new_worker("host-1")
    patch = candidate_patch(remote.repo)
    inp = VerifyInput(
        run_id=RUN_ID,
        op_id=f"{RUN_ID}:verify:1",
        spec_ref=host.prepare_spec(remote),
        patch_ref=host.store_patch(patch),
        message="Count quantities in the cart total",
        commit_timestamp=COMMIT_TIMESTAMP,
    )

    half_built = kill_while_applying(host, inp, tmp_path / "killed")
    # What the dead attempt left: the new test staged, the fix it needs not.
    assert "test_total_counts_quantities" in (half_built / "tests" / "test_cart.py").read_text()
    assert BUGGY_TOTAL in (half_built / "cart.py").read_text()

    if filesystem == "lost":
        shutil.rmtree(host.config.state_dir / "cache")
        shutil.rmtree(host.config.state_dir / "workspaces")
    requests_before = remote.server.authorized_requests
    restarted = new_worker("host-1")
    result = restarted.run(restarted.env.verify_candidate, inp)
    fetched = remote.server.authorized_requests - requests_before

    other = new_worker("host-2")
    undisturbed = other.run(other.env.verify_candidate, inp)

    assert result.commit == undisturbed.commit
    assert result.tree == undisturbed.tree == tree_with(remote.repo, patch)
    assert result.tests_passed, result.test_summary
    test_log = restarted.services.store.read_bytes(result.test_output_ref).decode()
    assert "Ran 4 tests" in test_log and "OK" in test_log
    assert not half_built.exists()
    assert not [p.name for p in restarted.run_dir("workspaces").iterdir() if p.is_dir()]
    assert restarted.services.workspaces.list_owned(RUN_ID) == []
    # A lost cache is refilled from the remote; a kept one already holds the base revision.
    assert (fetched > 0) == (filesystem == "lost")
