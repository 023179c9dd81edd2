"""Durable "this call had started" marks, for steps whose effect may not be repeated behind anyone's back.

A run tool executes the repository's code (:mod:`repair.tools`, ``Replay.REPORT_INTERRUPTED``). Its activity
writes a mark to the shared evidence store just before the code starts, and looks for it first: a try that
finds the mark knows an earlier try (on any host) started the code and was lost before its result was
recorded, so it records the call as interrupted instead of running it again.

The mark is a content-addressed artifact whose bytes depend only on the run and the operation ID, like the
run's tombstone (:mod:`environments.run_fence`): any worker computes its reference without having seen it,
and writing it twice is the same conditional create. A mark written but followed by no run at all (the
worker died between the two) also reads as interrupted: the contract errs towards telling the model, never
towards a second run.
"""

from __future__ import annotations

from evidence.interface import ArtifactKind, ArtifactRef, ArtifactStore
from evidence.keys import marker_ref

_MEDIA_TYPE = "text/plain"
_NAME = "started-mark.txt"


def _content(run_id: str, op_id: str) -> bytes:
    return f"durafix started mark\nrun: {run_id}\noperation: {op_id}\n".encode()


def _ref(run_id: str, op_id: str) -> ArtifactRef:
    return marker_ref(
        _content(run_id, op_id), kind=ArtifactKind.OTHER, media_type=_MEDIA_TYPE, name=_NAME, run_id=run_id
    )


def had_started(store: ArtifactStore, run_id: str, op_id: str) -> bool:
    """Whether some try of ``op_id`` marked itself started."""
    return store.exists(_ref(run_id, op_id))


def mark_started(store: ArtifactStore, run_id: str, op_id: str) -> None:
    """Mark ``op_id`` started; idempotent. Call it before the effect begins, never after."""
    store.put_bytes(_content(run_id, op_id), kind=ArtifactKind.OTHER, run_id=run_id, name=_NAME, media_type=_MEDIA_TYPE)
