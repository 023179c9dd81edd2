"""The stepped attempt's agent activities on a local evidence store and real git, as the repair tests drive them:
the activities, the recovery spec they work from, and one model step's, tool step's or conclusion's input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from environments.spec import build_recovery_spec, canonical_json
from environments.workspace import WorkspaceManager
from evidence.interface import ArtifactKind, ArtifactRef, ArtifactStore
from evidence.local import LocalArtifactStore
from pipeline.activities.agent import AgentActivities
from pipeline.steps import AgentConcludeInput, AgentToolCall, AgentToolsInput, AgentTurnInput
from reviews.git_credentials import NO_GIT_CREDENTIALS
from tests.support.gitrepo import Repo
from tests.support.repair import engine_for


def activities(tmp_path: Path, base_url: str) -> tuple[AgentActivities, LocalArtifactStore]:
    """Agent activities asking the model server at ``base_url``, storing under ``tmp_path``, and their store."""
    store = LocalArtifactStore(tmp_path / "evidence")
    workspaces = WorkspaceManager(cache_dir=tmp_path / "cache", root=tmp_path / "workspaces")
    endpoint = engine_for(base_url).endpoint
    return AgentActivities(store, workspaces, lambda: endpoint, git_token=NO_GIT_CREDENTIALS), store


def spec_of(store: ArtifactStore, repo: Repo, run: str, repository: str = "shop/cart") -> ArtifactRef:
    """The recovery spec of ``repo`` (as ``repository``), stored for ``run`` as ``env.prepare_spec`` stores it."""
    spec = build_recovery_spec(repository, repo.url, repo.base, repo.work)
    return store.put_bytes(canonical_json(spec), kind=ArtifactKind.SPEC, run_id=run, name="spec.json")


def turn_input(run: str, turn: int, issue_title: str, token_budget: int, **fields: Any) -> AgentTurnInput:
    """The model step of attempt 1's ``turn``, as the workflow builds it; ``fields`` are its other fields."""
    return AgentTurnInput(
        run_id=run,
        op_id=f"{run}:repair:1:turn-{turn}",
        attempt=1,
        turn=turn,
        issue_title=issue_title,
        token_budget=token_budget,
        **fields,
    )


def tools_input(
    run: str,
    turn: int,
    spec_ref: ArtifactRef,
    transcript_ref: ArtifactRef,
    calls: list[AgentToolCall],
    patch_ref: ArtifactRef | None = None,
) -> AgentToolsInput:
    """The tool step of attempt 1's ``turn``, as the workflow builds it."""
    return AgentToolsInput(
        run_id=run,
        op_id=f"{run}:repair:1:tools-{turn}",
        attempt=1,
        turn=turn,
        spec_ref=spec_ref,
        transcript_ref=transcript_ref,
        patch_ref=patch_ref,
        calls=calls,
    )


def conclude_input(run: str, spec_ref: ArtifactRef, summary: str, **fields: Any) -> AgentConcludeInput:
    """The conclusion of attempt 1, as the workflow builds it; ``fields`` are its other fields (the patch and the
    transcript, what the turns spent)."""
    return AgentConcludeInput(
        run_id=run, op_id=f"{run}:repair:1", attempt=1, spec_ref=spec_ref, summary=summary, **fields
    )
