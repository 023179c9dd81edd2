"""repair_bug end to end with ``engine: command``: mini-swe-agent writes the fix, the rest is the same pipeline.

The embedded stack (Temporal, the GitHub emulator over HTTP, webhooks, the scripted model server, the local
provider in bubblewrap, Chromium), one ``durafix worker`` whose configuration says ``DURAFIX_ENGINE=command``
and ``DURAFIX_ENGINE_COMMAND=mini-swe-agent``. The report is the sample's; the agent's diff passes the same
patch policy, the same verification (the app's tests and the browser replay on the candidate), and is
published as the same draft PR.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pipeline.state import Phase
from tests.e2e.test_pipeline import awaiting_review, state_when
from tests.replay.record import record_history
from tests.support.chromium import chromium_path
from tests.support.command_engine import mini_swe_agent
from tests.support.e2e_stack import MODEL_DIR, E2EStack, running_e2e_stack

pytestmark = [pytest.mark.slow, pytest.mark.browser]

__all__ = ["mini_swe_agent"]


def command_model_script(dest: Path) -> Path:
    """Procedure drafting as scripted, and the cart fix in mini-swe-agent's form."""
    conversations = []
    for name in ("draft-procedure.yaml", "mini-swe-agent-fix.yaml"):
        conversations += yaml.safe_load((MODEL_DIR / name).read_text())["conversations"]
    dest.write_text(yaml.safe_dump({"model": "durafix-scripted", "conversations": conversations}))
    return dest


@pytest.fixture
def command_stack(
    tmp_path_factory: pytest.TempPathFactory, mini_swe_agent: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[E2EStack]:
    chromium_path()
    state = tmp_path_factory.mktemp("durafix-command-e2e")
    # Set before the stack starts: the receiver, which starts the runs, reads its configuration once.
    monkeypatch.setenv("DURAFIX_ENGINE", "command")
    monkeypatch.setenv("DURAFIX_ENGINE_COMMAND", "mini-swe-agent")
    monkeypatch.setenv("DURAFIX_TOOLS_DIR", str(mini_swe_agent.parent))
    with running_e2e_stack(state, model_script=command_model_script(state / "model-script.yaml")) as e2e:
        e2e.spawn_worker()
        yield e2e


async def test_mini_swe_agent_fixes_the_sample_bug_through_validation_and_verification(
    command_stack: E2EStack,
) -> None:
    client, repository, _, wf = await command_stack.open_run()

    state = await state_when(client, wf, awaiting_review)

    assert state.pending_approval is not None, state.outcome_detail
    assert state.phase == Phase.AWAITING_REVIEW
    # What each candidate was and how it ended, should there be more than one (an attempt that failed first).
    tried = [(c.attempt, c.verification, c.summary[:300]) for c in state.candidates]
    assert len(state.candidates) == 1, (tried, state.timeline[-20:])
    [candidate] = state.candidates
    assert candidate.attempt == 1 and candidate.verification == "passed"
    assert "line_total(item)" in candidate.summary  # mini-swe-agent's submission
    assert state.reproduction is not None and state.reproduction.status == "reproduced"
    assert state.budgets.model_prompt_tokens > 0
    branch = command_stack.github().get_repo(repository).get_pull(state.pending_approval.pr_number).head.ref
    with tempfile.TemporaryDirectory() as tmp:
        url = command_stack.config.clone_url(repository)
        subprocess.run(["git", "clone", "-q", "--depth", "1", "-b", branch, url, tmp], check=True, capture_output=True)
        assert "line_total(item) for item in items" in (Path(tmp) / "cart.py").read_text()
    record_history(await client.get_workflow_handle(wf).fetch_history(), "command-engine-awaiting-review")
