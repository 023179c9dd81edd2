"""A long repair leaves a short parent history: three repair attempts of 30 model turns each (the stepped
agent's most), the first two failing verification and the third passing, and the parent run's history stays
under 1,000 events because the turns are recorded in each attempt's own child workflow (``repair_attempt``),
not the parent's.

The scripted model server answers every turn over HTTP; the stepped agent's tool calls run on the real
workspace; each attempt's patch goes through the real verification (the cart's tests and the browser replay
of the reproduction), and the third one's PR merges once the reviewer approves it on the forge. Counted from
the server: every run of the parent's workflow ID and its events; from the model server's request log: 30
answered turns per attempt.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from temporalio.client import WorkflowExecutionStatus

from pipeline import client as durafix_client
from pipeline.config import DurafixConfig
from pipeline.ids import attempt_workflow_id
from pipeline.state import RunState
from pipeline.workflow import RepairBugWorkflow
from tests.e2e.history_size import executions, report
from tests.e2e.test_pipeline import awaiting_review, file_on_main, finished, state_when
from tests.replay.record import record_history
from tests.support.e2e_stack import MODEL_DIR, E2EStack, one_of_each, scripted_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.browser]

ATTEMPTS = 3
TURNS = 30
MAX_PARENT_EVENTS = 1_000
# A turn that only looks: one short line of output, so 90 turns stay far inside the run's token budget.
LOOK = {"tool_calls": [{"name": "search", "arguments": {"pattern": "def compute_total"}}]}


def padded(name: str, turns: list[dict[str, Any]], match: dict[str, str] | None = None) -> dict[str, Any]:
    """A conversation of exactly :data:`TURNS` turns: looks first, then ``turns`` (which end the attempt)."""
    conversation: dict[str, Any] = {"name": name, "turns": [LOOK] * (TURNS - len(turns)) + turns}
    if match is not None:
        conversation["match"] = match
    return conversation


def long_attempts_script(dest: Path) -> Path:
    """Procedure drafting as scripted; attempts 1 and 2 make the formatting change that leaves the bug (so
    verification fails), every later attempt the real fix with its regression test; each attempt 30 turns."""
    draft = yaml.safe_load((MODEL_DIR / "draft-procedure.yaml").read_text())
    [bad] = yaml.safe_load((MODEL_DIR / "bad-fix.yaml").read_text())["conversations"]
    [good] = yaml.safe_load((MODEL_DIR / "fix.yaml").read_text())["conversations"]
    conversations = [
        *draft["conversations"],
        *(padded(f"attempt-{n}-wrong", bad["turns"], {"system": rf"durafix-attempt: {n}\b"}) for n in (1, 2)),
        padded("later-attempts-fix", good["turns"]),
    ]
    dest.write_text(yaml.safe_dump({"model": "durafix-scripted", "conversations": conversations}))
    return dest


def three_attempts(config: DurafixConfig) -> None:
    config.max_repair_attempts = ATTEMPTS


@pytest.fixture(scope="module")
def long_repair_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EStack]:
    with scripted_stack(
        tmp_path_factory,
        "durafix-long-repair",
        model_script=long_attempts_script,
        configure=three_attempts,
        worker=True,
    ) as stack:
        yield stack


def mid_first_attempt(state: RunState, _status: object) -> bool:
    """Attempt 1 has answered turns, and many are to come (so it still runs when the test looks again)."""
    return 0 < calls_of_first_attempt(state) <= TURNS - 10 and state.outcome is None


def calls_of_first_attempt(state: RunState) -> int:
    return sum(u.calls for u in state.budgets.attempts if u.attempt == 1)


def answered_turns(stack: E2EStack) -> dict[str, int]:
    """Per scripted conversation, the turns the model server answered (HTTP 200)."""
    answer = httpx.get(f"{stack.config.model_base_url.removesuffix('/v1')}/_admin/requests", timeout=30)
    answer.raise_for_status()
    counts: dict[str, int] = {}
    for request in answer.json():
        if request.get("status") == 200 and "conversation" in request:
            counts[request["conversation"]] = counts.get(request["conversation"], 0) + 1
    return counts


@pytest.mark.timeout(900)
async def test_three_attempts_of_30_turns_leave_the_parent_history_under_1000_events(
    long_repair_stack: E2EStack,
) -> None:
    stack = long_repair_stack
    started = time.monotonic()
    client, repository, issue, wf = await stack.open_run()
    # While the first attempt runs in its child workflow, the run's state as `durafix status` reads it counts
    # the attempt's turns so far, and its pending steps are the attempt's.
    live = await state_when(client, wf, mid_first_attempt, timeout_s=300)
    assert live.budgets.repair_attempts_used == 1, live.budgets
    # Ten turns or more are still to come, so the attempt is still running: its turns are the child's until
    # it ends, and the run's own state has none of them.
    assert durafix_client.running_attempts(await durafix_client.handle_for(client, wf).describe()) == [
        attempt_workflow_id(wf, 1)
    ]
    own = await durafix_client.handle_for(client, wf).query(RepairBugWorkflow.state)
    assert calls_of_first_attempt(own) == 0, own.budgets
    state = await state_when(client, wf, awaiting_review, timeout_s=600)
    assert state.pending_approval is not None, state.outcome_detail
    repaired_s = time.monotonic() - started
    assert state.budgets.repair_attempts_used == ATTEMPTS, state.budgets
    stack.approve_on_forge(repository, state.pending_approval.pr_number, state.pending_approval.head_sha)
    final = await state_when(client, wf, finished)
    runs = await executions(client, wf)
    turns = answered_turns(stack)
    measured = report(
        f"{wf}: {ATTEMPTS} attempts to review in {repaired_s:.0f}s, whole test {time.monotonic() - started:.0f}s; "
        f"model turns answered {turns}",
        runs,
    )
    print(measured)

    # The premise, from the model server: each attempt took all 30 turns.
    assert turns.get("attempt-1-wrong") == TURNS and turns.get("attempt-2-wrong") == TURNS, measured
    assert turns.get("later-attempts-fix") == TURNS, measured
    assert final.outcome == "merged", f"{final.outcome_detail}\n{measured}"
    # External truth: the third attempt's fix is main's, and the run left one ticket, one branch, its one PR
    # and one evidence comment, though three attempts and two failed verifications came before.
    assert stack.github().get_repo(repository).get_branch("main").commit.sha == final.merged_sha
    assert "line_total(item) for item in items" in file_on_main(stack, repository, "cart.py")
    one_of_each(stack, repository, wf, issue, final)
    for run in runs:
        assert run.events < MAX_PARENT_EVENTS, measured
    # Each attempt ran as a child workflow of its own, and completed there.
    children = [child for run in runs for child in run.children]
    assert children == [attempt_workflow_id(wf, n) for n in range(1, ATTEMPTS + 1)], measured
    for child in children:
        described = await client.get_workflow_handle(child).describe()
        assert described.status == WorkflowExecutionStatus.COMPLETED, (child, described.status)
    record_history(await client.get_workflow_handle(wf).fetch_history(), "repair-attempts-as-children")
