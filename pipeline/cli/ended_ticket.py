"""The ticket of a run that ended without its own ending: terminated, or stopped by its deadline.

Such a run never ran its cleanup step nor its last ticket update, so its status comment on the issue still
says it is working. ``durafix cleanup --run RUN --yes`` brings it up to date after cleaning
(:func:`update_ended_ticket`): the run's end, what was cleaned on this host or what could not be and why, the
last state the run recorded (:mod:`pipeline.recorded_state`) and how to try again.

Idempotent: the text depends only on what it is given (no clock), and the forge adapter does not re-send an
identical body, so running cleanup again changes nothing on the forge. The ticket is found by its marker and
claim (``reviews.tickets``), never by the run's state, which needs a worker to read.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from environments.interface import CleanupReport
from pipeline.config import DurafixConfig
from pipeline.ids import op_id, parse_workflow_id
from pipeline.recorded_state import RecordedState
from pipeline.services import Services

SKIPPED_CLEANUP = frozenset({"terminated", "timed_out"})
"""Temporal statuses of runs whose workflow code never reached its cleanup and final ticket update."""


@dataclass(frozen=True)
class TicketUpdate:
    """What :func:`update_ended_ticket` did: ``url`` of the ticket updated, or ``error`` (None: none found)."""

    url: str | None = None
    error: str | None = None


def ended_ticket_body(
    workflow_id: str,
    status: str,
    closed_at: datetime | None,
    recorded: RecordedState | None,
    report: CleanupReport | None,
    trigger_label: str,
) -> str:
    """The ticket's text for a run ``status`` (``terminated``, ``timed_out``) cleaned up by hand. ``report``
    is that cleanup's (None: the run owned nothing on this host)."""
    how = "was terminated" if status == "terminated" else "ran out of time (its deadline passed)"
    when = f" at {closed_at.isoformat(timespec='seconds')}" if closed_at else ""
    lines = [
        f"**durafix** has stopped working on this report (`{workflow_id}`): the run {how}{when}, before its "
        "own cleanup and final update.",
        "",
        f"- outcome: **{status.replace('_', ' ')}**",
    ]
    if recorded is not None:
        lines.append(f"- last recorded phase: `{recorded.phase}` (at {recorded.at.isoformat(timespec='seconds')})")
        if recorded.pr:
            lines.append(f"- draft PR: {recorded.pr} (commit `{recorded.commit}`), left open for a human to judge")
    if report is None:
        lines.append("- cleaned: nothing of this run was left on the host that cleaned up")
    else:
        if report.removed:
            removed = ", ".join(f"{r.kind} `{r.resource_id}`" for r in report.removed)
            lines.append(f"- cleaned: {len(report.removed)} resource(s) removed ({removed})")
        if report.remaining:
            remaining = ", ".join(f"{r.kind} `{r.resource_id}`" for r in report.remaining)
            lines.append(f"- **not cleaned**: {remaining}; an operator must finish it (`durafix cleanup --run`)")
        for error in report.errors:
            lines.append(f"- cleanup error: {error}")
        if not (report.removed or report.remaining or report.errors):
            lines.append("- cleaned: nothing of this run was left")
    lines += [
        "",
        f"To try again: comment `/durafix retry` on this issue, or remove the `{trigger_label}` label and add it "
        "again. A new run starts from the report as it reads then.",
    ]
    return "\n".join(lines) + "\n"


def update_ended_ticket(config: DurafixConfig, workflow_id: str, body: str) -> TicketUpdate:
    """Replace the run's ticket text with ``body`` (found by its ``<run>:ticket`` operation ID). A run that
    made no ticket gives ``TicketUpdate()``; a forge failure is ``TicketUpdate(error=...)``, never raised."""
    repository, _ = parse_workflow_id(workflow_id)
    try:
        forge = Services(config).forge(repository)
        ticket = forge.find_ticket(op_id(workflow_id, "ticket"))
        if ticket is None:
            return TicketUpdate()
        updated = forge.update_ticket(ticket, body)
    except Exception as err:  # any forge failure is reported with the cleanup, which has already happened
        return TicketUpdate(error=f"{type(err).__name__}: {err}")
    return TicketUpdate(url=updated.html_url or ticket.html_url)
