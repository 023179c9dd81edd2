"""The run's tombstone, checked by the forge activities before they create or change anything.

``env.cleanup_run`` writes the run's tombstone to the shared evidence store before it removes anything
(:mod:`environments.run_fence`). A stale attempt of a forge step (its worker stopped or cut off, its task
timed out and retried elsewhere, the run since finished) may wake after that; without this check it would
push the run's branch again, open a second PR for it (``reviews.pulls`` finds only *open* PRs, and the run's
was merged or closed), or post a comment the run's end already superseded. So every forge activity that
writes (ticket, comments, branch push, PR, review requests, merge) calls :func:`ensure_run_open` first and
refuses as :class:`~environments.interface.RunFencedError` (``Policy``, never retried) once the tombstone
exists. Cleanup and pure reads do not check.

The run is the attempt's workflow: every forge step is a step of ``repair_bug``, whose workflow ID is the run
ID the tombstone is keyed by, so no step input has to carry it.

What this fences is an attempt that *starts* (or reaches its write) after the cleanup. A check and the forge
write that follows are not one atomic act: an attempt stopped between the two writes late; for those the
forge adapter's own guards hold (claims and markers: one ticket, PR and comment per key; leases on branch
pushes), and Temporal refuses the stale attempt's completion.

The one write a run makes after its cleanup is its closing ticket update (``UpdateTicketInput.closing``): it
is issued only once the tombstone exists, it only edits the run's existing status comment to the run's final
state, and a stale retry of it sends the same body.
"""

from __future__ import annotations

from temporalio import activity

from environments.run_fence import ensure_not_fenced
from evidence.interface import ArtifactStore
from pipeline.failures import FailureClass


def attempt_run_id() -> str:
    """The run this forge attempt belongs to: the ID of the workflow that scheduled it."""
    run_id = activity.info().workflow_id
    if run_id is None:
        raise FailureClass.PERMANENT.error("a forge step was started outside a run; it cannot be fenced")
    return run_id


def ensure_run_open(store: ArtifactStore, what: str, run_id: str | None = None) -> None:
    """Raise :class:`~environments.interface.RunFencedError` when the run (``run_id``, else the attempt's
    workflow) was cleaned up; read-only, one ``exists`` of the evidence store."""
    ensure_not_fenced(store, run_id or attempt_run_id(), what)
