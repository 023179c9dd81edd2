"""The run commands: ``durafix start``, ``status``, ``list``, ``approve``, ``reject``, ``cancel``, ``history``.

Each talks to Temporal through :mod:`pipeline.client`; an unreachable engine is exit 1 with a hint, a run
Temporal does not know is exit 3.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from pipeline import client as runs
from pipeline.cli.command import EXIT_FAIL, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, AddArguments, CliError
from pipeline.cli.durations import parse_duration
from pipeline.cli.output import print_json
from pipeline.cli.run_ids import run_ref
from pipeline.cli.spending import cost_json
from pipeline.cli.status import NotLive, live_or_recorded, recorded_summary, run_pending_activities, state_summary
from pipeline.config import DurafixConfig
from pipeline.pricing import ModelPrice
from pipeline.services import Services
from pipeline.state import Approval, Rejection


async def _with_client(config: DurafixConfig, fn: Callable[[Client], Awaitable[int]]) -> int:
    try:
        client = await runs.connect(config)
    except RuntimeError as err:
        raise CliError(
            f"cannot reach Temporal at {config.temporal_address}: {err}\n"
            "start the local stack with `durafix dev up` or set DURAFIX_TEMPORAL_ADDRESS"
        ) from err
    try:
        return await fn(client)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise CliError(f"not found: {err.message}", EXIT_NOT_FOUND) from err
        raise CliError(f"workflow engine error: {err.message}") from err


def open_report_issue(config: DurafixConfig, repository: str, report: Path, *, label: str) -> int:
    """Open an issue on ``repository`` from a markdown file (first line: the title, leading ``#`` marks and
    spaces stripped; the rest: the body) with ``label``, and return its number; ``ValueError`` when the first
    line holds no title. A plain create: GitHub has no idempotency key for issues, so ``durafix start
    --report`` opens it once and then starts the run for the number it got back."""
    title, _, body = report.read_text().partition("\n")
    title = title.lstrip("# ").strip()
    if not title:
        raise ValueError(f"{report}: the first line must be the report's title")
    return Services(config).forge(repository).create_issue(title, body.strip() + "\n", labels=[label])


def cmd_start(args: argparse.Namespace, config: DurafixConfig) -> int:
    """Start the run for ``--issue`` (or for the issue ``--report`` opens first), or attach to the running
    one; a report whose run already ended is exit 1. With ``--wait``, follow it as :func:`_watch` does."""
    issue = args.issue
    if args.report:
        issue = open_report_issue(config, args.repo, Path(args.report), label=config.trigger_label)
        print(f"opened issue #{issue} from {args.report}", file=sys.stderr)
    if issue is None:
        raise CliError("give --issue N or --report FILE", EXIT_USAGE)

    async def go(client: Client) -> int:
        try:
            started = await runs.start_run(client, config, args.repo, issue, base_branch=args.base)
        except runs.RunAlreadyEnded as ended:
            raise CliError(str(ended)) from ended
        if args.json:
            print_json({"workflow_id": started.workflow_id, "run_id": started.run_id, "attached": started.attached})
        else:
            verb = "attached to running" if started.attached else "started"
            print(f"{verb} {started.workflow_id} (run {started.run_id})")
        if args.wait:
            return await _watch(client, started.workflow_id, args.json, prices=config.model_prices)
        return EXIT_OK

    return asyncio.run(_with_client(config, go))


async def _watch(
    client: Client,
    workflow_id: str,
    as_json: bool,
    until_review: bool = False,
    prices: Mapping[str, ModelPrice] | None = None,
) -> int:
    """Show phase changes until the run ends; progress goes to stderr so stdout stays scriptable."""
    last = ""
    started = time.monotonic()
    while True:
        status, state = await runs.status_and_state(client, workflow_id)
        line = state.phase.value + (f" -> {state.outcome.value}" if state.outcome else "")
        if line != last:
            print(f"[{time.monotonic() - started:6.1f}s] {workflow_id}: {line}", file=sys.stderr, flush=True)
            last = line
        if status != WorkflowExecutionStatus.RUNNING or (until_review and state.pending_approval):
            break
        await asyncio.sleep(1)
    if as_json:
        print_json(state.model_dump(mode="json"))
    else:
        print(state_summary(state, status, prices=prices))
    return EXIT_OK if state.outcome is not None or until_review else EXIT_FAIL


def cmd_status(args: argparse.Namespace, config: DurafixConfig) -> int:
    """The run's state, its Temporal status and the activities it is running (or waiting to retry);
    ``--watch`` follows it until it ends."""
    workflow_id = run_ref(args.run)

    async def go(client: Client) -> int:
        if args.watch:
            return await _watch(client, workflow_id, args.json, prices=config.model_prices)
        description = await runs.handle_for(client, workflow_id).describe()
        state = await live_or_recorded(client, workflow_id, description)
        pending = await run_pending_activities(client, description)
        status = description.status
        if isinstance(state, NotLive):  # no worker answered: what the server holds, said to be not live
            if args.json:
                print_json(
                    {
                        "status": status.name.lower() if status else None,
                        **state.to_json(),
                        "pending_activities": [activity.to_json() for activity in pending],
                    }
                )
            else:
                print(recorded_summary(workflow_id, description, state, pending, datetime.now(UTC)))
            return EXIT_OK
        if args.json:
            print_json(
                {
                    "status": status.name.lower() if status else None,
                    **state.model_dump(mode="json"),
                    "pending_activities": [activity.to_json() for activity in pending],
                    "cost": cost_json(state.budgets, config.model_prices),
                }
            )
        else:
            print(state_summary(state, status, pending, datetime.now(UTC), config.model_prices))
        return EXIT_OK

    return asyncio.run(_with_client(config, go))


def cmd_list(args: argparse.Namespace, config: DurafixConfig) -> int:
    """Every ``repair_bug`` workflow Temporal lists, open or closed."""

    async def go(client: Client) -> int:
        rows = []
        async for wf in client.list_workflows("WorkflowType = 'repair_bug'"):
            rows.append(
                {
                    "workflow_id": wf.id,
                    "run_id": wf.run_id,
                    "status": wf.status.name.lower() if wf.status else None,
                    "started": wf.start_time.isoformat(),
                    "closed": wf.close_time.isoformat() if wf.close_time else None,
                }
            )
        if args.json:
            print_json(rows)
        else:
            for r in rows:
                print(f"{r['workflow_id']:40} {r['status'] or '-':12} {r['started']}")
            if not rows:
                print("no runs")
        return EXIT_OK

    return asyncio.run(_with_client(config, go))


def operator_identity() -> str:
    """Who runs this command, as the machine knows it (``user@host``): what an operator's approval records."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def cmd_approve(args: argparse.Namespace, config: DurafixConfig) -> int:
    """Send an operator's ``approve`` Update; an approval the run's validator refuses is exit 1 with its reason.

    Allowed only when ``operator_approval`` is configured (``DURAFIX_OPERATOR_APPROVAL=1``, on this machine
    and on the forge workers, whose merge checks it again): otherwise a run merges only on an approving review
    on the forge. The approval records the operator (``user@host``), never a name typed on the command line."""
    workflow_id = run_ref(args.run)
    if not config.operator_approval:
        raise CliError(
            "operator approvals are not enabled: approve with a review on the pull request, or set "
            "DURAFIX_OPERATOR_APPROVAL=1 for this command and the workers",
            EXIT_USAGE,
        )

    async def go(client: Client) -> int:
        expires_at = datetime.now(UTC) + args.valid_for if args.valid_for is not None else None
        approval = Approval(
            reviewer=f"operator:{operator_identity()}",
            head_sha=args.sha,
            evidence_digest=args.evidence,
            source="cli",
            expires_at=expires_at,
        )
        try:
            ack = await runs.approve(client, workflow_id, approval)
        except WorkflowUpdateFailedError as err:
            raise CliError(f"approval refused: {err.cause or err}") from err
        print(ack.detail)
        return EXIT_OK

    return asyncio.run(_with_client(config, go))


