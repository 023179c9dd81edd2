"""The engine repairs the sample cart app through the real openai SDK and the scripted server over HTTP.

Each proposal is applied with ``git apply`` to a fresh clone at the base revision and the app's own tests run
on it, the way verification will.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from repair.interface import RepairProposal
from repair.patch import validate_patch
from tests.support.modelserver import Serve, recorded
from tests.support.repair import CART_SCRIPTS, engine_for, git, request_for, run_app_tests

TOTAL_OF_THREE_AT_250 = "from cart import Item, compute_total; print(compute_total([Item('a', 'A', 250, 3)]))"


def apply_to_fresh_clone(base: Path, proposal: RepairProposal, dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(base), str(dest)], check=True)
    assert validate_patch(dest, proposal.patch).ok
    git(dest, "apply", stdin=proposal.patch)
    return dest


def total_of_three_at_250(repo: Path) -> str:
    return subprocess.run(
        [sys.executable, "-c", TOTAL_OF_THREE_AT_250], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_fix_script_yields_a_patch_that_fixes_the_bug_and_adds_a_failing_first_test(
    serve: Serve, cart_repo: Path, tmp_path: Path
) -> None:
    server = serve(CART_SCRIPTS / "fix.yaml")
    proposal = engine_for(server.base_url).propose(request_for(cart_repo))

    assert proposal.files_changed == ["cart.py", "tests/test_cart.py"]
    assert (proposal.turns, proposal.tool_calls, proposal.model) == (6, 6, "durafix-scripted")
    assert "line_total(item)" in proposal.summary
    assert len(recorded(server)) == 6
    assert proposal.prompt_tokens > 0 and proposal.completion_tokens > 0

    fixed = apply_to_fresh_clone(cart_repo, proposal, tmp_path / "verify")
    tests = run_app_tests(fixed)
    assert tests.returncode == 0, tests.stderr
    assert "Ran 4 tests" in tests.stderr
    assert total_of_three_at_250(fixed) == "750"

    # The regression test is real: with the base revision's cart.py it fails.
    git(fixed, "checkout", "HEAD", "--", "cart.py")
    unfixed = run_app_tests(fixed)
    assert unfixed.returncode != 0
    assert "FAIL: test_total_counts_quantities" in unfixed.stderr


def test_bad_fix_script_proposes_patches_that_leave_the_bug_in_place(
    serve: Serve, cart_repo: Path, tmp_path: Path
) -> None:
    server = serve(CART_SCRIPTS / "bad-fix.yaml")
    engine = engine_for(server.base_url)
    for attempt in (1, 2, 3):
        workspace = tmp_path / f"attempt-{attempt}"
        subprocess.run(["git", "clone", "-q", str(cart_repo), str(workspace)], check=True)
        failures = [f"replay still shows the wrong total (attempt {n})" for n in range(1, attempt)]
        proposal = engine.propose(request_for(workspace, attempt=attempt, previous_failures=failures))
        assert proposal.files_changed == ["cart.py"]
        assert '+    return f"${cents // 100:,}.{cents % 100:02d}"' in proposal.patch
        patched = apply_to_fresh_clone(cart_repo, proposal, tmp_path / f"verify-{attempt}")
        assert total_of_three_at_250(patched) == "250"


def test_wrong_then_fix_script_answers_attempt_two_with_the_fix(serve: Serve, cart_repo: Path, tmp_path: Path) -> None:
    server = serve(CART_SCRIPTS / "wrong-then-fix.yaml")
    engine = engine_for(server.base_url)

    first_ws = tmp_path / "attempt-1"
    subprocess.run(["git", "clone", "-q", str(cart_repo), str(first_ws)], check=True)
    first = engine.propose(request_for(first_ws, attempt=1))
    assert total_of_three_at_250(apply_to_fresh_clone(cart_repo, first, tmp_path / "verify-1")) == "250"

    second_ws = tmp_path / "attempt-2"
    subprocess.run(["git", "clone", "-q", str(cart_repo), str(second_ws)], check=True)
    failure = "replay: the page still shows Total: $23.75"
    second = engine.propose(request_for(second_ws, attempt=2, previous_failures=[failure]))
    fixed = apply_to_fresh_clone(cart_repo, second, tmp_path / "verify-2")
    assert total_of_three_at_250(fixed) == "750"
    assert run_app_tests(fixed).returncode == 0

    records = recorded(server)
    assert [r["conversation"] for r in records] == ["attempt-1-formatting"] * 3 + ["later-attempts-fix-total"] * 4
    second_opening = records[3]["body"]["messages"]
    assert "durafix-attempt: 2" in second_opening[0]["content"]
    assert failure in second_opening[1]["content"]
