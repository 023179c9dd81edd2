"""A worker SIGKILLed while two checks run side by side (:mod:`pipeline.flow.side_by_side`): the baseline beside the
base reproduction, and a candidate's tests beside its reproduction replayed. A fresh worker finishes the run,
which merges once approved, with each check's result recorded once.

The stack is the end-to-end one (real Temporal dev server, the GitHub emulator over HTTP with webhooks, the
scripted model, Chromium, the sample app), the session's: only workers are killed, and each run has its own
repository. The killed worker is a real ``durafix worker`` (its supervisor and child, the whole process group)
whose two check activities each do their whole work and then hold, beating, instead of returning
(``workers/faulty.py hold-after-work``): the kill is certain to land while both run, at the point where their
work is done and their results are not yet on the server. Before the kill the run's state names both checks in
``checks_beside`` and the server shows both activities started by the held attempts; after it the successor
worker fails them over (``WorkerLost``) and retries them.

What is asserted is read back from the forge (one ticket, one branch, one PR, one evidence comment, the
merge), the run's final state (each check's result once, no duplicate evidence), its history (each check's
activity completed once, the held attempt failed over) and the machine (no process or workspace of the run
left).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.client import Client, WorkflowExecutionStatus

from infra import processes
from pipeline import client as runs
from pipeline import steps
from pipeline.failures import WORKER_LOST
from pipeline.ids import op_step
from pipeline.state import ReproductionOutcome, RunState
from tests.e2e.test_pipeline import RUN_TIMEOUT_S, awaiting_review, finished, state_when
from tests.support.e2e_stack import E2EStack, assert_merged_once, e2e_stack, kill, wait_for, workers_stopped
from tests.support.run_history import activity_spans
from tests.support.waiting import eventually

__all__ = ["e2e_stack", "workers_stopped"]

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.timeout(600)]

# The base reproduction is killed with its environment provisioned (its browser step is the one held beside the
# candidate's tests below): a kill in each kind of step, at the cost of two whole runs, not three.
BASE_REPRODUCTION = {"env-base": steps.PROVISION.name}
CANDIDATE_CHECKS = {"verify": steps.VERIFY_CANDIDATE.name, "reproduce-candidate-1": steps.REPRODUCE.name}


async def held_beside(
    client: Client, wf: str, notes: Path, held: Mapping[str, str], beside: list[str]
) -> dict[str, PendingActivityInfo]:
    """Once the run names ``beside`` as its checks running and the server shows each held step's activity
    started, by the attempt that noted itself held (``notes/<step>.json``): those pending activities, by step."""
    handle = client.get_workflow_handle(wf)

    async def both_running() -> dict[str, PendingActivityInfo] | None:
        try:
            status, state = await runs.status_and_state(client, wf)
        except Exception:  # the webhook may not have started the run yet
            return None
        assert status == WorkflowExecutionStatus.RUNNING, f"the run ended before its checks: {state.outcome_detail}"
        noted = {step: notes / f"{step}.json" for step in held}
        if not all(path.exists() for path in noted.values()):
            return None
        if sorted(state.checks_beside) != sorted(beside):
            return None
        pending = (await handle.describe()).raw_description.pending_activities
        found: dict[str, PendingActivityInfo] = {}
        for step, path in noted.items():
            note = json.loads(path.read_text())
            assert note["activity_type"] == held[step], note
            for act in pending:
                if (
                    act.activity_type.name == held[step]
                    and act.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                    and act.attempt == note["attempt"]
                    and act.last_worker_identity.endswith(f"/child-{note['pid']}")
                ):
                    found[step] = act
        return found if len(found) == len(held) else None

    running: dict[str, PendingActivityInfo] = await eventually(
        both_running, RUN_TIMEOUT_S, f"{sorted(held)} held side by side ({beside})"
    )
    return running


async def killed_beside_then_merged(
    stack: E2EStack, notes: Path, held: Mapping[str, str], beside: list[str]
) -> RunState:
    """A run whose worker is SIGKILLed while the ``held`` steps' activities (step -> activity type) run as the
    checks ``beside``; a fresh worker takes the run to review, the reviewer approves on the forge, and the run
    merges once. Each held step's activity completed once, its held attempt failed over as ``WorkerLost``."""
    doomed = stack.spawn_worker(
        fault="hold-after-work", kill_dir=notes, extra_env={"DURAFIX_TEST_HOLD": ",".join(held)}
    )
    client, repository, issue, wf = await stack.open_run()
    running = await held_beside(client, wf, notes, held, beside)

    kill(doomed)
    wait_for(lambda: not processes.is_alive(doomed), 30, "the killed worker to be gone")
    stack.workers.remove(doomed)
    pending = {
        a.activity_id for a in (await client.get_workflow_handle(wf).describe()).raw_description.pending_activities
    }
    assert {a.activity_id for a in running.values()} <= pending, "a held check completed before the kill landed"

    successor = stack.spawn_worker()
    state = await state_when(client, wf, awaiting_review)
    assert state.pending_approval is not None, state.outcome_detail
    stack.approve_on_forge(repository, state.pending_approval.pr_number, state.pending_approval.head_sha)
    final = await state_when(client, wf, finished)
    assert_merged_once(stack, repository, issue, wf, final)
    assert processes.is_alive(successor), processes.log_tail(Path(successor.log))

    spans = await activity_spans(client, wf)
    for step, activity_type in held.items():
        # A teardown's operation is its provisioning's: the activity type tells them apart.
        mine = [s for s in spans if s.step == activity_type and op_step(s.op_id, wf) == step]
        # Completed once: the held attempt's activity, its next attempt started after the killed one failed over.
        assert [(s.outcome, s.last_failure) for s in mine] == [("completed", WORKER_LOST)], (step, mine)
        assert mine[0].attempt >= 2, (step, mine)
    # Each artifact once in the run's evidence; no name twice (a retry's outputs differ from the killed
    # attempt's by their bytes, never by their names, so a result recorded twice would show here).
    assert len({(r.sha256, r.name) for r in final.evidence}) == len(final.evidence)
    names = [(r.kind, r.name, r.revision) for r in final.evidence]
    assert len(set(names)) == len(names), sorted(names)
    assert final.checks_beside == []
    return final


