"""An environments-queue worker process for the run-tool recovery tests: the real ``env.agent_run``.

``python -m tests.support.workers.run TARGET NAMESPACE STATE_DIR EVIDENCE_DIR SPEC_REF_JSON [HOLD_FILE]``
serves ``durafix-environments`` with the real :class:`~pipeline.activities.agent_runs.AgentRunActivities`
(workspaces rebuilt from the mirror, the local provider's bubblewrap sandbox, the shared evidence store) and
the workflow-logic tests' doubles for the queue's other activities (``env.prepare_spec`` answering the real
spec). It prints ``ready`` once polling and runs until killed.

With ``HOLD_FILE`` (test-only), the first run-tool command that finishes does not return: the worker writes
``HOLD_FILE`` and stalls, the command's work done and its result not yet recorded, so that the test SIGKILLs
it in the middle of a ``run_tests`` call.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from temporalio import activity

from environments.interface import EnvironmentProvider, TestRunResult
from evidence.interface import ArtifactRef
from pipeline import steps
from pipeline.config import DurafixConfig
from pipeline.services import Services
from pipeline.steps import PrepareSpecInput, TaskQueue
from tests.integration.workflow.test_workflow_logic import Script, doubles
from tests.support.workers.serving import serve_queue


class HeldProvider:
    """The real provider, whose first finished ``run_checks`` never returns."""

    def __init__(self, real: EnvironmentProvider, hold_file: Path) -> None:
        self.real = real
        self.hold_file = hold_file

    def run_checks(self, *args: Any, **kwargs: Any) -> TestRunResult:
        result = self.real.run_checks(*args, **kwargs)
        self.hold_file.write_text(f"ran; exit {result.exit_code}; the result is not recorded\n")
        while True:
            time.sleep(60)


async def serve(target: str, namespace: str, state: Path, evidence: Path, spec: ArtifactRef, hold: Path | None) -> None:
    services = Services(DurafixConfig(state_dir=state, evidence_url=evidence.as_uri()))
    runs = services.agent_run_activities()
    if hold is not None:
        real = runs.provider_for
        runs.provider_for = lambda name: HeldProvider(real(name), hold)  # type: ignore[assignment,return-value]

    @activity.defn(name=steps.PREPARE_SPEC.name)
    async def prepare_spec(_: PrepareSpecInput) -> ArtifactRef:
        return spec

    others = [a for a in doubles(Script())[TaskQueue.ENVIRONMENTS] if a.__name__ not in ("prepare_spec", "agent_run")]
    await serve_queue(target, namespace, TaskQueue.ENVIRONMENTS, [*others, prepare_spec, *runs.all()])


if __name__ == "__main__":
    target, namespace, state, evidence, spec_json = sys.argv[1:6]
    hold = Path(sys.argv[6]) if len(sys.argv) > 6 else None
    asyncio.run(serve(target, namespace, Path(state), Path(evidence), ArtifactRef.model_validate_json(spec_json), hold))
