"""The first message of each repair attempt carries the run's facts, as the model server receives it.

The real workflow runs on the real Temporal dev server; the model queue runs the real stepped-attempt
activities (real git workspaces from the mirror of a real repository) against the scripted model server
over HTTP; the other queues are the recording doubles of the workflow-logic tests, except that the
procedure and the base reproduction's ``log.json`` are stored as a run stores them (the log written by the
runner's own log writer). Attempt 1 changes the formatting, and verification refuses it (the bug still
reproduces on the candidate); attempt 2 fixes the total. The server's request log shows, in each attempt's
first user message, the check's expected and observed values, the page's errors, the test command and the
baseline, and in attempt 2's, attempt 1's patch summary and why it was refused; a credential the page
showed is redacted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from browser.results import ReproductionStatus
from environments.spec import build_recovery_spec, canonical_json
from environments.workspace import WorkspaceManager
from evidence.interface import ArtifactKind, ArtifactRef
from evidence.local import LocalArtifactStore
from pipeline import steps
from pipeline.activities.model import ModelActivities
from pipeline.state import Phase
from pipeline.steps import (
    PrepareProcedureInput,
    PrepareSpecInput,
    ProcedureResult,
    ReproduceInput,
    ReproduceResult,
    TaskQueue,
)
from repair.procedure_draft import ProcedureDrafter
from reviews.git_credentials import NO_GIT_CREDENTIALS
from tests.integration.workflow.test_workflow_logic import BASE, Harness, Script, doubles
from tests.support.gitrepo import make_repo
from tests.support.modelserver import Serve, recorded, serve
from tests.support.repair import CART_SCRIPTS, engine_for
from tests.support.repair_context import PAGE_EVENTS, cart_log, cart_procedure_json
from tests.support.temporal_workers import pipeline_workers, running

pytestmark = [pytest.mark.slow]

__all__ = ["serve"]  # the scripted model server's fixture

CREDENTIAL = "tok-1f2e3d4c5b6a7980"
ATTEMPT_1_SUMMARY = "format_cents now groups thousands, so large totals display correctly."


async def test_each_attempt_opens_with_the_reproduction_and_the_reasons_earlier_attempts_were_refused(
    tmp_path: Path, temporal_client: Client, serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A credential of the worker's that the page happens to print: it must never reach the model.
    monkeypatch.setenv("DURAFIX_PAGE_TOKEN", CREDENTIAL)
    server = serve(CART_SCRIPTS / "wrong-then-fix.yaml")
    repo = make_repo(tmp_path / "repo")
    store = LocalArtifactStore(tmp_path / "evidence")
    spec = build_recovery_spec("acme/shop", repo.url, repo.base, repo.work)
    spec_ref = store.put_bytes(canonical_json(spec), kind=ArtifactKind.SPEC, run_id="r", name="spec.json")
    procedure_ref = store.put_bytes(
        cart_procedure_json(), kind=ArtifactKind.PROCEDURE, run_id="r", name="procedure.json"
    )
    events = [*PAGE_EVENTS, ("console", {"level": "error", "text": f"auth failed for {CREDENTIAL}"})]
    log_ref = store.put_bytes(
        cart_log(["$23.75", "$23.75"], events=events),
        kind=ArtifactKind.LOG,
        run_id="r",
        name="reproduce-base-log.json",
        revision=BASE,
        media_type="application/json",
    )

    script = Script(fixes_on_attempt=2)
    facts = StoredFacts(spec=spec_ref, procedure=procedure_ref, log=log_ref)
    async with pipeline(temporal_client, script, store, facts, server.base_url, tmp_path / "model") as harness:
        wf = await harness.start()
        state = await harness.wait_phase(wf, Phase.AWAITING_REVIEW, timeout=120)
        await harness.client.get_workflow_handle(wf).terminate("the test has what it needs")

    assert [(c.attempt, c.failure) for c in state.candidates] == [
        (1, "the bug still reproduces on the candidate"),
        (2, None),
    ]
    firsts = {n: first_user_message(recorded(server), f"{wf}:repair:{n}:turn-1") for n in (1, 2)}
    for message in firsts.values():
        assert message.startswith("Bug report: Cart total wrong\n\nsteps\n\n")
        assert f"Reproduction on the base revision {BASE[:12]}: reproduced." in message
        # What the procedure expects of the page while the bug is present, and what the page showed.
        assert '- check 1: expected while the bug is present: the text of "#total" is not "$40.00"' in message
        assert 'observed "$23.75": held (runs 1, 2)' in message
        assert '- "TypeError: item.quantity is undefined"' in message and '- "POST /api/cart: status 500"' in message
        assert f"test command (durafix runs it after you finish): {quoted(spec.recipe.test)}" in message
        assert 'Its result on the base revision: "passed"' in message
        assert CREDENTIAL not in message and '"auth failed for [redacted DURAFIX_PAGE_TOKEN]"' in message
    assert "Earlier attempts" not in firsts[1]
    assert (
        f"- attempt 1: patch summary {quoted(ATTEMPT_1_SUMMARY)}; "
        'refused because: "the bug still reproduces on the candidate"'
    ) in firsts[2]


def first_user_message(records: list[dict[str, Any]], op: str) -> str:
    """The user message of the one request sent under operation ID ``op``."""
    sent = [r for r in records if r["headers"].get("x-durafix-op-id") == op]
    assert len(sent) == 1, [r["headers"].get("x-durafix-op-id") for r in records]
    messages = sent[0]["body"]["messages"]
    assert [m["role"] for m in messages] == ["system", "user"]
    content: str = messages[1]["content"]
    return content


def quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@asynccontextmanager
async def pipeline(
    client: Client, script: Script, store: LocalArtifactStore, refs: StoredFacts, model_url: str, state: Path
) -> AsyncIterator[Harness]:
    """The workflow, the real model activities in this process (state under ``state``), and the doubles for
    the other queues, answering with the stored spec, procedure and base reproduction log of ``refs``."""

    @activity.defn(name=steps.PREPARE_SPEC.name)
    async def prepare_spec(_: PrepareSpecInput) -> ArtifactRef:
        return refs.spec

    @activity.defn(name=steps.PREPARE_PROCEDURE.name)
    async def prepare_procedure(_: PrepareProcedureInput) -> ProcedureResult:
        return ProcedureResult(procedure_ref=refs.procedure)

    @activity.defn(name=steps.REPRODUCE.name)
    async def reproduce(i: ReproduceInput) -> ReproduceResult:
        script.calls.append(("reproduce", i))
        if i.revision == BASE:
            return ReproduceResult(
                status=ReproductionStatus.REPRODUCED,
                detail="",
                artifacts=[refs.log],
                trace_refs=[],
                screenshot_refs=[],
                log_ref=refs.log,
                runs=2,
            )
        attempt = int(i.op_id.split("candidate-")[1].split(":")[0])
        fixed = script.fixes_on_attempt is not None and attempt >= script.fixes_on_attempt
        status = ReproductionStatus.NOT_REPRODUCED if fixed else ReproductionStatus.REPRODUCED
        return ReproduceResult(status=status, detail="", artifacts=[], trace_refs=[], screenshot_refs=[], runs=2)

    replaced: dict[str, Callable[..., Any]] = {
        "prepare_spec": prepare_spec,
        "prepare_procedure": prepare_procedure,
        "reproduce": reproduce,
    }
    acts = doubles(script)
    del acts[TaskQueue.MODEL]
    for queue in (TaskQueue.ENVIRONMENTS, TaskQueue.BROWSER):
        acts[queue] = [replaced.get(a.__name__, a) for a in acts[queue]]
    engine = engine_for(model_url, timeout_s=60.0)
    model = ModelActivities(
        store,
        WorkspaceManager(cache_dir=state / "cache", root=state / "workspaces"),
        lambda: engine,
        lambda: ProcedureDrafter(model_url, "test-key", "durafix-scripted", timeout_s=60.0),
        git_token=NO_GIT_CREDENTIALS,
    )
    with ThreadPoolExecutor(max_workers=2) as executor:
        workers = pipeline_workers(client, acts)
        workers.append(
            Worker(client, task_queue=TaskQueue.MODEL.value, activities=model.all(), activity_executor=executor)
        )
        async with running(workers):
            yield Harness(client, script)


@dataclass(frozen=True)
class StoredFacts:
    spec: ArtifactRef
    procedure: ArtifactRef
    log: ArtifactRef
