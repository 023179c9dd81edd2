"""Worker hosts for the recovery tests: real activity implementations over real services.

A :class:`Worker` is what one ``durafix worker`` process holds: its own state directory (mirror cache,
workspaces, environment records) and a :class:`~pipeline.services.Services` built from config, sharing the
evidence store and the token-protected git remote with every other worker. Activities run through
``temporalio.testing.ActivityEnvironment``, i.e. exactly the functions a worker registers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar

from temporalio.testing import ActivityEnvironment

from environments.files import path_key
from environments.interface import EnvironmentHandle
from environments.processes import owned_pids
from evidence.interface import ArtifactKind, ArtifactRef
from pipeline.config import DurafixConfig
from pipeline.services import Services
from pipeline.steps import CleanupRunInput, PrepareProcedureInput, PrepareSpecInput, ProvisionInput, ReproduceInput
from tests.support.git_http import GitHttpServer
from tests.support.gitrepo import Repo

TOKEN = "recovery-token"
REPOSITORY = "acme/cart"
# One run ID per test process: a run's cleanup stops every process on the machine carrying the run's marker (it
# must, whichever of the host's workers started them), so two test processes sharing one would stop each other's
# apps (seen as a reproduction's app refusing connections after another module's teardown).
RUN_ID = f"repair:acme/cart#{os.getpid()}"
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
        self.env = self.services.environment_activities()
        self.browser = self.services.browser_activities()

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

    def provision_for_reproduction(self, remote: Remote) -> tuple[EnvironmentHandle, ReproduceInput]:
        """Provision the base revision's environment and prepare the sample report's reproduction on it."""
        handle = self.provision(self.prepare_spec(remote))
        return handle, self.reproduce_input(remote, handle)

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
