"""A model-queue worker process serving the external agent engine, for the recovery test.

``python -m tests.support.workers.command TARGET NAMESPACE STATE_DIR EVIDENCE_DIR MODEL_BASE_URL VENV`` serves
``model.agent_command`` (mini-swe-agent from ``VENV``, bubblewrap, real git workspaces under its own state
directory, the shared evidence store, the scripted model server). It prints ``ready`` once polling and runs
until killed: the test SIGKILLs it while the agent runs.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from environments.sandbox import Sandbox
from environments.workspace import WorkspaceManager
from evidence.local import LocalArtifactStore
from pipeline.activities.agent_command import CommandActivities, ModelEndpoint
from pipeline.steps import TaskQueue
from repair.mini_swe_agent import MiniSweAgent
from reviews.git_credentials import NO_GIT_CREDENTIALS
from tests.support.workers.serving import serve_queue

MODEL = "durafix-scripted"
API_KEY = "test-key"


async def serve(target: str, namespace: str, state: Path, evidence: Path, base_url: str, venv: Path) -> None:
    agent = MiniSweAgent(venv)
    acts = CommandActivities(
        LocalArtifactStore(evidence),
        WorkspaceManager(cache_dir=state / "cache", root=state / "workspaces"),
        lambda: agent,
        ModelEndpoint(base_url, API_KEY, MODEL),
        Sandbox.detect,
        git_token=NO_GIT_CREDENTIALS,
    )
    await serve_queue(target, namespace, TaskQueue.MODEL, acts.all())


if __name__ == "__main__":
    target, namespace, state, evidence, base_url, venv = sys.argv[1:7]
    asyncio.run(serve(target, namespace, Path(state), Path(evidence), base_url, Path(venv)))
