"""A model worker SIGKILLed during a model call of a repair attempt: the attempt resumes at its last step.

The real workflow runs on the real Temporal dev server; the model queue is served by real worker processes
(:mod:`tests.support.workers.model`: the stepped attempt's activities, real git workspaces from the mirror,
the real engine code against the scripted model server over HTTP); the other queues are the recording
doubles of the workflow-logic tests. The scripted server holds the fourth model request of the attempt;
while it is held, the worker dies. A new worker on another state directory (a fresh host: no mirror, no
workspace) takes over. The model server's request log then shows every completed request exactly once and
only the one in flight twice, and the proposal is byte for byte the one an uncrashed run gets.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from temporalio.client import Client

from repair.prompts import ATTEMPT_MARKER
from tests.replay.record import record_history
from tests.support import stepped
from tests.support.modelserver import Serve, inject_fault, serve
from tests.support.repair import CART_SCRIPTS
from tests.support.stepped import StoredCart

pytestmark = [pytest.mark.slow]

__all__ = ["serve"]  # the scripted model server's fixture

HELD_REQUEST = 4  # of the six the fix script answers: after search, read, edit, while asking for the next step


async def test_a_worker_killed_during_a_model_call_resumes_without_resending_completed_calls(
    tmp_path: Path, cart: StoredCart, temporal_client: Client, serve: Serve
) -> None:
    server = serve(CART_SCRIPTS / "fix.yaml")

    async with stepped.pipeline_without_model(temporal_client, cart.spec_ref, cart.procedure_ref) as harness:
        with stepped.model_worker(temporal_client, tmp_path / "undisturbed", cart.evidence, server.base_url):
            undisturbed = await harness.start()
            expected, _ = await stepped.proposal_of(harness, undisturbed, cart.store, timeout=90)

        inject_fault(server, delay_s=25, after=HELD_REQUEST - 1)
        with stepped.model_worker(temporal_client, tmp_path / "doomed", cart.evidence, server.base_url) as doomed:
            crashed = await harness.start()
            await stepped.wait_until_held(server)
            stepped.killed(doomed)
        with stepped.model_worker(temporal_client, tmp_path / "survivor", cart.evidence, server.base_url):
            got, state = await stepped.proposal_of(harness, crashed, cart.store, timeout=120)
        record_history(await temporal_client.get_workflow_handle(crashed).fetch_history(), "stepped-attempt-killed")

    assert got == expected
    assert b"line_total(item) for item in items" in got and b"test_total_counts_quantities" in got
    server.stop()  # releases nothing by now, and every request is recorded once it returns
    records = stepped.request_log(server)

    before = stepped.requests_of(records, undisturbed)
    after = stepped.requests_of(records, crashed)
    assert len(before) == 6 and all(r["status"] == 200 and "fault" not in r for r in before)
    # The crashed run sent each request the undisturbed one sent, in the same order; only the one held while
    # the worker died went twice (its first answer went to a dead socket).
    sent = collections.Counter(stepped.body_of(r) for r in after)
    held = [r for r in after if "fault" in r]
    assert len(held) == 1 and held[0]["turn"] == HELD_REQUEST - 1  # turns count from 0
    assert {b: n for b, n in sent.items() if n > 1} == {stepped.body_of(held[0]): 2}
    assert [stepped.body_of(r) for r in after if "fault" not in r] == [stepped.body_of(r) for r in before]
    assert all(ATTEMPT_MARKER + ": 1" in r["body"]["messages"][0]["content"] for r in after)
    # Every turn after the kill went out under its own step's operation ID: turn 4 retried, 5 and 6 once.
    op_ids = sorted(r["headers"]["x-durafix-op-id"] for r in after)  # the held request is logged when answered
    assert op_ids == [f"{crashed}:repair:1:turn-{n}" for n in (1, 2, 3, 4, 4, 5, 6)]
    # The run was charged for every answered request once (the dead worker's held answer is not counted).
    answered = [r for r in after if "fault" not in r]
    assert state.budgets.model_prompt_tokens == sum(r["usage"]["prompt_tokens"] for r in answered)
    assert state.budgets.model_completion_tokens == sum(r["usage"]["completion_tokens"] for r in answered)
