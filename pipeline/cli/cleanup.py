"""``durafix cleanup``: remove what one run owns, or what finished and unknown runs left behind.

- ``cleanup --run RUN [--yes [--force]] [--json]``: the resources ``RUN`` owns (``repair:OWNER/REPO#N`` or
  ``OWNER/REPO#N``). Without ``--yes`` a dry run: it lists them and changes nothing. With ``--yes`` every
  holder's ``cleanup_run`` is called (tombstone first, idempotent, only that run's resources). A run still
  RUNNING in Temporal, or whose status cannot be read because Temporal is unreachable, is refused unless
  ``--force`` is given as well: removing a live run's resources breaks it, and the workflow cleans up after
  itself when it ends.
  A run that ended ``terminated`` or ``timed_out`` never ran its own cleanup nor its final ticket update:
  with ``--yes`` its ticket on the forge is then brought up to date as well (:mod:`pipeline.cli.ended_ticket`:
  the ending, what was cleaned or what could not be, how to retry), also when it owns nothing here; under
  ``ticket`` in ``--json``. A ticket that cannot be updated is exit 1, the cleanup itself stands.
- ``cleanup --orphans [--yes] [--json]``: the resources of runs that are closed in Temporal (completed,
  failed, cancelled, terminated, timed out) or unknown to it (``NOT_FOUND``). The target set is computed
  once, before acting, and never widened: each target run is re-checked just before it is cleaned (a run
  that became live again is skipped, which only narrows the set), a failed run is reported and the others
  still cleaned, and nothing is listed again. If Temporal cannot be reached the command refuses: an
  unreachable engine must never make every run look orphaned. A namespace check before the first lookup
  keeps a wrong namespace (whose lookups also answer ``NOT_FOUND``) from doing the same. Resources labelled
  with something that is not a run ID are never targets: Temporal cannot vouch for them.

``--json`` prints one document on stdout (dry run: the planned ``resources``/``targets``; with ``--yes``:
``removed``, ``remaining`` and ``errors`` per run; ``refused`` when refused); warnings go to stderr.

Exit codes: 0 done, or dry run listed; 1 something remains (each named with its error), or a configured
holder could not be listed (so the listing may be incomplete); 2 usage error or refused; 3 ``--run`` names a
run that owns nothing here (``SystemExit(2)`` from argument parsing for usage errors).
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from environments.interface import CleanupReport, OwnedResource
from environments.inventory import (
    Holder,
    Inventory,
    Unavailable,
    clean_run,
    fully_cleaned,
    open_holders,
    render_resources,
    resource_json,
    take_inventory,
    unavailable_json,
)
from pipeline.cli.command import AddArguments
from pipeline.cli.ended_ticket import SKIPPED_CLEANUP, ended_ticket_body, update_ended_ticket
from pipeline.cli.output import Printer
from pipeline.cli.run_ids import is_run_id, run_option
from pipeline.client import recorded_state_of
from pipeline.config import DurafixConfig
from pipeline.temporal_connection import connect

EXIT_OK, EXIT_REMAINS, EXIT_REFUSED, EXIT_NOT_FOUND = 0, 1, 2, 3

NOT_FOUND = "not-found"
CLOSED = frozenset(
    s.name.lower()
    for s in (
        WorkflowExecutionStatus.COMPLETED,
        WorkflowExecutionStatus.FAILED,
        WorkflowExecutionStatus.CANCELED,
        WorkflowExecutionStatus.TERMINATED,
        WorkflowExecutionStatus.TIMED_OUT,
    )
)
RPC_TIMEOUT = timedelta(seconds=10)
CONNECT_TIMEOUT_S = 10.0


class TemporalUnreachableError(Exception):
    """Temporal could not be asked (connection, namespace or RPC failure); the message says which."""


def is_orphan(status: str) -> bool:
    """Closed or unknown to Temporal. Anything else (running, continued, unreadable) counts as live."""
    return status == NOT_FOUND or status in CLOSED


class RunStatuses:
    """Run statuses read from Temporal, one ``describe`` per call (never cached: re-checks must be fresh)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    @classmethod
    async def connect(cls, config: DurafixConfig) -> RunStatuses:
        """Connect and check the namespace exists, or raise :class:`TemporalUnreachableError`."""
        where = f"{config.temporal_address} (namespace {config.temporal_namespace})"
        try:
            client = await asyncio.wait_for(connect(config), CONNECT_TIMEOUT_S)
            await client.workflow_service.describe_namespace(
                DescribeNamespaceRequest(namespace=config.temporal_namespace), timeout=RPC_TIMEOUT
            )
        except TimeoutError as err:
            raise TemporalUnreachableError(
                f"Temporal at {where} did not answer within {CONNECT_TIMEOUT_S:.0f}s"
            ) from err
        except RuntimeError as err:
            raise TemporalUnreachableError(f"cannot reach Temporal at {where}: {err}") from err
        except RPCError as err:
            raise TemporalUnreachableError(f"Temporal at {where} failed the namespace check: {err}") from err
        return cls(client)

    async def status(self, run_id: str) -> str:
        """``running``, ``completed``, ... or ``not-found``; raises :class:`TemporalUnreachableError`."""
        try:
            desc = await self.client.get_workflow_handle(run_id).describe(rpc_timeout=RPC_TIMEOUT)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return NOT_FOUND
            raise TemporalUnreachableError(f"cannot read the status of {run_id} from Temporal: {err}") from err
        return desc.status.name.lower() if desc.status is not None else "unreadable"


