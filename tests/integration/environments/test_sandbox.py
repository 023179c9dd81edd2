"""The bubblewrap sandbox itself, on real commands: what a command inside sees, may write and may reach, that
nothing it starts outlives it, and the refusal (or the operator's explicit unsandboxed mode) without bwrap."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.commands import run_to_completion
from environments.interface import EnvironmentError, RecoverySpec
from environments.local import LocalProcessProvider
from environments.processes import MARKER_VAR, owned_pids
from environments.sandbox import UNSANDBOXED, WORKSPACE, Network, Sandbox, SandboxUnavailableError, bwrap_problem
from environments.secrets import SecretRefusedError, check_allowlist, resolve_secrets
from environments.spec import load_recipe
from pipeline import messages
from pipeline.config import load_config
from pipeline.state import EnvironmentFact, EnvironmentState
from tests.integration.workflow.test_workflow_logic import ref
from tests.support.gitrepo import CART_APP
from tests.support.sandbox import sandbox
from tests.support.served import accepting
from tests.unit.pipeline.test_messages import state

__all__ = ["sandbox"]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "state" / "workspaces" / "ws"
    ws.mkdir(parents=True)
    (tmp_path / "state" / "config.json").write_text('{"forge_token": "next-to-the-workspace"}')
    return ws


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bytes]]]:
    seen: list[bytes] = []

    def record(conn: socket.socket) -> None:
        with conn:
            seen.append(conn.recv(64))

    with accepting(record) as port:
        yield port, seen


def run(sandbox: Sandbox, ws: Path, command: str, *, network: Network = Network.NONE, marker: str = "t/x") -> str:
    log = ws.parent / "out.log"
    log.unlink(missing_ok=True)
    env = {"PATH": "/usr/bin:/bin", MARKER_VAR: marker}
    code, _ = run_to_completion(command, cwd=ws, env=env, log_path=log, timeout_s=30, sandbox=sandbox, network=network)
    assert code is not None
    return log.read_text()


def test_every_workspace_is_at_the_one_fixed_path_inside_and_its_host_path_does_not_exist(
    sandbox: Sandbox, workspace: Path, tmp_path: Path
) -> None:
    other = tmp_path / "elsewhere" / "a-longer-workspace-path"
    other.mkdir(parents=True)
    for ws, name in [(workspace, "first"), (other, "second")]:
        (ws / "mine").write_text(name + "\n")
        out = run(sandbox, ws, f"pwd; pwd -P; cat {WORKSPACE}/mine; ls {ws} 2>&1 || echo no-host-path")
        assert out.splitlines()[1:4] == [WORKSPACE, WORKSPACE, name], out
        assert "no-host-path" in out
    assert sandbox.inside(workspace) == sandbox.inside(other) == Path(WORKSPACE)
    with pytest.raises(EnvironmentError, match="hidden by the workspace"):
        sandbox.wrap(["true"], workspace=workspace, writable=[Path(WORKSPACE) / "cache"])


def test_inside_only_the_workspace_is_writable_and_the_state_directory_does_not_exist(
    sandbox: Sandbox, workspace: Path, tmp_path: Path
) -> None:
    private = f"/tmp/durafix-sandbox-{uuid.uuid4().hex}"
    out = run(
        sandbox,
        workspace,
        "touch inside && echo wrote-inside; touch ../outside 2>&1 || echo no-write-outside; "
        "cat ../../config.json 2>&1 || echo no-config; touch /usr/x 2>&1 || echo no-write-usr; "
        f'echo private > {private}; [ -z "$(ls -A /root /home)" ] && echo homes-empty; '
        "ls /run/docker.sock 2>&1 || echo no-sock",
    )
    assert "wrote-inside" in out and (workspace / "inside").exists()
    assert "no-write-outside" in out and not (workspace.parent / "outside").exists()
    assert "no-config" in out and "next-to-the-workspace" not in out
    assert "no-write-usr" in out and "homes-empty" in out and "no-sock" in out
    assert not Path(private).exists(), "the sandbox's /tmp is the host's"


def test_without_network_a_local_port_is_unreachable_and_with_the_host_network_it_is(
    sandbox: Sandbox, workspace: Path, listener: tuple[int, list[bytes]]
) -> None:
    port, seen = listener
    connect = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2).sendall(b'hi')\""
    out = run(sandbox, workspace, f"{connect} 2>&1 && echo reached || echo refused")
    assert "refused" in out and seen == []
    out = run(sandbox, workspace, f"{connect} && echo reached", network=Network.HOST)
    assert "reached" in out
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seen == [b"hi"]


def test_nothing_a_command_starts_outlives_it(sandbox: Sandbox, workspace: Path) -> None:
    marker = f"sandbox-test/{time.monotonic_ns()}"
    out = run(
        sandbox,
        workspace,
        "(exec sleep 95 &); setsid sleep 96 & nohup sleep 97 >/dev/null 2>&1 & echo left",
        marker=marker,
    )
    assert "left" in out
    deadline = time.monotonic() + 5
    while owned_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert owned_pids(marker) == set()


def test_the_processes_of_the_worker_are_not_visible(sandbox: Sandbox, workspace: Path) -> None:
    out = run(sandbox, workspace, "ls /proc | grep -E '^[0-9]+$' | wc -l; cat /proc/1/cmdline | tr '\\0' ' '")
    count, init = out.splitlines()[1:3]
    # The sandbox's own PID namespace: its init, the shell and its pipeline, never the worker's processes.
    assert int(count) < 10 and "bwrap" in init


def test_without_bwrap_the_local_provider_refuses_unless_the_operator_allows_unsandboxed(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-bwrap")
    with pytest.raises(SandboxUnavailableError, match="DURAFIX_UNSANDBOXED=1"):
        Sandbox.detect(bwrap=missing)
    plain = Sandbox.detect(bwrap=missing, unsandboxed=True)
    assert plain.kind == UNSANDBOXED and plain.wrap(["/bin/true"], workspace=tmp_path) == ["/bin/true"]

    ws = tmp_path / "ws"
    shutil.copytree(CART_APP, ws, ignore=shutil.ignore_patterns("__pycache__"))
    provider = LocalProcessProvider(tmp_path / "state", stop_grace_s=2.0, sandbox=plain)
    spec = RecoverySpec(repository="a/b", clone_url="x", base_revision="3f" * 20, recipe=load_recipe(CART_APP))
    handle = provider.provision(run_id="r-unsandboxed", op_id="r-unsandboxed:env", spec=spec, workspace=str(ws))
    try:
        assert handle.sandbox == UNSANDBOXED and handle.unsandboxed
    finally:
        assert provider.cleanup_run("r-unsandboxed").complete
    # What the run records of that environment makes its ticket say so.
    fact = EnvironmentFact(
        env_id=handle.env_id,
        provider=handle.provider,
        op_id=handle.op_id,
        revision="3f" * 20,
        spec_ref=ref("spec"),
        base_url=handle.base_url,
        last_status=EnvironmentState.READY,
        sandbox=handle.sandbox,
    )
    assert "sandbox: **none**" in messages.ticket_body(state(environment=fact))
    assert "sandbox" not in messages.ticket_body(state(environment=fact.model_copy(update={"sandbox": "bubblewrap"})))


def test_secrets_need_the_operators_allow_list_and_never_durafix_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    environ = {"SENTRY_DSN": "dsn-1", "DURAFIX_FORGE_TOKEN": "forge-1"}
    assert resolve_secrets({"DSN": "env:SENTRY_DSN"}, environ, allowed=["SENTRY_DSN"]) == {"DSN": "dsn-1"}
    with pytest.raises(SecretRefusedError, match="allow-list"):
        resolve_secrets({"DSN": "env:SENTRY_DSN"}, environ)
    with pytest.raises(SecretRefusedError, match="never"):
        resolve_secrets({"T": "env:DURAFIX_FORGE_TOKEN"}, environ, allowed=["DURAFIX_FORGE_TOKEN"])
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        check_allowlist(["SENTRY_DSN", "openai_api_key".upper()])
    monkeypatch.setenv("DURAFIX_SECRET_ALLOWLIST", "SENTRY_DSN, NPM_TOKEN")
    monkeypatch.setenv("DURAFIX_UNSANDBOXED", "1")
    config = load_config(tmp_path)
    assert config.secret_allowlist == ["SENTRY_DSN", "NPM_TOKEN"] and config.unsandboxed
    monkeypatch.setenv("DURAFIX_SECRET_ALLOWLIST", "SENTRY_DSN,DURAFIX_FORGE_TOKEN")
    with pytest.raises(ValueError, match="DURAFIX_FORGE_TOKEN"):
        load_config(tmp_path)


def test_bwrap_probe_reports_a_working_sandbox_here(sandbox: Sandbox, tmp_path: Path) -> None:
    assert sandbox.sandboxed and bwrap_problem(sandbox.bwrap) is None
    result = subprocess.run(
        sandbox.wrap(["/bin/sh", "-c", "grep CapEff /proc/self/status"], workspace=tmp_path),
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.split() == ["CapEff:", "0000000000000000"]
