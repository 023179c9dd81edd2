"""A retry of ``model.propose_patch`` whose earlier tries spent the whole budget stops before any work."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from environments.interface import RecoverySpec
from environments.spec import canonical_json, load_recipe
from evidence.interface import ArtifactKind
from pipeline.config import DurafixConfig
from pipeline.services import Services
from pipeline.steps import ProposePatchInput
from tests.support.gitrepo import CART_APP


def test_a_retry_with_no_budget_left_fails_as_budget_without_rebuilding_a_workspace(tmp_path: Path) -> None:
    services = Services(DurafixConfig(state_dir=tmp_path / "state"))
    # A clone URL nothing answers: rebuilding a workspace from it could only fail.
    spec = RecoverySpec(
        repository="acme/cart",
        clone_url=(tmp_path / "no-such-repo.git").as_uri(),
        base_revision="3f" * 20,
        recipe=load_recipe(CART_APP),
    )
    spec_ref = services.store.put_bytes(canonical_json(spec), kind=ArtifactKind.SPEC, run_id="run-1")
    env = ActivityEnvironment()
    earlier = {"prompt_tokens": 700, "completion_tokens": 300}
    env.info = dataclasses.replace(env.info, heartbeat_details=[{"detail": "asking the model", "spent": earlier}])
    beats: list[object] = []
    env.on_heartbeat = lambda *details: beats.extend(details)
    inp = ProposePatchInput(
        run_id="run-1",
        op_id="run-1:propose-1",
        attempt=1,
        spec_ref=spec_ref,
        issue_title="Cart total wrong",
        issue_body="The total is wrong.",
        token_budget=1000,
    )

    with pytest.raises(ApplicationError) as failed:
        env.run(services.model_activities().propose_patch, inp)

    assert failed.value.type == "Budget" and failed.value.non_retryable
    carried = {**earlier, "transport_failures": 0}  # the spend carries its transport failures too
    assert failed.value.details == (carried,)
    # The last heartbeat hands the spend on, as any failure of the activity does.
    last = beats[-1]
    assert isinstance(last, dict) and last["spent"] == carried
    workspaces = tmp_path / "state" / "workspaces"
    assert not workspaces.exists() or not any(workspaces.iterdir())
