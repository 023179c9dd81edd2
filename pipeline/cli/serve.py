"""The commands that run durafix's long-lived processes: ``durafix worker`` (the pollers of one or more task
queues, under :mod:`pipeline.worker.supervisor`) and ``durafix serve`` (the GitHub webhook receiver)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from pipeline import tracing
from pipeline.cli.command import EXIT_FAIL, EXIT_OK, EXIT_USAGE, AddArguments, CliError
from pipeline.config import DurafixConfig

if TYPE_CHECKING:
    from pipeline.steps import TaskQueue
    from pipeline.worker.queue_settings import Overrides
    from pipeline.worker.tmp_root import TmpRoot

_Number = TypeVar("_Number", int, float)


def cmd_worker(args: argparse.Namespace, config: DurafixConfig) -> int:
    """Run a worker on ``--queues`` until interrupted; a configured secret file readable inside the sandbox
    (:mod:`pipeline.worker.sandbox_exposure`), an unknown queue, invalid queue settings or a queue this host cannot
    serve (:mod:`pipeline.worker.capabilities`: no Chromium for ``browser``, ...) is a usage error (exit 2), found
    once, here, before any child is started or Temporal is reached. ``--check`` prints what each queue needs
    and what was found (and each exposed file), and exits 1 if any queue cannot be served or a file is
    exposed. The pollers run in a child process under :mod:`pipeline.worker.supervisor` (exit 1 when its children
    keep dying); ``--no-supervise`` runs them in this process."""
    from pipeline.hosts import host_id
    from pipeline.worker import logs, tmp_root

    try:
        logs.install(host_id(config.host_id))
    except logs.LogFormatError as err:
        raise CliError(str(err), EXIT_USAGE) from err
    # Before anything makes a temporary file (the host's check does): everything goes into this process's root,
    # removed as the command returns; the process ends with os._exit, so no atexit handler would remove it.
    root = tmp_root.start()
    try:
        return _worker(args, config, root)
    finally:
        root.remove()


def _worker(args: argparse.Namespace, config: DurafixConfig, root: TmpRoot) -> int:
    """``durafix worker`` once this process's temporary root is made (see :func:`cmd_worker`)."""
    from pipeline.worker.queue_settings import Overrides, parse_queues
    from pipeline.worker.supervisor import is_child, supervise

    try:
        queues = parse_queues(args.queues)
    except ValueError as err:
        raise CliError(str(err), EXIT_USAGE) from err
    overrides = Overrides(max_concurrent=args.max_concurrent, rate_per_s=args.rate_per_s)
    if not is_child():
        # A supervised child is the same command line again: its parent checked this host already.
        served = _check_host(config, queues, overrides, report=args.check_only)
        if args.check_only:
            return EXIT_OK if served else EXIT_FAIL
    if not (args.no_supervise or is_child()):
        code = asyncio.run(supervise(config, spare=not args.no_spare, tmp_base=root.base))
        return EXIT_OK if code == 0 else EXIT_FAIL
    # Imported only in the process that polls: the supervisor never loads the activities and the workflow.
    from browser.video import VideoUnavailable
    from pipeline.worker.runner import run_worker

    # The process that polls is the one whose spans are exported (pipeline/tracing.py; off without an endpoint).
    tracing.export_traces("durafix-worker")
    try:
        asyncio.run(run_worker(config, queues, standby=is_child(), overrides=overrides))
    except VideoUnavailable as err:
        raise CliError(f"browser_video is on but {err}", EXIT_USAGE) from err
    return EXIT_OK