def cmd_reject(args: argparse.Namespace, config: DurafixConfig) -> int:
    """Signal ``reject``; the run ends ``rejected``."""
    workflow_id = run_ref(args.run)

    async def go(client: Client) -> int:
        await runs.reject(client, workflow_id, Rejection(reviewer=args.reviewer, reason=args.reason or ""))
        print(f"rejection sent to {workflow_id}")
        return EXIT_OK

    return asyncio.run(_with_client(config, go))


def cmd_cancel(args: argparse.Namespace, config: DurafixConfig) -> int:
    """Request cancellation (the run then cleans up after itself); ``--wait`` follows it until it ends."""
    workflow_id = run_ref(args.run)

    async def go(client: Client) -> int:
        await runs.cancel(client, workflow_id)
        print(f"cancellation requested for {workflow_id}; cleanup of its resources follows")
        if args.wait:
            return await _watch(client, workflow_id, False, prices=config.model_prices)
        return EXIT_OK

    return asyncio.run(_with_client(config, go))


def cmd_history(args: argparse.Namespace, config: DurafixConfig) -> int:
    """The run's event history, summarized: activities, failures, and which timeout stopped what."""
    from pipeline.history import summarize_history

    workflow_id = run_ref(args.run)

    async def go(client: Client) -> int:
        history = await runs.handle_for(client, workflow_id).fetch_history()
        rows = summarize_history(history)
        if args.json:
            print_json(rows)
        else:
            for r in rows:
                print(f"{r['time']}  {r['event']:28} {r['detail']}")
        return EXIT_OK

    return asyncio.run(_with_client(config, go))


def _start_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", required=True, help="OWNER/REPO")
    parser.add_argument("--issue", type=int)
    parser.add_argument("--report", help="a markdown file (first line: title) opened as an issue first")
    parser.add_argument("--base", default="main")
    parser.add_argument("--wait", action="store_true", help="follow the run until it ends")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(fn=cmd_start)


def _status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="repair:OWNER/REPO#N or OWNER/REPO#N")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--watch", action="store_true", help="follow until the run ends")
    parser.set_defaults(fn=cmd_status)


def _history_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="repair:OWNER/REPO#N or OWNER/REPO#N")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(fn=cmd_history)


def _list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(fn=cmd_list)


def _approve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run")
    parser.add_argument("--sha", required=True, help="the head SHA you reviewed (the merge enforces it)")
    parser.add_argument("--evidence", help="the evidence bundle digest you reviewed")
    parser.add_argument(
        "--valid-for",
        type=parse_duration,
        metavar="DURATION",
        help="the approval expires after this long (e.g. 90m, 2h, 1d); unmerged by then, the run asks again",
    )
    parser.set_defaults(fn=cmd_approve)


def _reject_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run")
    parser.add_argument("--reason")
    parser.add_argument("--reviewer", default=os.environ.get("USER", "cli"))
    parser.set_defaults(fn=cmd_reject)


def _cancel_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run")
    parser.add_argument("--wait", action="store_true")
    parser.set_defaults(fn=cmd_cancel)


ARGUMENTS: dict[str, AddArguments] = {
    "start": _start_arguments,
    "status": _status_arguments,
    "history": _history_arguments,
    "list": _list_arguments,
    "approve": _approve_arguments,
    "reject": _reject_arguments,
    "cancel": _cancel_arguments,
}
