"""One demo run, driven from outside as a user and a reviewer would: through the forge's API only."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus

from infra.forge.testing import client as forge_client
from pipeline import client as runs
from pipeline.config import DurafixConfig
from pipeline.ids import branch_for, workflow_id_for
from pipeline.state import RunState


class DemoFailed(RuntimeError):
    """The demo's run did not reach an end in time."""


class DemoRun:
    def __init__(self, config: DurafixConfig, repository: str, reviewer_token: str) -> None:
        self.config = config
        self.repository = repository
        self.reviewer = forge_client(config.forge_api_url, reviewer_token)
        self.bot = forge_client(config.forge_api_url, config.forge_token)

    def run(self, title: str, body: str, *, quiet: bool, timeout_s: float = 600) -> dict[str, Any]:
        return asyncio.run(self._run(title, body, quiet=quiet, timeout_s=timeout_s))

    async def _run(self, title: str, body: str, *, quiet: bool, timeout_s: float) -> dict[str, Any]:
        started = time.monotonic()
        client = await runs.connect(self.config)
        repo = self.bot.get_repo(self.repository)
        issue = repo.create_issue(title=title, body=body, labels=[self.config.trigger_label])
        workflow_id = workflow_id_for(self.repository, issue.number)
        self._say(quiet, f"opened issue #{issue.number} with label {self.config.trigger_label!r}: {title}")
        state = await self._wait(client, workflow_id, started, timeout_s, quiet, until_review=True)
        approved_sha = None
        if state.pending_approval is not None:
            pr_number = state.pending_approval.pr_number
            pr = self.reviewer.get_repo(self.repository).get_pull(pr_number)
            approved_sha = pr.head.sha
            self._say(quiet, f"reviewer approves PR #{pr_number} at {approved_sha[:12]} through the forge")
            pr.create_review(commit=repo.get_commit(approved_sha), event="APPROVE", body="Evidence checks out.")
            state = await self._wait(client, workflow_id, started, timeout_s, quiet, until_review=False)
        return self._result(state, workflow_id, issue.number, approved_sha, time.monotonic() - started)

    async def _wait(
        self, client: Client, workflow_id: str, started: float, timeout_s: float, quiet: bool, *, until_review: bool
    ) -> RunState:
        last = ""
        async for status, state in runs.polled_states(client, workflow_id, started + timeout_s):
            line = state.phase.value + (f" -> {state.outcome.value}" if state.outcome else "")
            if line != last:
                self._say(quiet, f"[{time.monotonic() - started:6.1f}s] {line}")
                last = line
            if status != WorkflowExecutionStatus.RUNNING:
                return state
            if until_review and state.pending_approval is not None:
                return state
        raise DemoFailed(f"the run did not finish within {timeout_s:.0f}s (last phase {last})")

    def _result(
        self, state: RunState, workflow_id: str, issue: int, approved_sha: str | None, seconds: float
    ) -> dict[str, Any]:
        from pipeline.services import Services

        footprint = Services(self.config).forge(self.repository).footprint(workflow_id, issue)
        publish = state.publish
        return {
            "workflow_id": workflow_id,
            "outcome": state.outcome.value if state.outcome else None,
            "detail": state.outcome_detail,
            "ticket": state.ticket.url if state.ticket else None,
            "branch": branch_for(workflow_id) if publish else None,
            "pr": publish.pr_url if publish else None,
            "approved_sha": state.approval.head_sha if state.approval else approved_sha,
            "merged_sha": state.merged_sha,
            "evidence_digest": publish.evidence_digest if publish else None,
            "evidence": [
                {"name": r.name, "kind": str(r.kind), "sha256": r.sha256, "key": r.key, "revision": r.revision}
                for r in state.evidence
            ],
            "report_url": publish.report_url if publish else None,
            "tickets": len(footprint.tickets),
            "prs": len(footprint.pull_requests),
            "evidence_comments": len(footprint.evidence_comments),
            "branches": len(footprint.branches),
            "fix_in_merged_commit": self._fix_merged(state),
            "seconds": round(seconds, 1),
        }

    def _fix_merged(self, state: RunState) -> bool | None:
        """Whether ``main``, cloned over git, is the merged commit and contains the verified candidate."""
        if state.merged_sha is None or state.publish is None:
            return None
        import subprocess
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                ["git", "clone", "-q", self.config.clone_url(self.repository), tmp], check=True, capture_output=True
            )
            head = subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=tmp, check=True, capture_output=True, text=True
            ).stdout.strip()
            contains = subprocess.run(
                ["git", "merge-base", "--is-ancestor", state.publish.commit, "HEAD"], cwd=tmp, capture_output=True
            )
        return head == state.merged_sha and contains.returncode == 0

    @staticmethod
    def _say(quiet: bool, msg: str) -> None:
        if not quiet:
            print(f"demo: {msg}", file=sys.stderr, flush=True)