async def test_worker_killed_while_the_baseline_and_the_base_reproduction_run_the_run_records_each_once(
    workers_stopped: E2EStack, tmp_path: Path
) -> None:
    """Killed with the baseline's tests done and the base reproduction's environment provisioned, neither result
    on the server: the retries' results are the run's, each once (its baseline passed, its report reproduced), and
    the run merges with one of each on the forge and nothing of the killed attempts left."""
    held = {"baseline": steps.RUN_BASELINE.name, **BASE_REPRODUCTION}
    final = await killed_beside_then_merged(workers_stopped, tmp_path / "held", held, ["base reproduction", "baseline"])
    assert final.baseline is not None and final.baseline.passed, final.baseline
    assert final.reproduction is not None and final.reproduction.status == ReproductionOutcome.REPRODUCED
    baseline_logs = [r for r in final.evidence if r.name == final.baseline.test_output_ref.name]
    assert baseline_logs == [final.baseline.test_output_ref], baseline_logs
    base_traces = [r for r in final.evidence if r.kind == "trace" and r.revision == final.reproduction.revision]
    assert base_traces == final.reproduction.trace_refs, (base_traces, final.reproduction.trace_refs)


async def test_worker_killed_while_a_candidates_tests_and_its_replay_run_the_run_records_each_once(
    workers_stopped: E2EStack, tmp_path: Path
) -> None:
    """Killed with the candidate's tests done (its commit made) and its reproduction replayed, neither result on
    the server: the candidate's verdict is the retries', recorded once (tests passed, the bug no longer
    reproduces), and the run merges that candidate with one of each on the forge."""
    final = await killed_beside_then_merged(
        workers_stopped, tmp_path / "held", CANDIDATE_CHECKS, ["tests", "reproduction"]
    )
    [candidate] = final.candidates
    assert candidate.tests_passed, candidate.test_summary
    assert candidate.replay is not None and candidate.replay.status == ReproductionOutcome.NOT_REPRODUCED
    assert candidate.commit is not None and candidate.replay.revision == candidate.commit
    assert candidate.test_output_ref is not None
    test_logs = [r for r in final.evidence if r.name == candidate.test_output_ref.name]
    assert test_logs == [candidate.test_output_ref], test_logs