@dataclass
class RunOutcome:
    """One run's part in a cleanup: what was planned and, once acted on, the report."""

    run_id: str
    status: str | None
    planned: list[OwnedResource]
    report: CleanupReport | None = None
    skipped: bool = False
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.report is not None and fully_cleaned(self.report)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"run_id": self.run_id, "temporal_status": self.status}
        if self.report is None:
            data["resources"] = [resource_json(r) for r in self.planned]
        else:
            data["removed"] = [resource_json(r) for r in self.report.removed]
            data["remaining"] = [resource_json(r) for r in self.report.remaining]
            data["errors"] = list(self.report.errors)
        if self.skipped:
            data["skipped"] = True
        if self.note:
            data["note"] = self.note
        return data


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Remove what a run owns (processes, containers, networks, volumes, workspaces). Dry run unless --yes."
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--run", help="repair:OWNER/REPO#N or OWNER/REPO#N")
    target.add_argument("--orphans", action="store_true", help="runs closed in Temporal or unknown to it")
    parser.add_argument("--yes", action="store_true", help="remove; without it nothing is changed")
    parser.add_argument("--force", action="store_true", help="with --run --yes: also when the run is live or unknown")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")

    def check(args: argparse.Namespace) -> None:
        if args.force and not (args.yes and args.run):
            parser.error("--force only applies to --run ... --yes")
        args.run_id = run_option(parser, args.run)

    parser.set_defaults(fn=cmd_cleanup, check=check)


def cmd_cleanup(args: argparse.Namespace, config: DurafixConfig) -> int:
    """``cleanup``: one run's resources (``args.run_id``), or the orphans' when it is None."""
    holders, unopened = open_holders(
        config.state_dir, environment_provider=config.environment_provider, docker_host=config.docker_host
    )
    printer = Printer("durafix cleanup", as_json=args.json)
    if args.run_id is not None:
        code = asyncio.run(_cleanup_run(config, holders, unopened, args.run_id, args.yes, args.force, printer))
    else:
        code = asyncio.run(_cleanup_orphans(config, holders, unopened, args.yes, printer))
    return printer.finish(code)


ARGUMENTS: dict[str, AddArguments] = {"cleanup": _arguments}


