"""``model.agent_command`` on the real parts: bubblewrap, real git workspaces from a mirror, the scripted model
server over HTTP behind the worker's model proxy, and the pinned mini-swe-agent (or a shell agent).

mini-swe-agent fixes the sample bug and its diff comes back as the accepted proposal, charged with exactly the
tokens the model server counted; a shell agent shows what a CLI sees in the sandbox (no worker secret, only
the proxy reachable); a cancelled try kills the CLI's process group.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import ActivityEnvironment

from environments.sandbox import Sandbox, bwrap_problem
from environments.workspace import WorkspaceManager
from evidence.interface import ArtifactRef
from evidence.local import LocalArtifactStore
from infra.cli.demo import issue_text
from infra.modelserver.server import ScriptedModelServer
from pipeline.activities.agent_command import CommandActivities, ModelEndpoint
from pipeline.steps import AgentCommandInput
from repair.agent_command import AgentCommand, ShellAgent
from repair.mini_swe_agent import MiniSweAgent
from reviews.git_credentials import NO_GIT_CREDENTIALS
from tests.conftest import require
from tests.support.agent_steps import spec_of
from tests.support.command_engine import mini_swe_agent
from tests.support.gitrepo import Repo, make_repo
from tests.support.modelserver import Serve, serve
from tests.support.repair import CART_SCRIPTS

pytestmark = [pytest.mark.slow]

__all__ = ["mini_swe_agent", "serve"]

MODEL = "durafix-scripted"
WORKER_KEY = "test-key"


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    problem = bwrap_problem()
    require(problem is None, f"bubblewrap is unusable: {problem}")
    return make_repo(tmp_path / "repo")


def engine(tmp_path: Path, server: ScriptedModelServer, agent: AgentCommand) -> CommandActivities:
    return CommandActivities(
        LocalArtifactStore(tmp_path / "evidence"),
        WorkspaceManager(cache_dir=tmp_path / "state" / "cache", root=tmp_path / "state" / "workspaces"),
        lambda: agent,
        ModelEndpoint(server.base_url, WORKER_KEY, MODEL),
        Sandbox.detect,
        git_token=NO_GIT_CREDENTIALS,
    )


def attempt_input(acts: CommandActivities, repo: Repo, budget: int = 100_000) -> AgentCommandInput:
    spec_ref = spec_of(acts.store, repo, "run-1", "acme/shop")
    title, body = issue_text()
    return AgentCommandInput(
        run_id="run-1",
        op_id="run-1:repair:1",
        attempt=1,
        spec_ref=spec_ref,
        issue_title=title,
        issue_body=body,
        token_budget=budget,
    )


def activity_env() -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, start_to_close_timeout=timedelta(seconds=300))
    return env


def request_log(server: ScriptedModelServer) -> list[dict[str, object]]:
    path = server.data_dir / "requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_mini_swe_agent_fixes_the_cart_and_its_diff_is_the_accepted_proposal(
    tmp_path: Path, repo: Repo, serve: Serve, mini_swe_agent: Path
) -> None:
    server = serve(CART_SCRIPTS / "mini-swe-agent-fix.yaml")
    acts = engine(tmp_path, server, MiniSweAgent(mini_swe_agent))
    beats: list[object] = []
    env = activity_env()
    env.on_heartbeat = lambda *details: beats.extend(details)

    proposal = env.run(acts.agent_command, attempt_input(acts, repo))

    patch = acts.store.read_bytes(proposal.patch_ref).decode()
    assert "+    return sum(line_total(item) for item in items)" in patch
    assert proposal.files_changed == ["cart.py"]
    assert "line_total(item)" in proposal.summary  # the agent's submission
    assert proposal.log_ref is not None and "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" not in proposal.summary
    server.stop()
    records = request_log(server)
    # Three replies (look, fix and test, submit), each forwarded once with the attempt's operation ID and the
    # worker's key, which the agent never had.
    assert [r["status"] for r in records] == [200, 200, 200]
    assert {r["headers"]["x-durafix-op-id"] for r in records} == {"run-1:repair:1"}  # type: ignore[index]
    assert "Cart total is wrong" in json.dumps(records[0]["body"])
    assert proposal.prompt_tokens == sum(r["usage"]["prompt_tokens"] for r in records)  # type: ignore[index]
    assert proposal.completion_tokens == sum(r["usage"]["completion_tokens"] for r in records)  # type: ignore[index]
    assert any(isinstance(b, dict) and b.get("spent", {}).get("prompt_tokens") for b in beats), beats
    assert not any((tmp_path / "state" / "workspaces").rglob("cart.py"))  # the scratch workspace is gone


def test_a_shell_agent_sees_no_worker_secret_and_reaches_only_the_proxy(
    tmp_path: Path, repo: Repo, serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = serve(CART_SCRIPTS / "mini-swe-agent-fix.yaml")
    monkeypatch.setenv("DURAFIX_FORGE_TOKEN", "forge-secret-value")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3-secret-value")
    probe = (
        "import json, os, socket, urllib.request\n"
        "def reach(port):\n"
        "    try:\n"
        "        socket.create_connection(('127.0.0.1', port), timeout=2).close(); return True\n"
        "    except OSError:\n"
        "        return False\n"
        "req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', data=json.dumps("
        "{'model': 'x', 'messages': [{'role': 'system', 'content': 'mswea_bash_command'},"
        " {'role': 'user', 'content': 'Cart total is wrong'}]}).encode(), headers={"
        "'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], 'Content-Type': 'application/json'})\n"
        "answer = json.load(urllib.request.urlopen(req))\n"
        f"model_port = {int(server.root_url.rsplit(':', 1)[1])}\n"
        "out = {'env': dict(os.environ), 'model_server': reach(model_port), 'answer': answer['model']}\n"
        "open('probe.json', 'w').write(json.dumps(out))\n"
    )
    (tmp_path / "probe.py").write_text(probe)
    agent = ShellAgent(f"/usr/bin/python3 {tmp_path / 'probe.py'}", read_only=(tmp_path,))
    acts = engine(tmp_path, server, agent)

    proposal = activity_env().run(acts.agent_command, attempt_input(acts, repo))

    patch = acts.store.read_bytes(proposal.patch_ref).decode()
    assert proposal.files_changed == ["probe.json"]
    seen = json.loads("".join(line[1:] for line in patch.splitlines() if line.startswith("+{")))
    assert seen["answer"] == MODEL  # the proxy answered with the worker's model
    assert seen["model_server"] is False  # the model server itself is out of reach
    env = seen["env"]
    assert env["OPENAI_API_KEY"].startswith("durafix-attempt-") and env["OPENAI_API_KEY"] != WORKER_KEY
    assert "forge-secret-value" not in json.dumps(env) and "s3-secret-value" not in json.dumps(env)
    assert not {k for k in env if k.startswith(("AWS_", "DURAFIX_FORGE"))}


def test_what_a_failing_agent_printed_is_stored_redacted_and_named_never_quoted(
    tmp_path: Path, repo: Repo, serve: Serve
) -> None:
    server = serve(CART_SCRIPTS / "mini-swe-agent-fix.yaml")
    # The agent prints what a hostile repository's code could print, the attempt's own key among it, then fails.
    agent = ShellAgent('echo "SENTINEL-OUTPUT $OPENAI_API_KEY"; exit 3')
    acts = engine(tmp_path, server, agent)

    with pytest.raises(ApplicationError) as failed:
        activity_env().run(acts.agent_command, attempt_input(acts, repo))

    assert failed.value.type == "NoPatch"
    assert failed.value.message == "command exited 3; its output is stored as attempt-1-command.log"
    named = [d["log_ref"] for d in failed.value.details if isinstance(d, dict) and "log_ref" in d]
    assert len(named) == 1
    log = acts.store.read_bytes(ArtifactRef.model_validate(named[0])).decode()
    assert "SENTINEL-OUTPUT" in log and "durafix-attempt-" not in log  # the try's proxy key is redacted


def test_a_cancelled_attempt_kills_the_agent_process_group(tmp_path: Path, repo: Repo, serve: Serve) -> None:
    server = serve(CART_SCRIPTS / "mini-swe-agent-fix.yaml")
    marker = "317.25"  # a sleep no other process runs
    acts = engine(tmp_path, server, ShellAgent(f"sleep {marker} & sleep {marker}"))
    env = activity_env()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            env.run(acts.agent_command, attempt_input(acts, repo))
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 30
    # Both sleeps, the shell's background one and its own: the first can be seen before the second has started.
    while len(sleepers(marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(sleepers(marker)) == 2
    env.cancel()
    thread.join(timeout=30)

    assert not thread.is_alive()
    assert len(failed) == 1 and isinstance(failed[0], CancelledError | ApplicationError), failed
    assert sleepers(marker) == []


def sleepers(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmdline[:2] == [b"sleep", marker.encode()]:
                found.append(int(entry))
    return found
