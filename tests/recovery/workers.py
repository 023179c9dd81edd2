"""Worker hosts for the recovery tests: real activity implementations over real services.

A :class:`Worker` is what one ``durafix worker`` process holds: its own state directory (mirror cache,
workspaces, environment records) and a :class:`~pipeline.services.Services` built from config, sharing the
evidence store and the token-protected git remote with every other worker. Activities run through
``temporalio.testing.ActivityEnvironment``, i.e. exactly the functions a worker registers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar

from temporalio.testing import ActivityEnvironment

from browser.activities import BrowserActivities
from environments.activities import EnvironmentActivities
from environments.files import path_key
from environments.interface import EnvironmentHandle
from environments.processes import owned_pids, read_stat
from evidence.interface import ArtifactKind, ArtifactRef
from pipeline.config import DurafixConfig
from pipeline.services import Services
from pipeline.steps import CleanupRunInput, PrepareProcedureInput, PrepareSpecInput, ProvisionInput, ReproduceInput
from tests.environments.git_http import GitHttpServer
from tests.environments.gitrepo import Repo

TOKEN = "recovery-token"
REPOSITORY = "acme/cart"
RUN_ID = "repair:acme/cart#7"
CART_REPORT = (Path(__file__).resolve().parents[2] / "examples" / "cart" / "ISSUE.md").read_text()

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class Remote:
    """The sample app's repository, served over smart HTTP behind :data:`TOKEN`."""

    repo: Repo
    server: GitHttpServer

    @property
    def clone_url(self) -> str:
        return self.server.url(self.repo.bare.name)


class Worker:
    """One worker host: its own state directory, the shared evidence store and remote."""

    def __init__(self, state_dir: Path, evidence_dir: Path) -> None:
        self.config = DurafixConfig(state_dir=state_dir, evidence_url=evidence_dir.as_uri(), forge_token=TOKEN)
        self.services = Services(self.config)
        self.env = EnvironmentActivities(self.services)
        self.browser = BrowserActivities(self.services)

    def run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run one activity attempt as the worker would (no heartbeat listener)."""
        return ActivityEnvironment().run(fn, *args, **kwargs)

    def prepare_spec(self, remote: Remote) -> ArtifactRef:
        return self.run(
            self.env.prepare_spec,
            PrepareSpecInput(
                run_id=RUN_ID,
                op_id=f"{RUN_ID}:spec",
                repository=REPOSITORY,
                clone_url=remote.clone_url,
                base_revision=remote.repo.base,
            ),
        )

    def provision(self, spec_ref: ArtifactRef, op_id: str = f"{RUN_ID}:env-base:1") -> EnvironmentHandle:
        return self.run(self.env.provision, ProvisionInput(run_id=RUN_ID, op_id=op_id, spec_ref=spec_ref))

    def reproduce_input(self, remote: Remote, handle: EnvironmentHandle) -> ReproduceInput:
        """Reproduce the sample report's procedure on ``handle`` (the environment of the base revision)."""
        report = PrepareProcedureInput(run_id=RUN_ID, report_body=CART_REPORT)
        procedure = self.run(self.browser.prepare_procedure, report)
        assert procedure.procedure_ref is not None, procedure.error
        return ReproduceInput(
            run_id=RUN_ID,
            op_id=f"{RUN_ID}:reproduce-base:1",
            revision=remote.repo.base,
            procedure_ref=procedure.procedure_ref,
            environment=handle,
            readiness_path="/healthz",
        )

    def store_patch(self, patch: str) -> ArtifactRef:
        return self.services.store.put_bytes(
            patch.encode(), kind=ArtifactKind.PATCH, run_id=RUN_ID, name="candidate.patch", media_type="text/x-diff"
        )

    def run_dir(self, what: str) -> Path:
        """The run's directory under ``workspaces`` or ``environments`` of this worker's state directory."""
        return self.config.state_dir / what / path_key(RUN_ID)

    def close(self) -> None:
        """Stop everything the run still owns on this worker and the kept browser, as a shutdown would."""
        self.run(self.env.cleanup_run, CleanupRunInput(run_id=RUN_ID))
        self.services.browser.close()


def run_processes() -> set[int]:
    """Live processes carrying the run's ownership marker (``DURAFIX_OWNER=<run-key>/...``)."""
    return owned_pids(f"{path_key(RUN_ID)}/", prefix=True)


def app_pid(handle: EnvironmentHandle) -> int:
    return int(handle.resources[0].detail["pid"])


def wait_dead(pid: int, deadline_s: float = 10.0) -> None:
    """Until ``pid`` is gone or a zombie (it holds no port or file any more)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        stat = read_stat(pid)
        if stat is None or not stat.live:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still alive after SIGKILL")


def descendants(matches: Callable[[list[str]], bool]) -> set[int]:
    """Live processes descended from this test process whose argv ``matches`` (never another's)."""
    parents: dict[int, int] = {}
    commands: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] in ("Z", "X"):
            continue
        parents[int(entry.name)] = int(fields[1])
        commands[int(entry.name)] = argv

    def ours(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    return {pid for pid, argv in commands.items() if argv and matches(argv) and ours(pid)}


def is_chromium_browser(argv: list[str]) -> bool:
    """The browser process itself, not one of its renderer, GPU or zygote helpers."""
    return Path(argv[0]).name == "chromium" and not any(a.startswith("--type=") for a in argv)
