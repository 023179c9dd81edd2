"""A model-queue worker process serving the external agent engine, for the recovery test.

``python -m tests.support.workers.command TARGET NAMESPACE STATE_DIR EVIDENCE_DIR MODEL_BASE_URL VENV`` serves
``model.agent_command`` (mini-swe-agent from ``VENV``, bubblewrap, real git workspaces under its own state
directory, the shared evidence store, the scripted model server). It prints ``ready`` once polling and runs
until killed: the test SIGKILLs it while the agent runs.
"""

from __future__ import annotations

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from environments.sandbox import Sandbox
from environments.workspace import WorkspaceManager
from evidence.local import LocalArtifactStore
from pipeline.activities.agent_command import CommandActivities, ModelEndpoint
from pipeline.steps import TaskQueue
from repair.mini_swe_agent import MiniSweAgent
from reviews.git_credentials import NO_GIT_CREDENTIALS

MODEL = "durafix-scripted"
API_KEY = "test-key"


async def serve(target: str, namespace: str, state: Path, evidence: Path, base_url: str, venv: Path) -> None:
    client = await Client.connect(target, namespace=namespace, data_converter=pydantic_data_converter)
    agent = MiniSweAgent(venv)
    acts = CommandActivities(
        LocalArtifactStore(evidence),
        WorkspaceManager(cache_dir=state / "cache", root=state / "workspaces"),
        lambda: agent,
        ModelEndpoint(base_url, API_KEY, MODEL),
        Sandbox.detect,
        git_token=NO_GIT_CREDENTIALS,
    )
    with ThreadPoolExecutor(max_workers=4) as executor:
        worker = Worker(client, task_queue=TaskQueue.MODEL.value, activities=acts.all(), activity_executor=executor)
        print("ready", flush=True)
        await worker.run()


if __name__ == "__main__":
    target, namespace, state, evidence, base_url, venv = sys.argv[1:7]
    asyncio.run(serve(target, namespace, Path(state), Path(evidence), base_url, Path(venv)))