def _check_host(config: DurafixConfig, queues: Sequence[TaskQueue], overrides: Overrides, *, report: bool) -> bool:
    """Check that no configured secret file is visible inside the sandbox (:mod:`pipeline.worker.sandbox_exposure`),
    validate the queues' settings and probe this host for them. ``report``: print the table (and each exposed
    file) and return whether every queue can be served and nothing is exposed. Else refuse (exit 2) an exposed
    file or what cannot be served for good, warn of what did not answer, and advertise what was found; True."""
    from pipeline.worker import capabilities
    from pipeline.worker.logs import worker_logger
    from pipeline.worker.queue_settings import worker_limits
    from pipeline.worker.sandbox_exposure import exposures

    # Before anything else (and before Temporal is reached): a secret file a sandboxed command could read.
    exposed = [exposure.describe() for exposure in exposures(config)]
    if exposed and not report:
        raise CliError("worker not started: " + "\n".join(exposed), EXIT_USAGE)
    for queue in queues:
        worker_limits(config, queue, overrides)
    checks = capabilities.probe(config, queues, thorough=report)
    if report:
        print(capabilities.table(checks))
        for line in exposed:
            print(f"sandbox: {line}")
        return not exposed and all(check.ok for check in checks)
    why = capabilities.refusal(checks)
    if why is not None:
        raise CliError(f"worker not started: {why}", EXIT_USAGE)
    log = worker_logger()
    for warning in capabilities.warnings(checks):
        log.warning("%s", warning)
    log.info("durafix worker %s", capabilities.advertisement(checks))
    return True


def cmd_serve(args: argparse.Namespace, config: DurafixConfig) -> int:
    """Serve the webhook receiver and the runs page (:mod:`pipeline.cli.runs_page`) until interrupted; without
    a webhook secret it refuses (exit 2)."""
    from pipeline.receiver.webhooks import WebhookReceiver

    if not config.webhook_secret:
        raise CliError("no webhook secret configured (DURAFIX_WEBHOOK_SECRET or `durafix dev up`)", EXIT_USAGE)
    from pipeline.cli.runs_page import RunsPage

    tracing.export_traces("durafix-receiver")
    receiver = WebhookReceiver(
        config, args.host, args.port, pages=lambda served: RunsPage(config, served.with_client).routes()
    )
    if not args.no_reconcile:
        receiver.start_reconciler()
    print(f"durafix webhook receiver on {receiver.url}", file=sys.stderr, flush=True)
    print(f"durafix runs page on {receiver.url.removesuffix('/webhook')}/runs", file=sys.stderr, flush=True)
    try:
        receiver.serve_forever()
    except KeyboardInterrupt:
        print("durafix webhook receiver stopping", file=sys.stderr, flush=True)
    finally:
        receiver.stop()
    return EXIT_OK


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queues", default="all", help="comma list of orchestration,forge,environments,browser,model")
    parser.add_argument(
        "--check",
        dest="check_only",
        action="store_true",
        help="print what each queue needs and what this host has, and exit (1 if any queue cannot be served)",
    )
    parser.add_argument(
        "--max-concurrent",
        type=_positive(int),
        metavar="N",
        help="tasks each queue's worker runs at once in this process (overrides DURAFIX_QUEUE_SETTINGS)",
    )
    parser.add_argument(
        "--rate-per-s",
        type=_positive(float),
        metavar="R",
        help="activities per second each activity queue's worker starts in this process (overrides the setting)",
    )
    parser.add_argument(
        "--no-supervise",
        action="store_true",
        help="poll in this process, with no supervisor to fail a dead worker's attempts at once (debugging)",
    )
    parser.add_argument(
        "--no-spare",
        action="store_true",
        help="keep no warm spare child: a dead child is replaced by a cold start (seconds); saves a worker's "
        "start and memory on a small host",
    )
    parser.set_defaults(fn=cmd_worker)


def _positive(kind: Callable[[str], _Number]) -> Callable[[str], _Number]:
    def parse(text: str) -> _Number:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, not {text!r}")
        return value

    return parse


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8787)
    parser.add_argument(
        "--no-reconcile",
        action="store_true",
        help="do not run the reconciler of lost events in this process (run `durafix reconcile` elsewhere)",
    )
    parser.set_defaults(fn=cmd_serve)


ARGUMENTS: dict[str, AddArguments] = {"worker": _worker_arguments, "serve": _serve_arguments}
