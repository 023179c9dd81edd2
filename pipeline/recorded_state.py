"""The compact state a run keeps in its memo, readable without a worker.

The ``state`` query answers only while a worker polls ``durafix-orchestration`` (Temporal replays the run on
a worker to answer it). A run started with :data:`pipeline.patches.STATE_MEMO_PATCH` upserts this summary into
its memo under :data:`STATE_MEMO` at every phase change and when it starts waiting for a review; the memo is
kept by the server and returned by ``describe``, so ``durafix status`` can say what the run last recorded after every
worker died. It is a snapshot, never live: ``at`` is the workflow time it was recorded at.

Kept small (a memo is stored with each upsert event): identities, links and the last outcome's detail cut
to :data:`DETAIL_CHARS`. Pure: no Temporal, no I/O, so the workflow and the CLI both import it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from pipeline.state import RunState

STATE_MEMO = "state"
"""The memo key the run's :class:`RecordedState` is upserted under."""
DETAIL_CHARS = 240


class RecordedState(BaseModel):
    """What the run recorded at ``at``: its phase, outcome and the forge objects it made."""

    at: datetime
    phase: str
    outcome: str | None = None
    detail: str = ""
    ticket: str | None = None
    branch: str | None = None
    commit: str | None = None
    pr: str | None = None
    awaiting: str | None = None
    merged: str | None = None
    cleanup: str | None = None
    attempts: int = 0


def recorded_state(state: RunState, at: datetime) -> dict[str, Any]:
    """The memo value for ``state`` at ``at``: JSON-ready, ``None`` fields left out to keep it small."""
    detail = state.outcome_detail
    if len(detail) > DETAIL_CHARS:
        detail = detail[: DETAIL_CHARS - 1] + "…"
    publish = state.publish
    approval = state.pending_approval
    recorded = RecordedState(
        at=at,
        phase=state.phase.value,
        outcome=state.outcome.value if state.outcome else None,
        detail=detail,
        ticket=state.ticket.url if state.ticket else None,
        branch=publish.branch if publish else None,
        commit=publish.commit if publish else None,
        pr=publish.pr_url if publish else None,
        awaiting=f"PR #{approval.pr_number} head {approval.head_sha}" if approval else None,
        merged=state.merged_sha,
        cleanup=state.cleanup.status.value if state.cleanup else None,
        attempts=len(state.candidates),
    )
    return recorded.model_dump(mode="json", exclude_none=True, exclude_defaults=True) | {
        "at": recorded.at.isoformat(),
        "phase": recorded.phase,
    }


def parse_recorded(value: object) -> RecordedState | None:
    """The memo value read back (a decoded JSON object); None when absent or not one of ours."""
    if not isinstance(value, dict):
        return None
    try:
        return RecordedState.model_validate(value)
    except ValidationError:
        return None
