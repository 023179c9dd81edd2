"""durafix on five hosts of one machine (network namespaces, :mod:`infra.netns`), for the multi-host tests and
the scale-out benchmark.

- ``server``: the Temporal dev server (its SQLite file on disk) and the evidence store's S3 server (SeaweedFS);
- ``forge``: the GitHub emulator and the scripted model server;
- ``w1``: the webhook receiver and a worker of the orchestration, forge and model queues;
- ``w2``, ``w3``: workers of the environments and browser queues (each serves its own host queue too).

Every host has a state directory of its own (its workspaces, environments, in-flight records) and a config
whose addresses are the other hosts' network addresses; nothing a worker needs from another host passes
through the file system: the evidence is in S3, the repositories on the forge, the run in Temporal. The test
process itself sits on the bridge (``Network.root_address``) and talks to every host over the network.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.client import Client

from infra import processes, stack
from infra.netns import Host, Network
from infra.processes import ServiceRecord
from infra.s3 import SeaweedS3
from pipeline.config import DurafixConfig
from tests.support.e2e_stack import REPO_ROOT, E2EStack, combined_model_script

BUCKET = "durafix-evidence"
TEMPORAL_PORT, FORGE_PORT, MODEL_PORT, RECEIVER_PORT = 7233, 8080, 8081, 8787
PY = [sys.executable, "-m"]
ACTIVITY_QUEUES = {"w1": "orchestration,forge,model", "w2": "environments,browser", "w3": "environments,browser"}


@dataclass
class Cluster:
    net: Network
    root: Path
    stack: E2EStack
    base: DurafixConfig
    services: list[ServiceRecord] = field(default_factory=list)
    workers: dict[str, ServiceRecord] = field(default_factory=dict)
    s3: SeaweedS3 | None = None

    def host(self, name: str) -> Host:
        return self.net.hosts[name]

    def host_config(self, name: str) -> DurafixConfig:
        return self.base.model_copy(update={"state_dir": self.root / name, "host_id": name})

    def spawn_worker(self, name: str, queues: str) -> ServiceRecord:
        """A ``durafix worker`` (supervised, as in production) on host ``name``."""
        host = self.host(name)
        state = self.root / name
        rec = processes.spawn(
            f"worker-{name}",
            host.argv([sys.executable, "-m", "pipeline", "--state-dir", str(state), "worker", "--queues", queues]),
            log=state / "logs" / "worker.log",
            port=0,
            url="",
            env={"PYTHONPATH": str(REPO_ROOT)},
        )
        self.workers[name] = rec
        return rec

    def worker_log(self, name: str, lines: int = 40) -> str:
        return processes.log_tail(Path(self.workers[name].log), lines)

    def close(self) -> None:
        _stop_all([*self.workers.values(), self.stack.receiver], self.services, self.s3)
        self.net.close()


def _stop_all(first: list[ServiceRecord], services: list[ServiceRecord], s3: SeaweedS3 | None) -> None:
    """Stop ``first``, then ``services`` newest first, then the S3 server; a failure stops nothing else."""
    for rec in [*first, *reversed(services)]:
        with contextlib.suppress(Exception):
            processes.stop(rec, grace_s=10)
    if s3 is not None:
        with contextlib.suppress(Exception):
            s3.stop()


def _spawn(host: Host, root: Path, name: str, argv: list[str], port: int, url: str, **env: str) -> ServiceRecord:
    rec = processes.spawn(name, host.argv(argv), log=root / "logs" / f"{name}.log", port=port, url=url, env=env)
    try:
        processes.wait_ready(rec, lambda: processes.tcp_open(host.address, port), 90)
    except BaseException:
        processes.stop(rec, grace_s=5)
        raise
    return rec


async def _temporal_answers(address: str) -> bool:
    client = await Client.connect(address)
    async for _ in client.list_workflows(page_size=1):  # answered by the history service, not the frontend alone
        break
    return True


@contextlib.contextmanager
def running_cluster(root: Path, *, workers: dict[str, str] | None = None) -> Iterator[Cluster]:
    """The five hosts with their services and ``workers`` (host -> queues; default :data:`ACTIVITY_QUEUES`);
    all stopped and the namespaces removed at the end."""
    root.mkdir(parents=True, exist_ok=True)
    net = Network().__enter__()
    cluster: Cluster | None = None
    # What started before the cluster exists is stopped here when a later step fails.
    services: list[ServiceRecord] = []
    s3: SeaweedS3 | None = None
    try:
        server, forge = net.add_host("server"), net.add_host("forge")
        for name in ("w1", "w2", "w3"):
            net.add_host(name)
        temporal = _spawn(
            server,
            root,
            "temporal",
            [
                stack.temporal_binary(),
                "server",
                "start-dev",
                # All of the host's addresses (its loopback and its link): the dev server's services dial each
                # other on loopback, and the other hosts reach its frontend on the link.
                "--ip",
                "0.0.0.0",
                "--port",
                str(TEMPORAL_PORT),
                "--headless",
                "--db-filename",
                str(root / "temporal.sqlite"),
                "--log-level",
                "warn",
            ],
            TEMPORAL_PORT,
            f"{server.address}:{TEMPORAL_PORT}",
        )
        services.append(temporal)
        processes.wait_ready(temporal, lambda: asyncio.run(_temporal_answers(temporal.url)), 60)
        s3 = SeaweedS3(root / "s3", host=server.address, wrap=server.argv).start()
        s3.create_bucket(BUCKET)
        admin = secrets.token_hex(20)
        emulator = _spawn(
            forge,
            root,
            "forge",
            [
                *PY,
                "infra.forge",
                "serve",
                "--host",
                forge.address,
                "--port",
                str(FORGE_PORT),
                "--data-dir",
                str(root / "forge"),
            ],
            FORGE_PORT,
            f"http://{forge.address}:{FORGE_PORT}",
            DURAFIX_FORGE_ADMIN_TOKEN=admin,
        )
        services.append(emulator)
        script = combined_model_script(root / "model-script.yaml")
        model = _spawn(
            forge,
            root,
            "model",
            [
                *PY,
                "infra.modelserver",
                "serve",
                "--script",
                str(script),
                "--data-dir",
                str(root / "model"),
                "--host",
                forge.address,
                "--port",
                str(MODEL_PORT),
            ],
            MODEL_PORT,
            f"http://{forge.address}:{MODEL_PORT}/v1",
        )
        services.append(model)
        api = f"{emulator.url}/api/v3"
        base = DurafixConfig(
            state_dir=root / "operator",
            temporal_address=temporal.url,
            forge_api_url=api,
            forge_git_base=emulator.url,
            forge_token=stack.ensure_user(api, admin, stack.BOT_LOGIN),
            webhook_secret=secrets.token_hex(16),
            model_base_url=model.url,
            model_api_key="local-scripted-model",
            model_name="durafix-scripted",
            evidence_url=f"s3://{BUCKET}/runs?endpoint={s3.endpoint_url}",
            evidence_access_key=s3.access_key,
            evidence_secret_key=s3.secret_key,
            environment_provider="local",
            fast_timeouts=True,
            forge_seconds_between_writes=0,
            max_repair_attempts=2,
            operator_approval=True,
        )
        reviewer = stack.ensure_user(api, admin, stack.REVIEWER_LOGIN)
        base.save()
        for name in ("w1", "w2", "w3"):
            (root / name).mkdir(exist_ok=True)
            base.model_copy(update={"state_dir": root / name, "host_id": name}).save()
        w1 = net.hosts["w1"]
        receiver = _spawn(
            w1,
            root,
            "receiver",
            [
                *PY,
                "pipeline",
                "--state-dir",
                str(root / "w1"),
                "serve",
                "--host",
                w1.address,
                "--port",
                str(RECEIVER_PORT),
            ],
            RECEIVER_PORT,
            f"http://{w1.address}:{RECEIVER_PORT}/webhook",
            PYTHONPATH=str(REPO_ROOT),
        )
        e2e = E2EStack(config=base, admin_token=admin, reviewer_token=reviewer, receiver=receiver)
        cluster = Cluster(net=net, root=root, stack=e2e, base=base, services=services, s3=s3)
        for name, queues in (workers if workers is not None else ACTIVITY_QUEUES).items():
            cluster.spawn_worker(name, queues)
        yield cluster
    finally:
        if cluster is not None:
            cluster.close()
        else:
            _stop_all([], services, s3)
        net.close()
