"""The run's whole record in the evidence store: ``evidence.record_run`` (environments queue).

The run answers its ``state`` query and returns its result bounded (:meth:`pipeline.state.RunState.bounded`):
the latest entries of each growing list and the count of the others. So that nothing is lost, the run stores
its whole state once it has ended (:func:`store_record`), as JSON addressed by content, and its result names
it (``record_ref``); :func:`read_record` reads it back, verified against its sha256. The write is not fenced:
it comes after the run's cleanup tombstoned it, and only adds a file under the run's own prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from temporalio import activity

from evidence.interface import ArtifactKind, ArtifactRef, ArtifactStore
from evidence.keys import marker_ref
from pipeline import steps
from pipeline.activities.classify import classified
from pipeline.state import RunState
from pipeline.steps import RecordRunInput

RECORD_NAME = "run-record.json"


_MEDIA_TYPE = "application/json"


def _record_bytes(state: RunState) -> bytes:
    return state.model_copy(update={"record_ref": None}).model_dump_json().encode()


def store_record(store: ArtifactStore, state: RunState) -> ArtifactRef:
    """``state`` whole (``record_ref`` left out: a record cannot name itself) stored by content under the run."""
    return store.put_bytes(
        _record_bytes(state),
        kind=ArtifactKind.OTHER,
        run_id=state.workflow_id,
        name=RECORD_NAME,
        media_type=_MEDIA_TYPE,
    )


def record_stored(store: ArtifactStore, state: RunState) -> bool:
    """Whether the record :func:`store_record` would write for ``state`` is already in ``store``: an earlier try
    of the same ``evidence.record_run`` (same input, same bytes, same key), on any host, stored it."""
    data = _record_bytes(state)
    ref = marker_ref(data, kind=ArtifactKind.OTHER, media_type=_MEDIA_TYPE, name=RECORD_NAME, run_id=state.workflow_id)
    return store.exists(ref)


def read_record(store: ArtifactStore, ref: ArtifactRef) -> RunState:
    """The whole state a run stored (:func:`store_record`); the store checks the bytes against ``ref``."""
    return RunState.model_validate_json(store.read_bytes(ref))


class RunRecordActivities:
    def __init__(self, store: ArtifactStore) -> None:
        self.store = store

    def all(self) -> Sequence[Callable[..., object]]:
        return [self.record_run]

    @activity.defn(name=steps.RECORD_RUN.name)
    def record_run(self, inp: RecordRunInput) -> ArtifactRef:
        """Store the run's whole state; idempotent (the same state is the same content, the same ref)."""
        with classified():
            return store_record(self.store, inp.state)
