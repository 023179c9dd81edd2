"""A model worker SIGKILLed while mini-swe-agent runs: the attempt's agent is re-run from the base revision.

The real workflow on the real Temporal dev server, with ``engine: command`` in its policy; the model queue is
served by worker processes (:mod:`tests.support.workers.command`: mini-swe-agent in bubblewrap behind the model
proxy, real git workspaces, the scripted model server over HTTP); the other queues are the recording doubles
of the workflow-logic tests. The model server holds the agent's second request; while it is held the worker
dies, taking the agent's sandbox with it. A new worker on another state directory takes the retry, rebuilds
the workspace at the base revision (the last one recorded: the dead agent's conversation and half-made edits
were not) and runs the agent again from its first request. The attempt is not reported interrupted: it ends
with the same fix, as attempt 1, and nothing of the dead try is left running.
"""

from __future__ import annotations

import asyncio
import collections
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import Client

from pipeline.inputs import RepairInput
from pipeline.policies import RunPolicy
from pipeline.state import Phase
from pipeline.steps import TaskQueue
from pipeline.workflow import RepairBugWorkflow
from tests.support.command_engine import mini_swe_agent
from tests.support.modelserver import Serve, inject_fault, serve
from tests.support.proctree import descendants
from tests.support.repair import CART_SCRIPTS
from tests.support.stepped import (
    StoredCart,
    killed,
    pipeline_without_model,
    request_log,
    wait_until_held,
    worker_process,
)

pytestmark = [pytest.mark.slow]

__all__ = ["mini_swe_agent", "serve"]

HELD_REQUEST = 2  # of the agent's three: after it looked at the code, while it asks for the fix


@contextmanager
def command_worker(
    client: Client, state: Path, evidence: Path, base_url: str, venv: Path
) -> Iterator[subprocess.Popen[str]]:
    """A model-queue worker process running the agent from ``venv``; killed (if still alive) at the end."""
    with worker_process("tests.support.workers.command", client, state, [str(evidence), base_url, str(venv)]) as proc:
        yield proc


def agent_processes(venv: Path) -> list[int]:
    """Processes running the agent from ``venv`` (its interpreter's command line names the venv's ``mini``)."""
    found = []
    needle = str(venv / "bin" / "mini").encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


async def test_a_worker_killed_while_the_agent_runs_reruns_the_agent_from_the_base_revision(
    tmp_path: Path,
    cart: StoredCart,
    temporal_client: Client,
    serve: Serve,
    mini_swe_agent: Path,
) -> None:
    server = serve(CART_SCRIPTS / "mini-swe-agent-fix.yaml")

    async with pipeline_without_model(temporal_client, cart.spec_ref, cart.procedure_ref) as harness:
        wf = "repair:acme/shop#4242"
        await temporal_client.start_workflow(
            RepairBugWorkflow.run,
            RepairInput(
                repository="acme/shop",
                issue_number=4242,
                policy=RunPolicy.fast().model_copy(update={"engine": "command"}),
            ),
            id=wf,
            task_queue=TaskQueue.ORCHESTRATION.value,
            execution_timeout=timedelta(minutes=6),
        )
        inject_fault(server, delay_s=25, after=HELD_REQUEST - 1)
        with command_worker(
            temporal_client, tmp_path / "doomed", cart.evidence, server.base_url, mini_swe_agent
        ) as doomed:
            await wait_until_held(server, timeout=120)
            # Only the doomed worker's own agent: other tests may run agents from the same shared venv at once.
            running = [p for p in descendants(doomed.pid) if p.pid in agent_processes(mini_swe_agent)]
            assert running, "the agent is not running while its request is held"
            killed(doomed)
        # The dead worker's forwarder and sandbox went with it: nothing of the agent is left running.
        deadline = time.monotonic() + 10
        while any(p.alive() for p in running) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert [p.pid for p in running if p.alive()] == []
        with command_worker(temporal_client, tmp_path / "survivor", cart.evidence, server.base_url, mini_swe_agent):
            state = await harness.wait_phase(wf, Phase.AWAITING_REVIEW, timeout=240)
        await temporal_client.get_workflow_handle(wf).terminate("the test has the proposal")

    assert [c.attempt for c in state.candidates] == [1]  # the same attempt, not reported interrupted
    patch = cart.store.read_bytes(state.candidates[0].patch_ref)
    assert b"+    return sum(line_total(item) for item in items)" in patch
    server.stop()
    records = [r for r in request_log(server) if r["headers"].get("x-durafix-op-id") == f"{wf}:repair:1"]
    # The dead agent sent its first request and the held second; the re-run agent started over: its first
    # request again, then the second and third.
    turns = collections.Counter(r["turn"] for r in records)
    assert turns == {0: 2, 1: 2, 2: 1}, turns
    answered = [r for r in records if "fault" not in r]
    survivor = answered[-3:]
    charged = state.budgets.model_prompt_tokens + state.budgets.model_completion_tokens
    # The run is charged for every request of the re-run, and for the dead try's only what its last heartbeat
    # carried (its held request's answer went to a dead socket).
    assert sum(r["usage"]["total_tokens"] for r in survivor) <= charged
    assert charged <= sum(r["usage"]["total_tokens"] for r in answered)
