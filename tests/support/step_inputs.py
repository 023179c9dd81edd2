"""Inputs of the workflow's steps as the tests that call the activities directly build them."""

from __future__ import annotations

from evidence.interface import ArtifactRef
from pipeline.steps import VerifyInput


def first_verify(
    run_id: str, spec_ref: ArtifactRef, patch_ref: ArtifactRef, message: str, commit_timestamp: int
) -> VerifyInput:
    """The run's first verification of the candidate ``patch_ref`` on ``spec_ref``, committed as ``message``."""
    return VerifyInput(
        run_id=run_id,
        op_id=f"{run_id}:verify:1",
        spec_ref=spec_ref,
        patch_ref=patch_ref,
        message=message,
        commit_timestamp=commit_timestamp,
    )
