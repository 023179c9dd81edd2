"""The repair agent's run tools on real workers: the model runs the tests in the sandbox and fixes its own
first patch from their failure, and a worker SIGKILLed during a ``run_tests`` call or during a replay-safe tool
batch is recovered as each tool's replay policy says.

The real workflow runs on the real Temporal dev server; the model queue is served by real worker processes
(:mod:`tests.support.workers.model`) talking to the scripted model server over HTTP; where a test needs the
run tools, the environments queue is a real worker process too (:mod:`tests.support.workers.run`: the real
``env.agent_run``, workspaces from the mirror, the local provider's bubblewrap sandbox). The other queues are
the recording doubles of the workflow-logic tests.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from evidence.local import LocalArtifactStore
from pipeline.state import RunState
from repair.tools import INTERRUPTED
from tests.support import stepped
from tests.support.modelserver import Serve, serve
from tests.support.repair import CART_SCRIPTS
from tests.support.stepped import StoredCart

pytestmark = [pytest.mark.slow]

__all__ = ["serve"]  # the scripted model server's fixture

FIXED_LINE = b"+    return sum(line_total(item) for item in items)"
WRONG_LINE = b"item.unit_price_cents + item.quantity"


def tool_results(record: dict[str, Any]) -> list[str]:
    """The ``tool`` messages a request carried, in order."""
    return [m["content"] for m in record["body"]["messages"] if m["role"] == "tool"]


def run_outputs(state: RunState, store: LocalArtifactStore) -> list[str]:
    """The stored output of each run-tool command the run recorded."""
    logs = [r for r in state.evidence if r.name.endswith("-run_tests.log")]
    return [store.read_bytes(r).decode() for r in logs]


def assert_fixed_its_own_patch_after_reading_the_tests(records: list[dict[str, Any]], patch: bytes) -> None:
    """The test-driven script's run: the model read its first fix's failure and corrected it, in one attempt."""
    assert [len(tool_results(r)) for r in records] == [0, 1, 4, 6]
    first_run, second_run = tool_results(records[2])[-1], tool_results(records[3])[-1]
    # The model read the failure of its first fix, in the sandbox's words...
    assert first_run.startswith("$ python3 -m unittest discover -s tests -t .\nexited 1 (failed)")
    assert "AssertionError: 2381 != 4000" in first_run and "FAILED (failures=2)" in first_run
    # ...and the tests passed once it corrected its own patch, within the same attempt.
    assert "exited 0 (passed)" in second_run and "\nOK" in second_run
    assert FIXED_LINE in patch and WRONG_LINE not in patch and b"test_total_counts_quantities" in patch


async def test_the_model_fixes_its_own_patch_from_the_tests_and_a_kill_during_run_tests_reports_it_interrupted(
    tmp_path: Path, temporal_client: Client, serve: Serve, cart: StoredCart
) -> None:
    server = serve(CART_SCRIPTS / "test-driven.yaml")
    held = tmp_path / "run-held"
    async with stepped.pipeline_without_model(
        temporal_client, cart.spec_ref, cart.procedure_ref, environments=False
    ) as harness:
        with stepped.model_worker(temporal_client, tmp_path / "model", cart.evidence, server.base_url):
            with stepped.run_worker(temporal_client, tmp_path / "env-undisturbed", cart.evidence, cart.spec_ref):
                undisturbed = await harness.start()
                expected, first = await stepped.proposal_of(harness, undisturbed, cart.store, timeout=180)

            with stepped.run_worker(
                temporal_client, tmp_path / "env-doomed", cart.evidence, cart.spec_ref, hold_file=held
            ) as doomed:
                crashed = await harness.start()
                await stepped.wait_for_file(held)  # the tests ran; their result is not recorded
                stepped.killed(doomed)
            with stepped.run_worker(temporal_client, tmp_path / "env-survivor", cart.evidence, cart.spec_ref):
                got, state = await stepped.proposal_of(harness, crashed, cart.store, timeout=180)
    server.stop()
    records = stepped.request_log(server)

    assert_fixed_its_own_patch_after_reading_the_tests(stepped.requests_of(records, undisturbed), expected)
    assert first.budgets.repair_attempts_used == 1
    outputs = run_outputs(first, cart.store)
    assert len(outputs) == 2 and "FAILED (failures=2)" in outputs[0] and "OK" in outputs[1]

    assert got == expected
    after = stepped.requests_of(records, crashed)
    assert len(after) == 4
    # The interrupted run_tests reached the model as interrupted; the next run_tests ran for real.
    assert tool_results(after[2])[-1] == INTERRUPTED
    assert "exited 0 (passed)" in tool_results(after[3])[-1]
    # No model request went twice: the kill was in a tool call, and every completed turn stands.
    assert all(n == 1 for n in collections.Counter(stepped.body_of(r) for r in after).values())
    # The killed command is not run again behind the model's back: the survivor ran only the second one.
    assert [o.count("Ran ") for o in run_outputs(state, cart.store)] == [1]
    assert state.budgets.repair_attempts_used == 1


async def test_a_worker_killed_during_a_replay_safe_tool_batch_replays_it_on_the_recorded_pre_state(
    tmp_path: Path, temporal_client: Client, serve: Serve, cart: StoredCart
) -> None:
    server = serve(CART_SCRIPTS / "fix.yaml")
    held = tmp_path / "batch-held"
    async with stepped.pipeline_without_model(temporal_client, cart.spec_ref, cart.procedure_ref) as harness:
        with stepped.model_worker(temporal_client, tmp_path / "undisturbed", cart.evidence, server.base_url):
            undisturbed = await harness.start()
            expected, _ = await stepped.proposal_of(harness, undisturbed, cart.store, timeout=120)

        with stepped.model_worker(
            temporal_client, tmp_path / "doomed", cart.evidence, server.base_url, hold_file=held
        ) as doomed:
            crashed = await harness.start()
            await stepped.wait_for_file(held)  # the edit is on the dead worker's disk, its batch unrecorded
            stepped.killed(doomed)
        with stepped.model_worker(temporal_client, tmp_path / "survivor", cart.evidence, server.base_url):
            got, _ = await stepped.proposal_of(harness, crashed, cart.store, timeout=120)
    server.stop()
    records = stepped.request_log(server)

    # Replayed on base + the patch before it, the batch gave the same result and the same patch...
    assert got == expected and FIXED_LINE in got
    before, after = stepped.requests_of(records, undisturbed), stepped.requests_of(records, crashed)
    # ...so the model saw exactly what the undisturbed run's model saw, and no request went twice.
    assert [stepped.body_of(r) for r in after] == [stepped.body_of(r) for r in before]
    assert len({json.dumps(r["body"], sort_keys=True) for r in after}) == len(after) == 6
