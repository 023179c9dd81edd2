"""What the activities that work on a run's workspace share: the run's spec, read once the run is known not to
be fenced, a workspace rebuilt at a revision (with a patch) under the forge's credentials, and a proposed patch
judged by the repository's patch policy."""

from __future__ import annotations

from collections.abc import Mapping

from environments.interface import RecoverySpec
from environments.run_fence import ensure_not_fenced
from environments.spec import spec_from_json
from environments.workspace import Workspace, WorkspaceManager
from evidence.interface import ArtifactRef, ArtifactStore
from pipeline.activities.classify import classified
from repair.patch import PatchCheck, validate_patch
from repair.patch_policy import PatchPolicy, policy_for
from reviews.git_credentials import GitCredentials


def open_spec(store: ArtifactStore, spec_ref: ArtifactRef, run_id: str, why: str) -> RecoverySpec:
    """The run's recovery spec; refused (the run's fence, classified) once the run has ended. ``why``: what it
    is read for, said in the refusal."""
    spec = spec_from_json(store.read_bytes(spec_ref))
    with classified():
        ensure_not_fenced(store, run_id, why)
    return spec


def rebuild(
    workspaces: WorkspaceManager,
    git_token: GitCredentials,
    run_id: str,
    op_id: str,
    clone_url: str,
    base: str,
    patch: str | None = None,
) -> Workspace:
    """The workspace of ``op_id``: ``clone_url`` at ``base`` with ``patch`` applied (see
    :meth:`environments.workspace.WorkspaceManager.rebuild`)."""
    token = git_token.token_for(clone_url)
    return workspaces.rebuild(
        run_id=run_id, op_id=op_id, clone_url=clone_url, base_revision=base, patch=patch, token=token
    )


def check_patch(
    workspaces: WorkspaceManager,
    git_token: GitCredentials,
    policies: Mapping[str, PatchPolicy],
    spec: RecoverySpec,
    patch: str,
) -> PatchCheck:
    """``patch`` judged by the repository's patch policy against the mirror, never a workspace: a model's or an
    agent CLI's commands may have rewritten the workspace's .git (its config, objects, refs), the mirror is only
    ever written by durafix."""
    token = git_token.token_for(spec.clone_url)
    with workspaces.mirrors.borrowed(spec.clone_url, spec.base_revision, token=token) as mirror:
        return validate_patch(mirror, patch, base=spec.base_revision, policy=policy_for(policies, spec.repository))


class PatchingActivities:
    """What the activities proposing or judging an attempt's patch hold: the artifact store, the workspaces, the
    forge's credentials, and the operator's patch policies per repository (:func:`repair.patch_policy.policy_for`)."""

    def __init__(
        self,
        store: ArtifactStore,
        workspaces: WorkspaceManager,
        git_token: GitCredentials,
        patch_policies: Mapping[str, PatchPolicy] | None,
    ) -> None:
        self.store = store
        self.workspaces = workspaces
        self.git_token = git_token
        self.patch_policies = dict(patch_policies or {})

    def judge_patch(self, spec: RecoverySpec, patch: str) -> PatchCheck:
        """``patch`` judged by the repository's patch policy (:func:`check_patch`)."""
        return check_patch(self.workspaces, self.git_token, self.patch_policies, spec, patch)