async def _cleanup_run(
    config: DurafixConfig,
    holders: list[Holder],
    unopened: list[Unavailable],
    run_id: str,
    yes: bool,
    force: bool,
    out: Printer,
) -> int:
    inventory = await asyncio.to_thread(take_inventory, holders, unopened, run_id)
    status, temporal_error = await _status_once(config, run_id)
    out.document.update(
        run_id=run_id,
        temporal_status=status,
        dry_run=not yes,
        unavailable=unavailable_json(inventory.unavailable),
    )
    if temporal_error is not None:
        out.document["temporal_error"] = temporal_error
    _report_unavailable(out, inventory)
    if not inventory.resources:
        if not inventory.complete:
            out.warn(f"no resources of {run_id} found, but the listing above is incomplete")
            return EXIT_REMAINS
        out.warn(f"{run_id} owns no resources here (already cleaned up, or never provisioned on this host)")
        out.document["resources"] = []
        if yes and not await _bring_ticket_up_to_date(config, run_id, status, None, out):
            return EXIT_REMAINS
        return EXIT_NOT_FOUND

    live_reason = _live_reason(run_id, status, temporal_error)
    if not yes:
        if live_reason:
            out.warn(live_reason)
        out.line(f"{run_id} ({describe_status(status)}) owns; dry run, nothing was changed:")
        out.line(render_resources(inventory.resources))
        out.line()
        out.line(f"to remove: durafix cleanup --run '{run_id}' --yes" + (" --force" if live_reason else ""))
        if status in SKIPPED_CLEANUP:
            out.line(f"(the run is {status}: with --yes its ticket on the forge is brought up to date too)")
        out.document["resources"] = [resource_json(r) for r in inventory.resources]
        return EXIT_OK if inventory.complete else EXIT_REMAINS
    if live_reason and not force:
        refusal = "refusing without --force: " + live_reason
        out.warn(refusal)
        out.document["refused"] = refusal
        return EXIT_REFUSED

    outcome = RunOutcome(run_id=run_id, status=status, planned=inventory.resources)
    outcome.report = await asyncio.to_thread(clean_run, holders, run_id, inventory.resources, unopened)
    out.document.update(outcome.to_json())
    _print_outcome(out, outcome)
    ticket_ok = await _bring_ticket_up_to_date(config, run_id, status, outcome.report, out)
    return EXIT_OK if outcome.ok and inventory.complete and ticket_ok else EXIT_REMAINS


async def _bring_ticket_up_to_date(
    config: DurafixConfig, run_id: str, status: str | None, report: CleanupReport | None, out: Printer
) -> bool:
    """For a run that skipped its own ending (:data:`SKIPPED_CLEANUP`), write the cleanup's outcome and how to
    retry into its ticket; False when that failed (said on stderr and under ``ticket``). Other runs: True."""
    if status not in SKIPPED_CLEANUP:
        return True
    closed_at, recorded = None, None
    try:
        statuses = await RunStatuses.connect(config)
        desc = await statuses.client.get_workflow_handle(run_id).describe(rpc_timeout=RPC_TIMEOUT)
        closed_at, recorded = desc.close_time, await recorded_state_of(desc)
    except (TemporalUnreachableError, RPCError) as err:
        out.warn(f"the ticket is written without the run's recorded state: {err}")
    body = ended_ticket_body(run_id, status, closed_at, recorded, report, config.trigger_label)
    update = await asyncio.to_thread(update_ended_ticket, config, run_id, body)
    if update.error is not None:
        out.warn(f"could not update the ticket of {run_id} on the forge: {update.error}; run the cleanup again")
        out.document["ticket"] = {"updated": False, "error": update.error}
        return False
    if update.url is None:
        out.line(f"{run_id} has no ticket on the forge to update")
        out.document["ticket"] = {"updated": False, "error": None}
        return True
    out.line(f"ticket updated: {update.url} (says the run is {status}, what was cleaned and how to retry)")
    out.document["ticket"] = {"updated": True, "url": update.url}
    return True


async def _status_once(config: DurafixConfig, run_id: str) -> tuple[str | None, str | None]:
    """The run's status, or ``(None, why)`` when Temporal cannot say."""
    try:
        statuses = await RunStatuses.connect(config)
        return await statuses.status(run_id), None
    except TemporalUnreachableError as err:
        return None, str(err)


def describe_status(status: str | None) -> str:
    if status is None:
        return "of unknown status"
    return "unknown to Temporal" if status == NOT_FOUND else f"{status} in Temporal"


def _live_reason(run_id: str, status: str | None, temporal_error: str | None) -> str:
    """Why cleaning ``run_id`` now may break a live run; empty when it is closed or unknown to Temporal."""
    if temporal_error is not None:
        return f"{temporal_error}; the status of {run_id} is unknown and it may still be running"
    if status is not None and not is_orphan(status):
        return (
            f"{run_id} is still {status} in Temporal: removing its resources breaks it, and it cleans up after "
            f"itself when it ends (to stop it: durafix cancel '{run_id}')"
        )
    return ""


