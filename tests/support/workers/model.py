"""A model-queue worker process for the recovery tests: the real model activities on a real Temporal server.

``python -m tests.support.workers.model TARGET NAMESPACE STATE_DIR EVIDENCE_DIR MODEL_BASE_URL [HOLD_FILE]`` serves
``durafix-model`` with :class:`~pipeline.activities.model.ModelActivities` (the stepped attempt's steps and
``model.propose_patch``) over its own state directory (mirror cache, workspaces) and the shared evidence
store, talking to the scripted model server. It prints ``ready`` once polling, and runs until killed: the
tests SIGKILL it mid-step. With ``HOLD_FILE`` (test-only), the first tool batch that edits a file stalls
after its edits are on disk and before it returns, having written ``HOLD_FILE``: a worker to kill in the
middle of a replay-safe tool call.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from environments.workspace import WorkspaceManager
from evidence.local import LocalArtifactStore
from pipeline.activities import agent
from pipeline.activities.model import ModelActivities
from pipeline.steps import TaskQueue
from repair import stepping
from repair.openai_engine import OpenAIToolEngine
from repair.procedure_draft import ProcedureDrafter
from repair.workspace_tools import WorkspaceTools
from reviews.git_credentials import NO_GIT_CREDENTIALS
from tests.support.workers.serving import serve_queue

MODEL = "durafix-scripted"
API_KEY = "test-key"


async def serve(target: str, namespace: str, state: Path, evidence: Path, base_url: str) -> None:
    engine = OpenAIToolEngine(base_url, API_KEY, MODEL, timeout_s=120.0)
    model = ModelActivities(
        LocalArtifactStore(evidence),
        WorkspaceManager(cache_dir=state / "cache", root=state / "workspaces"),
        lambda: engine,
        lambda: ProcedureDrafter(base_url, API_KEY, MODEL, timeout_s=120.0),
        git_token=NO_GIT_CREDENTIALS,
    )
    await serve_queue(target, namespace, TaskQueue.MODEL, model.all())


def hold_after_first_edit(hold_file: Path) -> None:
    real = stepping.tool_batch

    def held(workspace: WorkspaceTools, calls: Sequence[stepping.ToolCall]) -> stepping.BatchOutcome:
        outcome = real(workspace, list(calls))
        if any(c.name in ("replace_in_file", "write_file") for c in calls):
            hold_file.write_text("the edits are on disk; the batch has not returned\n")
            while True:
                time.sleep(60)
        return outcome

    setattr(agent, "tool_batch", held)  # noqa: B010 - replaces the module's binding, as a patch would


if __name__ == "__main__":
    target, namespace, state, evidence, base_url = sys.argv[1:6]
    if len(sys.argv) > 6:
        hold_after_first_edit(Path(sys.argv[6]))
    asyncio.run(serve(target, namespace, Path(state), Path(evidence), base_url))
