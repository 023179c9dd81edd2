"""A 429/500 storm from the model endpoint never spends a repair attempt.

The real workflow on the real Temporal dev server; the model queue served by a real worker process (the
stepped attempt's activities against the scripted model server over HTTP, its fault injection making the
storm); the other queues the recording doubles of the workflow-logic tests. The model step's own retries are
cut to two tries, and the run policy's outage backoff and allowance to seconds, so a storm outlasts the
step's retries at once: the workflow waits it out on a durable timer and sends the same turn of the same
attempt again.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from temporalio.client import Client

from pipeline.policies import StepTimeouts
from pipeline.state import Outcome, Phase
from tests.replay.record import record_history
from tests.support.modelserver import Serve, inject_fault, serve
from tests.support.repair import CART_SCRIPTS
from tests.support.stepped import StoredCart, model_worker, pipeline_without_model, request_log, requests_of

pytestmark = [pytest.mark.slow]

__all__ = ["serve"]  # the scripted model server's fixture

TRIES = 2  # of each model step, before its transport failure is the workflow's to wait out
# Two tries a short backoff apart; timeouts generous, so a loaded host never turns a slow answer into a failure.
MODEL_STEPS = StepTimeouts(
    schedule_to_start=120,
    start_to_close=60,
    schedule_to_close=300,
    heartbeat=15,
    max_attempts=TRIES,
    initial_interval=0.2,
    maximum_interval=0.2,
)


async def test_a_storm_that_outlasts_the_steps_retries_is_waited_out_without_spending_an_attempt(
    tmp_path: Path, cart: StoredCart, temporal_client: Client, serve: Serve
) -> None:
    server = serve(CART_SCRIPTS / "fix.yaml")
    # The attempt's first request: two 429s (the step's both tries), then a 500 (the re-sent step's first try).
    inject_fault(server, status=429, count=TRIES, retry_after=0.2)
    inject_fault(server, status=500, count=1)

    async with pipeline_without_model(temporal_client, cart.spec_ref, cart.procedure_ref) as harness:
        with model_worker(temporal_client, tmp_path / "worker", cart.evidence, server.base_url):
            wf = await harness.start(
                model=MODEL_STEPS, outage_backoff_s=0.5, outage_backoff_max_s=1.0, model_outage_allowance_s=600
            )
            state = await harness.wait_phase(wf, Phase.AWAITING_REVIEW, timeout=120)
            await temporal_client.get_workflow_handle(wf).terminate("the test has the proposal")
        record_history(await temporal_client.get_workflow_handle(wf).fetch_history(), "model-outage-waited-out")

    b = state.budgets
    assert b.repair_attempts_used == 1
    assert [c.attempt for c in state.candidates] == [1]
    assert b"line_total(item) for item in items" in cart.store.read_bytes(state.candidates[0].patch_ref)
    # Every faulted request was counted; the workflow waited once, after the step's two tries.
    assert (b.transport_retries, b.outage_waits, b.outage_wait_s) == (3, 1, 0.5)
    assert [u.transport_retries for u in b.attempts] == [3]
    assert b.recent_calls[0].turn == 1 and b.recent_calls[0].transport_retries == 1  # the re-sent step's retry
    server.stop()
    sent = requests_of(request_log(server), wf)
    # The storm hit the same turn of the same attempt, sent again under its own operation ID.
    assert [r["status"] for r in sent[:4]] == [429, 429, 500, 200]
    assert {r["headers"]["x-durafix-op-id"] for r in sent[:4]} == {f"{wf}:repair:1:turn-1"}
    answered = [r for r in sent if r["status"] == 200]
    assert len(answered) == len(b.recent_calls) == b.attempts[0].calls == 6
    assert b.model_prompt_tokens == sum(r["usage"]["prompt_tokens"] for r in answered)
    assert b.attempts[0].tokens == b.model_tokens


async def test_a_storm_that_outlasts_the_outage_allowance_ends_the_run_saying_the_endpoint_was_unavailable(
    tmp_path: Path, cart: StoredCart, temporal_client: Client, serve: Serve
) -> None:
    server = serve(CART_SCRIPTS / "fix.yaml")
    inject_fault(server, status=500, count=1000)

    async with pipeline_without_model(temporal_client, cart.spec_ref, cart.procedure_ref) as harness:
        with model_worker(temporal_client, tmp_path / "worker", cart.evidence, server.base_url):
            wf = await harness.start(
                model=MODEL_STEPS, outage_backoff_s=0.5, outage_backoff_max_s=1.0, model_outage_allowance_s=2
            )
            await harness.ended(wf, timeout=120)
            state = await harness.result(wf)
        record_history(await temporal_client.get_workflow_handle(wf).fetch_history(), "model-outage-allowance-spent")
        pending = httpx.get(f"{server.root_url}/_admin/faults", timeout=10).json()

    assert state.outcome == Outcome.NEEDS_HUMAN_TRIAGE
    assert state.outcome_detail.startswith("the model endpoint was unavailable for ")
    assert "outage allowance of 2 s" in state.outcome_detail and "no repair attempt was spent" in state.outcome_detail
    b = state.budgets
    assert b.repair_attempts_used == 1 and state.candidates == []
    assert b.refusals == b.no_op_patches == 0
    # Each exhausted step failed both its tries; the run ended while the endpoint still failed.
    assert b.transport_retries == TRIES * (b.outage_waits + 1)
    assert pending and pending[0]["count"] == 1000 - b.transport_retries
    assert b.recent_calls == [] and [u.calls for u in b.attempts] == [0]
