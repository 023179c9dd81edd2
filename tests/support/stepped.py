"""Helpers of the stepped attempt's recovery test and benchmark: model workers in their own processes, the
rest of the pipeline as recording doubles, and reading the scripted model server's state.

A model worker is :mod:`tests.support.workers.model` in a subprocess (so it can be SIGKILLed) on its own
state directory; the workflow and the other queues run in the calling process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from temporalio import activity
from temporalio.client import Client

from evidence.interface import ArtifactKind, ArtifactRef, ArtifactStore
from evidence.local import LocalArtifactStore
from infra.modelserver.server import ScriptedModelServer
from pipeline import steps
from pipeline.state import Phase, RunState
from pipeline.steps import PrepareProcedureInput, PrepareSpecInput, ProcedureResult, TaskQueue
from tests.integration.workflow.test_workflow_logic import Harness, Script, doubles
from tests.support import agent_steps
from tests.support.gitrepo import Repo
from tests.support.repair_context import cart_procedure_json
from tests.support.temporal_workers import pipeline_workers, running

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def stored_cart_run(store: ArtifactStore, repo: Repo, run_id: str = "r") -> tuple[ArtifactRef, ArtifactRef]:
    """The cart run's recovery spec (of ``repo``'s base) and procedure in ``store``, as ``env.prepare_spec`` and
    ``browser.prepare_procedure`` store them: the references the workflow's doubles answer with."""
    spec_ref = agent_steps.spec_of(store, repo, run_id, "acme/shop")
    procedure = cart_procedure_json()
    procedure_ref = store.put_bytes(procedure, kind=ArtifactKind.PROCEDURE, run_id=run_id, name="procedure.json")
    return spec_ref, procedure_ref


@dataclass(frozen=True)
class StoredCart:
    """The cart run's spec and procedure (:func:`stored_cart_run`) in ``store``, the evidence store at ``evidence``
    that the test's worker processes store in too."""

    evidence: Path
    store: LocalArtifactStore
    spec_ref: ArtifactRef
    procedure_ref: ArtifactRef


@contextmanager
def model_worker(
    client: Client, state: Path, evidence: Path, base_url: str, hold_file: Path | None = None
) -> Iterator[subprocess.Popen[str]]:
    """A model-queue worker process on its own state directory; killed (if still alive) at the end. With
    ``hold_file`` its first tool batch that edits stalls once the edits are on disk (see the module)."""
    extra = [str(hold_file)] if hold_file is not None else []
    with worker_process("tests.support.workers.model", client, state, [str(evidence), base_url, *extra]) as proc:
        yield proc


@contextmanager
def run_worker(
    client: Client, state: Path, evidence: Path, spec_ref: ArtifactRef, hold_file: Path | None = None
) -> Iterator[subprocess.Popen[str]]:
    """An environments-queue worker process with the real ``env.agent_run`` (:mod:`tests.support.workers.run`);
    with ``hold_file`` its first finished run-tool command stalls before its result is recorded."""
    extra = [str(hold_file)] if hold_file is not None else []
    with worker_process(
        "tests.support.workers.run", client, state, [str(evidence), spec_ref.model_dump_json(), *extra]
    ) as proc:
        yield proc


@contextmanager
def worker_process(module: str, client: Client, state: Path, args: list[str]) -> Iterator[subprocess.Popen[str]]:
    """``python -m module TARGET NAMESPACE STATE *args``, once it printed ``ready``; killed at the end."""
    log_path = state.parent / f"{state.name}.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", module, client.service_client.config.target_host, client.namespace, str(state), *args],
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", log_path.read_text()
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        log.close()


def killed(worker: subprocess.Popen[str]) -> None:
    """SIGKILL ``worker`` (a :func:`worker_process`); it has died of it."""
    worker.send_signal(signal.SIGKILL)
    assert worker.wait(timeout=10) == -signal.SIGKILL


async def proposal_of(harness: Harness, wf: str, store: ArtifactStore, timeout: float) -> tuple[bytes, RunState]:
    """The patch of the run's one candidate (attempt 1) once it awaits review, and its state; the run is then
    terminated."""
    state = await harness.wait_phase(wf, Phase.AWAITING_REVIEW, timeout=timeout)
    await harness.client.get_workflow_handle(wf).terminate("the test has the proposal")
    assert [c.attempt for c in state.candidates] == [1]
    return store.read_bytes(state.candidates[0].patch_ref), state


async def wait_for_file(path: Path, timeout: float = 120) -> None:
    """Until ``path`` exists (a held worker wrote it)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path.name} never appeared: the step to hold never ran")
        await asyncio.sleep(0.1)


@asynccontextmanager
async def pipeline_without_model(
    client: Client,
    spec_ref: ArtifactRef,
    procedure_ref: ArtifactRef,
    workflows: Sequence[type] = (),
    *,
    environments: bool = True,
) -> AsyncIterator[Harness]:
    """The workflow (and ``workflows``) and every queue but the model's (recording doubles; the spec and the
    procedure are stored ones, as the model worker reads both for an attempt's first message); without the
    environments queue too unless ``environments`` (a :func:`run_worker` serves it)."""
    script = Script()
    acts = doubles(script)
    del acts[TaskQueue.MODEL]
    if not environments:
        del acts[TaskQueue.ENVIRONMENTS]
    answer_stored(acts, spec_ref, procedure_ref)
    async with running(pipeline_workers(client, acts, workflows)):
        yield Harness(client, script)


def answer_stored(
    acts: dict[TaskQueue, list[Callable[..., Any]]], spec_ref: ArtifactRef, procedure_ref: ArtifactRef
) -> None:
    """In the doubles ``acts``, ``env.prepare_spec`` (where ``acts`` serves the environments queue) and
    ``browser.prepare_procedure`` answer with the stored ``spec_ref`` and ``procedure_ref``: the model worker
    reads both for an attempt's first message, and the doubles' own are not stored."""

    @activity.defn(name=steps.PREPARE_SPEC.name)
    async def prepare_spec(_: PrepareSpecInput) -> ArtifactRef:
        return spec_ref

    @activity.defn(name=steps.PREPARE_PROCEDURE.name)
    async def prepare_procedure(_: PrepareProcedureInput) -> ProcedureResult:
        return ProcedureResult(procedure_ref=procedure_ref)

    if TaskQueue.ENVIRONMENTS in acts:
        acts[TaskQueue.ENVIRONMENTS] = [a for a in acts[TaskQueue.ENVIRONMENTS] if a.__name__ != "prepare_spec"]
        acts[TaskQueue.ENVIRONMENTS].append(prepare_spec)
    acts[TaskQueue.BROWSER] = [a for a in acts[TaskQueue.BROWSER] if a.__name__ != "prepare_procedure"]
    acts[TaskQueue.BROWSER].append(prepare_procedure)


async def wait_until_held(server: ScriptedModelServer, timeout: float = 60) -> None:
    """Until the delay fault was taken: the request it holds is in flight."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            if (await http.get(f"{server.root_url}/_admin/faults")).json() == []:
                return
            await asyncio.sleep(0.1)
    raise AssertionError("the model request to hold never came")


def requests_of(records: list[dict[str, Any]], wf: str) -> list[dict[str, Any]]:
    return [r for r in records if r["headers"].get("x-durafix-op-id", "").startswith(f"{wf}:repair:")]


def body_of(record: dict[str, Any]) -> str:
    return json.dumps(record["body"], sort_keys=True)


def request_log(server: ScriptedModelServer) -> list[dict[str, Any]]:
    """Every request the server recorded, from its log file (readable after ``stop()``)."""
    path = server.data_dir / "requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
