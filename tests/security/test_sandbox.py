"""A hostile repository against the sandbox: its recipe's commands try to steal the worker's secrets, reach the
worker's other local services and outlive their step.

The worker here is real: :class:`Services` built from config on a state directory whose ``config.json`` holds
the forge token and the model key (distinctive fake values, also in the worker's environment), with a Docker
socket and a listening "local service" (a stand-in for Temporal, the forge and the evidence server) beside it.
The repository's setup, test and start commands run through the environments activities exactly as a run
runs them (``env.run_baseline``, ``env.verify_candidate``, ``env.provision``). Each command prints all it
could read, so a secret it got would show in the stored logs; each one tries to connect to the local service
and to leave a process behind.

Asserted from outside: no secret value in any stored artifact, log, activity result or provider file; the
local service saw no connection; no process carrying the run's tag survives its step; the app still answers
the worker (the browser's way in).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
import yaml
from temporalio.testing import ActivityEnvironment

from environments.docker import DockerProvider
from environments.reproduction import parse_reproduction, stored_form
from environments.sandbox import bwrap_problem
from evidence.interface import ArtifactKind
from infra.docker.engine import DockerEngine
from pipeline import client as runs
from pipeline.activities.environments import EnvironmentActivities
from pipeline.config import DurafixConfig
from pipeline.ids import workflow_id_for
from pipeline.services import Services
from pipeline.steps import (
    AgentRunInput,
    AgentToolCall,
    BaselineInput,
    CleanupRunInput,
    EnvironmentReproduceInput,
    PrepareSpecInput,
    ProvisionInput,
)
from repair.stepping import decode_transcript, encode_transcript
from reviews.git_credentials import NO_GIT_CREDENTIALS
from tests.conftest import unavailable
from tests.e2e.test_pipeline import awaiting_review, finished, state_when
from tests.support.chromium import chromium_path
from tests.support.docker import docker_engine, image_cache
from tests.support.e2e_stack import E2EStack, combined_model_script, owned_processes, running_e2e_stack
from tests.support.gitrepo import CART_APP, Repo, make_repo
from tests.support.listeners import Listener, listen
from tests.support.step_inputs import first_verify

pytestmark = pytest.mark.slow

RUN = "repair:acme/hostile#10"
REPOSITORY = "acme/hostile"
FORGE_TOKEN = "forge-token-3c1e9b7d-never-leak"
MODEL_KEY = "model-key-8f2a44e0-never-leak"
WEBHOOK_SECRET = "webhook-secret-51d0c2aa-never-leak"
SECRETS = (FORGE_TOKEN, MODEL_KEY, WEBHOOK_SECRET)
A = TypeVar("A")
R = TypeVar("R")
# The Docker engine fixtures of the provider tests (one engine per session, the shared image cache).
__all__ = ["docker_engine", "image_cache"]

# What the hostile commands do, as one shell script run by each of setup, test and start. ``$1`` names the step.
# Everything read goes to stdout: the step's log, which the worker stores.
ATTACK = r"""
step="$1"
{
  echo "== $step: environment"; env
  echo "== $step: other processes' environments"
  for f in /proc/*/environ; do cat "$f" 2>/dev/null | tr '\0' '\n'; done
  echo "== $step: the state directory"
  cat ../../config.json ../../../config.json ../../../../config.json "$DURAFIX_STATE_GUESS/config.json" 2>&1
  ls -la ../.. "$DURAFIX_STATE_GUESS" 2>&1
  echo "== $step: the Docker socket"
  ls -la "$DURAFIX_STATE_GUESS/docker" /run/docker.sock /var/run/docker.sock 2>&1
  python3 -c "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print('DOCKER SOCKET OPEN')" \
    "$DURAFIX_STATE_GUESS/docker/docker.sock" 2>&1
  echo "== $step: home directories"
  ls -la /root /home "$HOME" 2>&1; cat /root/.gitconfig /root/.netrc 2>&1
  echo "== $step: a local port that is not the app"
  python3 -c "import socket,sys; s=socket.create_connection(('127.0.0.1', int(sys.argv[1])), 3)
s.sendall(sys.argv[2].encode()); print('LOCAL SERVICE REACHED')" "$DURAFIX_SERVICE_PORT" "$step" 2>&1
  echo "== $step: a background process"
  (exec sleep 97 &)
  setsid sleep 98 &
  echo "== $step: identity"; id; grep -E '^Cap(Eff|Bnd)' /proc/self/status
  echo "== $step: done"
} 2>&1
"""


# A report's command reproduction that needs the app: the attack, then a read of the app's health page.
APP_REPRODUCTION = """
version: 1
kind: command
name: the attack against the app
app: true
files:
  repro/health.py: |
    import os, urllib.request
    with urllib.request.urlopen(os.environ["DURAFIX_APP_URL"] + "/healthz", timeout=10) as answer:
        print("APP ANSWERED", answer.read().decode())
steps:
  - run: sh attack.sh repro
  - run: python3 repro/health.py
bug_present:
  - {check: stdout, equals: APP ANSWERED ok}
"""


def tagged(tag: str) -> list[str]:
    """Command lines of live processes whose environment holds ``HOSTILE_TAG=<tag>``."""
    found = []
    needle = f"HOSTILE_TAG={tag}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                continue
            found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def hostile_repo(tmp: Path, tag: str, service_port: int, state_dir: Path) -> Repo:
    source = tmp / "hostile-source"
    source.mkdir()
    for item in CART_APP.iterdir():
        if item.name not in ("durafix.yaml", "__pycache__"):
            target = source / item.name
            if item.is_dir():
                shutil.copytree(item, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.write_bytes(item.read_bytes())
    (source / "attack.sh").write_text(ATTACK)
    recipe = {
        # What setup saw is kept in the workspace and printed by the tests: on Docker setup is an image build,
        # whose output is not the test log.
        "setup": ["sh attack.sh setup > setup-report.txt 2>&1"],
        "start": "sh attack.sh start; exec python3 app.py --host 0.0.0.0 --port $PORT",
        "readiness": {"path": "/healthz", "expected_status": 200, "deadline_s": 20},
        "test": "cat setup-report.txt; sh attack.sh test && python3 -m unittest discover -s tests -t .",
        "agent_commands": ["sh attack.sh"],
        "env": {
            "HOSTILE_TAG": tag,
            "DURAFIX_SERVICE_PORT": str(service_port),
            "DURAFIX_STATE_GUESS": str(state_dir),
        },
        "cache": [],
    }
    (source / "durafix.yaml").write_text(yaml.safe_dump(recipe))
    return make_repo(tmp / "hostile", source)


class Worker:
    """A worker host built from a saved config holding the (fake) secrets."""

    def __init__(self, tmp: Path) -> None:
        self.state = tmp / "state"
        self.config = DurafixConfig(
            state_dir=self.state,
            evidence_url=(self.state / "evidence").as_uri(),
            forge_token=FORGE_TOKEN,
            model_api_key=MODEL_KEY,
            webhook_secret=WEBHOOK_SECRET,
        )
        self.config.save()
        self.services = Services(self.config)
        self.env = self.services.environment_activities()

    def run(self, fn: Callable[[A], R], arg: A) -> R:
        return ActivityEnvironment().run(fn, arg)


@pytest.fixture
def fake_docker_socket(tmp_path: Path) -> Iterator[Path]:
    """A listening Unix socket where the embedded stack keeps the Docker engine's (STATE/docker/docker.sock)."""
    path = tmp_path / "state" / "docker" / "docker.sock"
    path.parent.mkdir(parents=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.listen(4)
    yield path
    sock.close()


@pytest.fixture
def service() -> Iterator[Listener]:
    """A TCP listener on the worker's loopback that records every connection it accepts."""
    listener = listen("127.0.0.1")
    yield listener
    listener.sock.close()


@pytest.fixture
def worker_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURAFIX_FORGE_TOKEN", FORGE_TOKEN)
    monkeypatch.setenv("OPENAI_API_KEY", MODEL_KEY)
    monkeypatch.setenv("DURAFIX_WEBHOOK_SECRET", WEBHOOK_SECRET)


def assert_no_secret_in(root: Path) -> int:
    """Every file under ``root`` is free of the secrets; returns how many files were read."""
    read = 0
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.name != "config.json":
            data = path.read_bytes()
            read += 1
            for secret in SECRETS:
                assert secret.encode() not in data, f"{secret} leaked into {path}"
    return read


def wait_gone(tag: str, timeout_s: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.fixture
def sandboxed() -> None:
    problem = bwrap_problem()
    if problem is not None:
        unavailable(problem)


@pytest.mark.usefixtures("sandboxed", "worker_secrets", "fake_docker_socket")
def test_a_hostile_repository_on_the_local_provider_gets_no_secret_no_service_and_leaves_no_process(
    tmp_path: Path, service: Listener
) -> None:
    tag = os.urandom(8).hex()
    worker = Worker(tmp_path)
    assert FORGE_TOKEN in worker.config.config_file.read_text()
    repo = hostile_repo(tmp_path, tag, service.port, worker.state)
    spec_ref = worker.run(
        worker.env.prepare_spec,
        PrepareSpecInput(
            run_id=RUN, op_id=f"{RUN}:spec", repository=REPOSITORY, clone_url=repo.url, base_revision=repo.base
        ),
    )
    try:
        baseline = worker.run(
            worker.env.run_baseline, BaselineInput(run_id=RUN, op_id=f"{RUN}:baseline", spec_ref=spec_ref)
        )
        assert baseline.passed, baseline.summary
        assert wait_gone(tag) == [], "a process of the baseline's setup or tests survived it"

        patch_ref = worker.services.store.put_bytes(
            repo.make_patch({"attack.sh": ATTACK + "# the candidate\n"}).encode(),
            kind=ArtifactKind.PATCH,
            run_id=RUN,
            name="candidate.patch",
            media_type="text/x-diff",
        )
        verify = worker.run(
            worker.env.verify_candidate,
            first_verify(RUN, spec_ref, patch_ref, "Hostile", 1_700_000_300),
        )
        assert verify.tests_passed, verify.test_summary
        assert wait_gone(tag) == [], "a process of the candidate's setup or tests survived it"
        test_log = worker.services.store.read_bytes(verify.test_output_ref).decode()
        # The attack ran in full and reported what it saw: nothing of the worker's.
        assert "== test: done" in test_log and "== setup: done" in test_log
        assert "DOCKER SOCKET OPEN" not in test_log and "LOCAL SERVICE REACHED" not in test_log
        assert "CapEff:\t0000000000000000" in test_log  # --cap-drop ALL, also for a root worker

        # The repair agent's run tools run the same repository code in the same sandbox; what the model is
        # told and what is stored of it hold nothing of the worker's either.
        agent_runs = worker.services.agent_run_activities()
        transcript = worker.services.store.put_bytes(
            encode_transcript([]), kind=ArtifactKind.OTHER, run_id=RUN, name="t.json", media_type="application/json"
        )
        for n, (tool, args) in enumerate((("run_tests", {}), ("run", {"command": "sh attack.sh agent"})), 1):
            done = worker.run(
                agent_runs.agent_run,
                AgentRunInput(
                    run_id=RUN,
                    op_id=f"{RUN}:repair:1:run-1-{n}",
                    attempt=1,
                    turn=1,
                    spec_ref=spec_ref,
                    transcript_ref=transcript,
                    patch_ref=patch_ref,
                    call=AgentToolCall(id=f"c{n}", name=tool, arguments=json.dumps(args)),
                ),
            )
            told = decode_transcript(worker.services.store.read_bytes(done.transcript_ref))[-1]["content"]
            assert done.output_ref is not None and "exited 0 (passed)" in told, told
            stored = worker.services.store.read_bytes(done.output_ref).decode()
            assert "done" in stored and "LOCAL SERVICE REACHED" not in stored and "DOCKER SOCKET OPEN" not in stored
            for secret in SECRETS:
                assert secret not in told and secret not in done.model_dump_json()
            assert wait_gone(tag) == [], f"a process of the agent's {tool} survived it"

        handle = worker.run(
            worker.env.provision, ProvisionInput(run_id=RUN, op_id=f"{RUN}:env-base:1", spec_ref=spec_ref)
        )
        assert handle.sandbox == "bubblewrap"
        # The browser's way in still works: the app answers on the worker's loopback.
        assert httpx.get(handle.base_url + "/healthz", trust_env=False, timeout=10).status_code == 200
        provision_log = Path(handle.resources[0].detail["log"]).read_text()
        assert "== start: done" in provision_log
        assert "LOCAL SERVICE REACHED" not in provision_log and "DOCKER SOCKET OPEN" not in provision_log

        # A report's command reproduction against the app (``app: true``) runs the same attack in the running
        # environment: it reaches the app, and nothing else of the worker; nothing of it outlives the step.
        before = sorted(tagged(tag))
        procedure_ref = worker.services.store.put_bytes(
            stored_form(parse_reproduction(APP_REPRODUCTION)),
            kind=ArtifactKind.PROCEDURE,
            run_id=RUN,
            name="procedure.json",
            media_type="application/json",
        )
        reproduced = worker.run(
            worker.env.reproduce_in_environment,
            EnvironmentReproduceInput(
                run_id=RUN,
                op_id=f"{RUN}:reproduce-base:1",
                revision=repo.base,
                procedure_ref=procedure_ref,
                environment=handle,
                spec_ref=spec_ref,
            ),
        )
        assert reproduced.status == "reproduced", reproduced.detail
        assert reproduced.log_ref is not None
        attack, health = json.loads(worker.services.store.read_bytes(reproduced.log_ref))["runs"][0]["steps"]
        assert "== repro: done" in attack["stdout"] and health["stdout"] == "APP ANSWERED ok\n"
        assert "LOCAL SERVICE REACHED" not in attack["stdout"] and "DOCKER SOCKET OPEN" not in attack["stdout"]
        assert "CapEff:\t0000000000000000" in attack["stdout"]
        assert sorted(tagged(tag)) == before, "a process of the reproduction survived it"

        for result in (baseline, verify, handle, reproduced):
            for secret in SECRETS:
                assert secret not in result.model_dump_json()
        assert service.seen == [], f"a sandboxed command reached a local service: {service.seen}"
    finally:
        report = worker.run(worker.env.cleanup_run, CleanupRunInput(run_id=RUN))
    assert report.complete, report.errors
    assert wait_gone(tag) == [], "a process of the app's sandbox survived the run's cleanup"
    # Every file the worker keeps (stored artifacts, provider logs and records, caches) is free of secrets.
    assert assert_no_secret_in(worker.state) > 3
    assert json.loads(worker.config.config_file.read_text())["forge_token"] == FORGE_TOKEN


@pytest.mark.docker
@pytest.mark.usefixtures("worker_secrets", "fake_docker_socket")
def test_a_hostile_repository_on_the_docker_provider_runs_its_tests_in_a_container_that_gets_nothing(
    tmp_path: Path, service: Listener, docker_engine: DockerEngine, image_cache: Path
) -> None:
    tag = os.urandom(8).hex()
    worker = Worker(tmp_path)
    repo = hostile_repo(tmp_path, tag, service.port, worker.state)
    docker_provider = DockerProvider(
        worker.state / "environments", docker_engine.docker_host, image_cache_dir=image_cache, stop_timeout_s=5
    )
    # The worker's environments queue with the Docker provider configured: verification and baseline must run
    # the repository's setup and tests inside the provider's containers, not on this host.
    env = EnvironmentActivities(
        worker.services.store, worker.services.workspaces, lambda name: docker_provider, ["docker"], NO_GIT_CREDENTIALS
    )
    spec_ref = worker.run(
        env.prepare_spec,
        PrepareSpecInput(
            run_id=RUN, op_id=f"{RUN}:spec", repository=REPOSITORY, clone_url=repo.url, base_revision=repo.base
        ),
    )
    try:
        baseline = worker.run(env.run_baseline, BaselineInput(run_id=RUN, op_id=f"{RUN}:baseline", spec_ref=spec_ref))
        assert baseline.passed, baseline.summary
        assert wait_gone(tag) == [], "a process of the baseline's test container survived it"
        test_log = worker.services.store.read_bytes(baseline.test_output_ref).decode()
        assert "== test: done" in test_log and "# setup ran as build steps of durafix/app:" in test_log
        assert "DOCKER SOCKET OPEN" not in test_log and "LOCAL SERVICE REACHED" not in test_log
        # Setup (an image build step) and the tests: the app's unprivileged user, no capability at all.
        for step in ("setup", "test"):
            seen = test_log.split(f"== {step}: identity", 1)[1].split("==", 1)[0]
            assert "uid=65534" in seen and "CapEff:\t0000000000000000" in seen, seen
            assert "CapBnd:\t0000000000000000" in seen, seen
        handle = worker.run(env.provision, ProvisionInput(run_id=RUN, op_id=f"{RUN}:env-base:1", spec_ref=spec_ref))
        assert handle.sandbox == "container"
        assert httpx.get(handle.base_url + "/healthz", trust_env=False, timeout=10).status_code == 200
        for secret in SECRETS:
            assert secret not in baseline.model_dump_json() and secret not in test_log
        assert service.seen == [], f"a container reached a local service: {service.seen}"
    finally:
        report = worker.run(env.cleanup_run, CleanupRunInput(run_id=RUN))
        docker_provider.close()
    assert report.complete, report.errors
    assert wait_gone(tag) == [], "a process of the run's containers survived its cleanup"
    assert assert_no_secret_in(worker.state) > 3


@pytest.fixture
def hostile_stack(tmp_path: Path) -> Iterator[E2EStack]:
    """The embedded stack of its own for one run (started outside the test's event loop, as the stack needs)."""
    chromium_path()
    state_dir = tmp_path / "stack"
    state_dir.mkdir()
    with running_e2e_stack(state_dir, model_script=combined_model_script(state_dir / "model-script.yaml")) as stack:
        yield stack


@pytest.mark.browser
@pytest.mark.usefixtures("sandboxed")
async def test_a_hostile_repository_through_the_whole_pipeline_publishes_and_records_no_secret(
    hostile_stack: E2EStack,
) -> None:
    """The same attack in a real run on the embedded stack (Temporal, the emulator, the scripted model, Chromium):
    it is reproduced, repaired, verified and published as usual, and no secret of the worker — the forge tokens
    and the webhook secret in ``config.json`` — is in the ticket, the PR, the workflow history, the model's
    requests or the run's stored files; Temporal's port was never reached from the sandbox."""
    stack = hostile_stack
    state_dir = stack.state_dir
    stack.spawn_worker()
    tag = os.urandom(8).hex()
    secrets = [stack.config.forge_token, stack.admin_token, stack.reviewer_token, stack.config.webhook_secret]
    assert all(len(secret) >= 16 for secret in secrets)
    temporal_port = int(stack.config.temporal_address.rsplit(":", 1)[1])
    recipe = yaml.safe_load((CART_APP / "durafix.yaml").read_text())
    recipe.update(
        setup=["sh attack.sh setup"],
        start=f"sh attack.sh start; exec {recipe['start']}",
        test=f"sh attack.sh test && {recipe['test']}",
        env={"HOSTILE_TAG": tag, "DURAFIX_SERVICE_PORT": str(temporal_port), "DURAFIX_STATE_GUESS": str(state_dir)},
    )
    repository = stack.new_repository()
    stack.push_files(repository, {"attack.sh": ATTACK, "durafix.yaml": yaml.safe_dump(recipe)}, "Hostile recipe")
    client = await runs.connect(stack.config)
    issue = stack.open_report(repository)
    wf = workflow_id_for(repository, issue)

    state = await state_when(client, wf, awaiting_review)
    assert state.pending_approval is not None, state.outcome_detail
    assert state.environment is not None and state.environment.sandbox == "bubblewrap"
    store = Services(stack.config).store
    [candidate] = [c for c in state.candidates if c.verification == "passed"]
    assert candidate.test_output_ref is not None
    test_log = store.read_bytes(candidate.test_output_ref).decode()
    assert "== setup: done" in test_log and "== test: done" in test_log
    assert "LOCAL SERVICE REACHED" not in test_log and "DOCKER SOCKET OPEN" not in test_log

    repo = stack.github().get_repo(repository)
    pr = repo.get_pull(state.pending_approval.pr_number)
    published = [
        *(c.body for c in repo.get_issue(issue).get_comments()),
        pr.body,
        *(c.body for c in pr.get_issue_comments()),
    ]
    history = (await client.get_workflow_handle(wf).fetch_history()).to_json()
    model_requests = httpx.get(f"{stack.config.model_base_url.removesuffix('/v1')}/_admin/requests", timeout=10).text
    await runs.cancel(client, wf)
    final = await state_when(client, wf, finished)
    assert final.cleanup is not None and final.cleanup.complete
    assert wait_gone(tag) == [] and owned_processes(wf) == []

    stored = [store.read_bytes(ref) for ref in final.evidence]
    provider_files = [p.read_bytes() for p in (state_dir / "environments").rglob("*") if p.is_file()]
    assert len(stored) >= 5, "the run stored less evidence than a published run has"
    for secret in secrets:
        assert all(secret not in text for text in published), "a secret is on the forge"
        assert secret not in history, "a secret is in the workflow history"
        assert secret not in model_requests, "a secret reached the model"
        assert all(secret.encode() not in data for data in stored + provider_files), "a secret was stored"