async def _cleanup_orphans(
    config: DurafixConfig, holders: list[Holder], unopened: list[Unavailable], yes: bool, out: Printer
) -> int:
    out.document["dry_run"] = not yes
    try:
        statuses = await RunStatuses.connect(config)
    except TemporalUnreachableError as err:
        return _refuse_orphans(out, str(err))
    inventory = await asyncio.to_thread(take_inventory, holders, unopened)
    out.document["unavailable"] = unavailable_json(inventory.unavailable)
    _report_unavailable(out, inventory)

    # The plan: fixed here, before anything is removed.
    targets: list[RunOutcome] = []
    kept: list[RunOutcome] = []
    for run_id, resources in inventory.by_run().items():
        if not is_run_id(run_id):
            # Temporal cannot vouch for a run it could not have started; such resources are for a human.
            kept.append(RunOutcome(run_id, None, resources, note="not a run ID; inspect by hand"))
            continue
        try:
            status = await statuses.status(run_id)
        except TemporalUnreachableError as err:
            return _refuse_orphans(out, str(err))
        (targets if is_orphan(status) else kept).append(RunOutcome(run_id, status, resources))
    out.document["kept"] = [k.to_json() for k in kept]
    for k in kept:
        why = k.note or "it cleans up after itself"
        out.line(
            f"kept: {k.run_id or '(no run label)'} is {describe_status(k.status)} ({len(k.planned)} resources); {why}"
        )
    if not targets:
        out.line("no orphaned resources")
        out.document["targets"] = []
        return EXIT_OK if inventory.complete else EXIT_REMAINS

    if not yes:
        for t in targets:
            out.line(f"orphaned: {t.run_id} is {describe_status(t.status)} ({len(t.planned)} resources)")
        out.line("dry run, nothing was changed; would remove:")
        out.line(render_resources(r for t in targets for r in t.planned))
        out.line()
        out.line("to remove: durafix cleanup --orphans --yes")
        out.document["targets"] = [t.to_json() for t in targets]
        return EXIT_OK if inventory.complete else EXIT_REMAINS

    for index, target in enumerate(targets):
        try:
            now = await statuses.status(target.run_id)
        except TemporalUnreachableError as err:
            for rest in targets[index:]:
                rest.note = f"not attempted: {err}"
            out.warn(f"stopped: {err}")
            break
        if not is_orphan(now):
            target.status = now
            target.skipped = True
            target.note = f"skipped: it is {now} again"
            continue
        target.report = await asyncio.to_thread(clean_run, holders, target.run_id, target.planned, unopened)
    out.document["targets"] = [t.to_json() for t in targets]
    for target in targets:
        _print_outcome(out, target)
    return EXIT_OK if inventory.complete and all(t.ok or t.skipped for t in targets) else EXIT_REMAINS


def _refuse_orphans(out: Printer, reason: str) -> int:
    refusal = f"refusing to look for orphans: {reason}; without Temporal every run would look orphaned"
    out.warn(refusal)
    out.document["refused"] = refusal
    return EXIT_REFUSED


def _report_unavailable(out: Printer, inventory: Inventory) -> None:
    for item in inventory.unavailable:
        out.warn(f"{item.name}: {item.reason} (its resources are not listed and may remain)")


def _print_outcome(out: Printer, outcome: RunOutcome) -> None:
    report = outcome.report
    if report is None:
        out.line(f"{outcome.run_id}: {outcome.note}")
        return
    verdict = "clean" if outcome.ok else "INCOMPLETE"
    out.line(f"{outcome.run_id}: {verdict}; {len(report.removed)} removed, {len(report.remaining)} remaining")
    if report.removed:
        out.line("removed:")
        out.line(render_resources(report.removed, with_status=False))
    if report.remaining:
        out.line("could not be removed:")
        out.line(render_resources(report.remaining))
    for error in report.errors:
        out.line(f"error: {error}")
    if not outcome.ok:
        out.line(f"fix the cause above, then clean the run again: durafix cleanup --run '{outcome.run_id}' --yes")
