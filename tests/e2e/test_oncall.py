"""On call after a crash, with real processes: workers and stack services SIGKILLed, then the runbook's steps.

What each step prints is checked against external truth: the engine (the memo and history the server keeps),
the forge (the ticket comment, read with PyGithub), the stack's record and the machine (live processes, open
ports).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from infra import processes, stack
from infra.cli.demo import seed_repository
from infra.forge.testing import client as forge_client
from pipeline import client as runs
from pipeline.cli.status import QUERY_TIMEOUT
from pipeline.ids import workflow_id_for
from pipeline.state import RunState
from reviews.markers import TICKET, find_marker
from tests.e2e.test_cli import Cli
from tests.e2e.test_pipeline import finished, state_when
from tests.support.e2e_stack import REPO_ROOT, E2EStack, kill, owned_processes, run_workspaces, wait_for

pytestmark = [pytest.mark.slow]

EXIT_NOT_FOUND = 3
STACK_SERVICES = ("temporal", "forge", "model", "evidence")


def provisioned(state: RunState, status: WorkflowExecutionStatus | None) -> bool:
    return state.environment is not None or finished(state, status)


@pytest.mark.browser
@pytest.mark.timeout(600)  # a run up to provisioning, then the session stack's first start on a busy host
async def test_status_without_a_worker_then_cleanup_of_the_terminated_run_updates_its_ticket(
    e2e_stack: E2EStack,
) -> None:
    stack_ = e2e_stack
    worker = stack_.spawn_worker()
    cli = Cli(stack_.state_dir)
    # Labelled: the receiver starts the run (its reconciler would cancel a run whose issue lacks the label).
    client, repository, issue, wf = await stack_.open_run()
    state = await state_when(client, wf, provisioned)
    assert state.environment is not None, state.outcome_detail
    wait_for(lambda: owned_processes(wf), 30, f"the app process of {wf}")

    # Every worker dies at once: nothing can answer the state query any more.
    kill(worker)
    wait_for(lambda: not processes.is_alive(worker), 10, "the worker to be gone")
    stack_.workers.clear()

    handle = runs.handle_for(client, wf)
    recorded = await runs.recorded_state_of(await handle.describe())
    assert recorded is not None and recorded.ticket is not None
    shown = cli.run("status", wf, timeout_s=QUERY_TIMEOUT.total_seconds() + 60)
    assert shown.returncode == 0, shown.stderr
    assert "NOTICE     no worker" in shown.stdout and "durafix-orchestration" in shown.stdout, shown.stdout
    assert f"showing the state recorded at {recorded.at.isoformat()}" in shown.stdout, shown.stdout
    assert f"status     running; phase {recorded.phase}" in shown.stdout, shown.stdout
    assert f"ticket     {recorded.ticket}" in shown.stdout
    as_json = cli.json("status", wf)
    assert (as_json["status"], as_json["live"]) == ("running", False)
    assert as_json["recorded"] == recorded.model_dump(mode="json")

    # Terminated (no cleanup, no final ticket update by the run), then cleaned up by hand.
    await handle.terminate(reason="on-call: the worker host is gone")
    assert (await handle.describe()).status == WorkflowExecutionStatus.TERMINATED
    assert owned_processes(wf), "the terminated run's app process should still be there to clean up"
    dry = cli.ok("cleanup", "--run", wf)
    assert "with --yes its ticket on the forge is brought up to date too" in dry.stdout
    cleaned = cli.ok("cleanup", "--run", wf, "--yes", "--json")
    document = json.loads(cleaned.stdout)
    assert document["temporal_status"] == "terminated" and document["remaining"] == []
    assert document["ticket"]["updated"] is True
    removed = document["removed"]
    assert removed, document

    # The disk: nothing of the run is left.
    assert owned_processes(wf) == []
    assert run_workspaces(stack_, wf) == []
    assert cli.run("resources", "--run", wf).returncode == EXIT_NOT_FOUND
    # The engine: the run ended by the termination, nothing ran after it.
    events = [e.event_type async for e in handle.fetch_history_events()]
    assert events[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED
    # The forge: still exactly one ticket on the issue, and it says what happened and how to retry.
    comments = stack_.github().get_repo(repository).get_issue(issue).get_comments()
    tickets = [c for c in comments if find_marker(c.body, TICKET) is not None]
    assert len(tickets) == 1
    body = tickets[0].body
    assert document["ticket"]["url"] == tickets[0].html_url
    assert f"`{wf}`): the run was terminated" in body and "- outcome: **terminated**" in body, body
    assert f"- cleaned: {len(removed)} resource(s) removed" in body, body
    assert all(r["resource_id"] in body for r in removed), body
    assert f"- last recorded phase: `{recorded.phase}`" in body, body
    assert "/durafix retry" in body and f"`{stack_.config.trigger_label}` label" in body, body

    # Still no worker: status now shows the terminated run and the warning.
    after = cli.ok("status", wf, timeout_s=QUERY_TIMEOUT.total_seconds() + 60)
    assert "status     terminated" in after.stdout and "was terminated" in after.stdout, after.stdout


def _kill_all(state: Path) -> dict[str, processes.ServiceRecord]:
    """SIGKILL every service of the stack (each one's process group), as a crashed host would."""
    recorded = stack.read_stack(state).services
    for rec in recorded.values():
        os.killpg(rec.pid, signal.SIGKILL)
    for rec in recorded.values():
        wait_for(lambda rec=rec: not processes.is_alive(rec), 15, f"{rec.name} to die")
        # A killed multi-threaded process shows as a zombie once its main thread is gone, while its other
        # threads may still hold its sockets for a moment: a crashed host has had that moment.
        processes.wait_port_free(rec.port, 15, f"the stack's {rec.name}")
    return recorded


def _ports(state: Path) -> dict[str, tuple[int, str]]:
    return {name: (rec.port, rec.extra.get("ui", "")) for name, rec in stack.read_stack(state).services.items()}


def test_dev_up_after_sigkill_restarts_the_stack_on_its_ports_and_an_old_receiver_still_starts_runs(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    config = stack.up(state, quiet=True)
    cli = Cli(state)
    port = processes.free_port()
    receiver = processes.spawn(
        "receiver",
        [sys.executable, "-m", "pipeline", "--state-dir", str(state), "serve", "--port", str(port), "--no-reconcile"],
        log=state / "logs" / "test-receiver.log",
        port=port,
        url=f"http://127.0.0.1:{port}/webhook",
        env={"PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        processes.wait_ready(receiver, lambda: processes.tcp_open("127.0.0.1", port), 90)
        before = _ports(state)
        assert set(before) == set(STACK_SERVICES)
        killed = _kill_all(state)

        # Something else took the forge's port meanwhile: `dev up` names it and moves nothing.
        forge_port = killed["forge"].port
        with socket.socket() as squatter:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", forge_port))
            squatter.listen()
            refused = cli.run("dev", "up", timeout_s=180)
            assert refused.returncode == 1, refused
            assert f"port {forge_port}, recorded for the stack's forge, is held by pid {os.getpid()}" in refused.stderr
            assert stack.read_stack(state).services["forge"].port == forge_port
        up = cli.ok("dev", "up", "--json", timeout_s=180)
        services = json.loads(up.stdout)
        assert _ports(state) == before
        assert all(services[name]["alive"] for name in STACK_SERVICES), services
        for name in STACK_SERVICES:
            assert stack.read_stack(state).services[name].pid != killed[name].pid
            assert processes.tcp_open("127.0.0.1", before[name][0])
        assert processes.is_alive(receiver)

        # The receiver started before the crash reaches the restarted Temporal: a labelled issue starts a run.
        repository = seed_repository(
            config, stack.read_stack(state).admin_token, "reviewer", receiver.url, name=f"cart-{uuid.uuid4().hex[:8]}"
        )
        github = forge_client(config.forge_api_url, config.forge_token)
        issue = github.get_repo(repository).create_issue(title="Cart total is wrong", labels=[config.trigger_label])
        wf = workflow_id_for(repository, issue.number)

        async def exists() -> bool:
            client = await runs.connect(config)
            try:
                await runs.handle_for(client, wf).describe()
            except RPCError:
                return False
            await runs.handle_for(client, wf).terminate(reason="test done")
            return True

        wait_for(lambda: asyncio.run(exists()), 60, f"the old receiver to start {wf}", 1)
        log = processes.log_tail(Path(receiver.log), 200)
        assert " 503 " not in log, log
    finally:
        processes.stop(receiver)
        stack.down(state, quiet=True)


@pytest.mark.browser
@pytest.mark.timeout(600)  # one whole demo; minutes on a busy two-core host
def test_demo_keep_records_its_worker_and_receiver_which_dev_down_stops(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cli = Cli(state)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pipeline", "--state-dir", str(state), "demo", "--keep", "--json"],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
        # Whether the run merged is test_demo.py's concern (a loaded host can run out its fast timeouts); here
        # the demo finished and kept what it started.
        assert done.returncode in (0, 1), done.stderr[-3000:]
        assert json.loads(done.stdout)["workflow_id"], done.stdout
        recorded = stack.read_stack(state).services
        worker, receiver = recorded["demo-worker"], recorded["demo-receiver"]
        for rec, command in ((worker, "worker"), (receiver, "serve")):
            assert processes.is_alive(rec)
            argv = Path(f"/proc/{rec.pid}/cmdline").read_bytes().split(b"\0")
            assert command.encode() in argv and str(state).encode() in argv, argv
        assert processes.tcp_open("127.0.0.1", receiver.port)

        listed = cli.run("dev", "status", "--json")
        assert listed.returncode == 0, listed
        services = json.loads(listed.stdout)
        assert {"demo-worker", "demo-receiver", *STACK_SERVICES} <= set(services)
        assert (services["demo-worker"]["pid"], services["demo-receiver"]["pid"]) == (worker.pid, receiver.pid)
        text = cli.ok("dev", "status").stdout
        assert f"demo-worker up   pid {worker.pid:<7}" in text, text

        cli.ok("dev", "down")
        assert not processes.is_alive(worker) and not processes.is_alive(receiver)
        assert not processes.tcp_open("127.0.0.1", receiver.port)
        assert stack.read_stack(state).services == {}
    finally:
        stack.down(state, quiet=True)
