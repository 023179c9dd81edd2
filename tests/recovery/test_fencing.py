"""A stale attempt that wakes after ``env.cleanup_run`` is fenced: it fails as ``Policy`` and creates nothing.

The late attempt runs in a fresh ``Services`` on the same host (a restarted worker process), so what fences
it is the run's tombstone on disk, not anything the cleaning process remembers.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from temporalio.exceptions import ApplicationError

from environments.interface import EnvironmentHandle
from environments.readiness import answers
from evidence.interface import ArtifactRef
from pipeline.steps import CleanupRunInput, ProvisionInput, VerifyInput
from tests.support.gitrepo import fixed_cart_source
from tests.support.proctree import wait_dead
from tests.support.recovery_workers import RUN_ID, Remote, Worker, app_pid, run_processes


def late_provision(worker: Worker, spec_ref: ArtifactRef, _patch_ref: ArtifactRef, op_id: str) -> object:
    return worker.run(worker.env.provision, ProvisionInput(run_id=RUN_ID, op_id=op_id, spec_ref=spec_ref))


def late_verify(worker: Worker, spec_ref: ArtifactRef, patch_ref: ArtifactRef, op_id: str) -> object:
    inp = VerifyInput(
        run_id=RUN_ID, op_id=op_id, spec_ref=spec_ref, patch_ref=patch_ref, message="late", commit_timestamp=0
    )
    return worker.run(worker.env.verify_candidate, inp)


LateAttempt = Callable[[Worker, ArtifactRef, ArtifactRef, str], object]


def assert_nothing_left(worker: Worker, handle: EnvironmentHandle) -> None:
    assert run_processes() == set()
    wait_dead(app_pid(handle))
    assert answers(handle.base_url, "/healthz") is not None
    assert worker.services.provider("local").list_owned(RUN_ID) == []
    assert worker.services.workspaces.list_owned(RUN_ID) == []
    assert not [p.name for p in worker.run_dir("workspaces").iterdir() if p.is_dir()]


@pytest.mark.parametrize(
    ("late_attempt", "op_id"),
    [
        (late_provision, f"{RUN_ID}:env-base:1"),
        (late_provision, f"{RUN_ID}:env-base:2"),
        (late_verify, f"{RUN_ID}:verify:1"),
    ],
    ids=["retried-provision", "new-provision", "verify"],
)
def test_an_attempt_waking_after_cleanup_is_fenced_and_creates_nothing(
    late_attempt: LateAttempt, op_id: str, remote: Remote, new_worker: Callable[[str], Worker]
) -> None:
    worker = new_worker("host")
    spec_ref = worker.prepare_spec(remote)
    patch_ref = worker.store_patch(remote.repo.make_patch({"cart.py": fixed_cart_source(remote.repo)}))
    handle = worker.provision(spec_ref)
    assert answers(handle.base_url, "/healthz") is None

    report = worker.run(worker.env.cleanup_run, CleanupRunInput(run_id=RUN_ID))
    assert report.complete, report.errors
    assert {r.kind.value for r in report.removed} == {"process", "workspace"}
    assert_nothing_left(worker, handle)

    restarted = new_worker("host")
    with pytest.raises(ApplicationError) as raised:
        late_attempt(restarted, spec_ref, patch_ref, op_id)
    assert raised.value.type == "Policy" and raised.value.non_retryable
    assert "fenced" in str(raised.value)
    assert_nothing_left(restarted, handle)


def test_an_attempt_waking_on_another_host_after_cleanup_is_fenced_by_the_shared_tombstone(
    remote: Remote, new_worker: Callable[[str], Worker]
) -> None:
    """Host B never saw the cleanup (its own state directory has no tombstone): the tombstone in the shared
    evidence store still stops it before it creates anything."""
    host_a = new_worker("host-a")
    spec_ref = host_a.prepare_spec(remote)
    handle = host_a.provision(spec_ref)
    report = host_a.run(host_a.env.cleanup_run, CleanupRunInput(run_id=RUN_ID))
    assert report.complete, report.errors

    host_b = new_worker("host-b")
    with pytest.raises(ApplicationError) as raised:
        late_provision(host_b, spec_ref, spec_ref, f"{RUN_ID}:env-base:2")
    assert raised.value.type == "Policy" and "cleaned up" in str(raised.value)
    assert run_processes() == set()
    assert host_b.services.provider("local").list_owned(RUN_ID) == []
    assert host_b.services.workspaces.list_owned(RUN_ID) == []
    assert not host_b.run_dir("workspaces").exists()
    wait_dead(app_pid(handle))
