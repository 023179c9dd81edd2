"""``durafix reconcile``: deliver to runs what lost webhook deliveries would have told them.

- ``--once``: one pass (:func:`pipeline.ops.reconciler.reconcile_once`); prints its report as JSON (``delivered``:
  what went to which run; ``skipped``: what was left alone and why; ``errors``: forge and Temporal failures).
  Exit 0 when nothing failed, 1 when any read or delivery failed (the report names each).
- without it: a pass at start and every ``--interval`` seconds (default ``reconcile_interval_s``, 60) until
  interrupted; each pass's counts are printed as one JSON line. With ``DURAFIX_METRICS_PORT`` it serves
  ``/metrics`` there, with ``durafix_reconciler_lag_seconds`` (as ``durafix serve`` does when it reconciles).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import UTC, datetime

from temporalio.client import Client

from pipeline.cli.command import EXIT_FAIL, EXIT_OK, AddArguments
from pipeline.cli.output import print_json
from pipeline.cli.runs import _with_client
from pipeline.config import DurafixConfig
from pipeline.observability.endpoint import close, serve
from pipeline.ops.reconciler import Reconciler, ReconcileReport, reconcile_once
from pipeline.receiver.metrics import ReceiverMetrics


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Recover lost webhook events: deliver what the forge holds and the runs have not seen."
    parser.add_argument("--once", action="store_true", help="one pass; print its report as JSON")
    parser.add_argument("--interval", type=float, default=None, help="seconds between passes (loop only)")
    parser.set_defaults(fn=cmd_reconcile)


def _summary(report: ReconcileReport) -> str:
    return json.dumps(
        {
            "finished_at": report.finished_at.isoformat() if report.finished_at else None,
            "runs": len(report.runs_seen),
            "delivered": [f"{d.workflow_id}: {d.kind}" for d in report.delivered],
            "skipped": len(report.skipped),
            "errors": [f"{e.workflow_id or e.repository}: {e.what}: {e.error}" for e in report.errors],
        }
    )


def cmd_reconcile(args: argparse.Namespace, config: DurafixConfig) -> int:
    async def once(client: Client) -> int:
        report = await reconcile_once(client, config)
        print_json(report.model_dump(mode="json"))
        return EXIT_FAIL if report.errors else EXIT_OK

    async def loop(client: Client) -> int:
        interval = args.interval if args.interval is not None else config.reconcile_interval_s
        # With DURAFIX_METRICS_PORT, /metrics there carries durafix_reconciler_lag_seconds (the receiver's
        # registry, as `durafix serve` reports it; its webhook counters stay empty here).
        metrics = ReceiverMetrics()
        server = serve(metrics.registry, config.metrics_port) if config.metrics_port is not None else None

        def passed(report: ReconcileReport) -> None:
            metrics.reconciled(report.finished_at or datetime.now(UTC))
            print(_summary(report), flush=True)

        try:
            await Reconciler(client, config, interval, on_pass=passed).run()
        finally:
            close(server)
        return EXIT_OK

    return asyncio.run(_with_client(config, once if args.once else loop))


ARGUMENTS: dict[str, AddArguments] = {"reconcile": _arguments}
