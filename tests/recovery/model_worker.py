"""A model-queue worker process for the recovery tests: the real model activities on a real Temporal server.

``python -m tests.recovery.model_worker TARGET NAMESPACE STATE_DIR EVIDENCE_DIR MODEL_BASE_URL`` serves
``durafix-model`` with :class:`~pipeline.activities.model.ModelActivities` (the stepped attempt's steps and
``model.propose_patch``) over its own state directory (mirror cache, workspaces) and the shared evidence
store, talking to the scripted model server. It prints ``ready`` once polling, and runs until killed: the
tests SIGKILL it mid-step.
"""

from __future__ import annotations

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from environments.workspace import WorkspaceManager
from evidence.local import LocalArtifactStore
from pipeline.activities.model import ModelActivities
from pipeline.steps import TaskQueue
from repair.openai_engine import OpenAIToolEngine
from repair.procedure_draft import ProcedureDrafter

MODEL = "durafix-scripted"
API_KEY = "test-key"


async def serve(target: str, namespace: str, state: Path, evidence: Path, base_url: str) -> None:
    client = await Client.connect(target, namespace=namespace, data_converter=pydantic_data_converter)
    engine = OpenAIToolEngine(base_url, API_KEY, MODEL, timeout_s=120.0)
    model = ModelActivities(
        LocalArtifactStore(evidence),
        WorkspaceManager(cache_dir=state / "cache", root=state / "workspaces"),
        lambda: engine,
        lambda: ProcedureDrafter(base_url, API_KEY, MODEL, timeout_s=120.0),
        git_token=None,
    )
    with ThreadPoolExecutor(max_workers=4) as executor:
        worker = Worker(client, task_queue=TaskQueue.MODEL.value, activities=model.all(), activity_executor=executor)
        print("ready", flush=True)
        await worker.run()


if __name__ == "__main__":
    target, namespace, state, evidence, base_url = sys.argv[1:6]
    asyncio.run(serve(target, namespace, Path(state), Path(evidence), base_url))
